package daemon_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// pprof is served only on a loopback metrics listener: profiles expose
// the process's memory and stacks. Anything else is refused at start.
func TestPprofNeedsLoopback(t *testing.T) {
	for _, tc := range []struct {
		listen string
		ok     bool
	}{
		{"", false},
		{":9090", false},
		{"0.0.0.0:9090", false},
		{"[::]:9090", false},
		{"10.1.2.3:9090", false},
		{"example.com:9090", false},
		{"127.0.0.1:9090", true},
		{"[::1]:9090", true},
		{"localhost:9090", true},
	} {
		cfg := daemon.Defaults()
		cfg.Pprof, cfg.MetricsListen = true, tc.listen
		err := cfg.Validate()
		if tc.ok && err != nil {
			t.Errorf("pprof on %q refused: %v", tc.listen, err)
		}
		if !tc.ok && (!errors.Is(err, daemon.ErrConfig) || !strings.Contains(err.Error(), "loopback")) {
			t.Errorf("pprof on %q: %v, want a refusal that asks for loopback", tc.listen, err)
		}
	}
}

// Nothing under /debug/ shows the command line: /debug/pprof/cmdline is
// not served, while the profiles are.
func TestPprofServesNoCommandLine(t *testing.T) {
	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.MetricsListen = testkit.FreeAddr(t)
	cfg.Pprof = true
	cfg.TickMS = testkit.TickMS
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) (int, string) {
		resp, err := client.Get("http://" + cfg.MetricsListen + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/cmdline"); code != http.StatusNotFound || strings.Contains(body, os.Args[0]) {
		t.Errorf("/debug/pprof/cmdline: %d %q, want 404 without the command line", code, body)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap?debug=1"} {
		code, body := get(path)
		if code != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, code)
		}
		if strings.Contains(body, os.Args[0]) {
			t.Errorf("%s shows the command line (%s)", path, os.Args[0])
		}
	}
}

// A password inside --nats-url is refused at start, pointing at the
// settings that keep it off the command line.
func TestNATSURLPasswordRefused(t *testing.T) {
	cfg := daemon.Defaults()
	cfg.NATSURL = "nats://ticketd:hunter2@127.0.0.1:4222"
	err := cfg.Validate()
	if !errors.Is(err, daemon.ErrConfig) || !strings.Contains(err.Error(), "TICKETD_NATS_PASSWORD") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Validate = %v, want a refusal naming TICKETD_NATS_PASSWORD and not the password", err)
	}
	cfg.NATSURL, cfg.NATSUser, cfg.NATSPassword = "nats://127.0.0.1:4222", "ticketd", "hunter2"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("user and password as settings: %v", err)
	}
}
