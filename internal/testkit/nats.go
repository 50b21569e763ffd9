package testkit

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsReadyTimeout bounds how long NATSServer waits for the server to
// accept connections.
const natsReadyTimeout = 10 * time.Second

// NATSServer starts an embedded nats-server on a random 127.0.0.1 port,
// with no logging and no signal handlers, and shuts it down at cleanup.
// Each tweak may change the options first (a fixed Port to restart a
// server where its clients expect it, JetStream with a StoreDir).
func NATSServer(t testing.TB, tweaks ...func(*server.Options)) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	for _, f := range tweaks {
		f(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(natsReadyTimeout) {
		s.Shutdown()
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects to url and closes the connection at cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// NATSServerFromConfig starts an embedded nats-server from the text of a
// nats-server configuration file (listen, cluster routes, mappings,
// accounts...), with no logging and no signal handlers, and shuts it down
// at cleanup: for tests of what the configuration itself does, such as a
// subject mapping.
func NATSServerFromConfig(t testing.TB, conf string) *server.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats config: %v", err)
	}
	return NATSServer(t, func(opts *server.Options) {
		*opts = *o
		opts.NoLog, opts.NoSigs = true, true
	})
}
