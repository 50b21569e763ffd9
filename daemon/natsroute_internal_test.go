package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestEmbeddedNATSRoutePings: the embedded server pings its routes every
// RoutePingInterval (so a paused leader's queue subscription is dropped
// within seconds), unless the nats-server configuration file says
// otherwise.
func TestEmbeddedNATSRoutePings(t *testing.T) {
	conf := func(body string) string {
		p := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name     string
		cfg      Config
		interval time.Duration
		maxOut   int
	}{
		{"flags", Config{ID: 1, NATSListen: "127.0.0.1:0", NATSClusterListen: "127.0.0.1:0", NATSRoutes: "127.0.0.1:1"}, RoutePingInterval, RouteMaxPingsOut},
		{"file without ping settings", Config{ID: 1, NATSConfig: conf("listen: 127.0.0.1:-1\ncluster { listen: 127.0.0.1:-1 }\n")}, RoutePingInterval, RouteMaxPingsOut},
		{"file with ping settings", Config{ID: 1, NATSConfig: conf("listen: 127.0.0.1:-1\ncluster { listen: 127.0.0.1:-1, ping_interval: \"5s\", ping_max: 4 }\n")}, 5 * time.Second, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := (&Daemon{cfg: tc.cfg}).embeddedNATSOptions()
			if err != nil {
				t.Fatal(err)
			}
			if o.Cluster.PingInterval != tc.interval || o.Cluster.MaxPingsOut != tc.maxOut {
				t.Fatalf("route pings every %v, %d outstanding; want %v, %d", o.Cluster.PingInterval, o.Cluster.MaxPingsOut, tc.interval, tc.maxOut)
			}
		})
	}
}
