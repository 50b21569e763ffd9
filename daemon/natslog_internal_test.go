package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/internal/loglimit"
)

// TestNATSLogBounded: a burst of server errors (every failed login of a
// client hammering the port) puts at most natsLogBurst lines a second in
// the node's log, while a fatal error is always kept for the start error.
func TestNATSLogBounded(t *testing.T) {
	var buf bytes.Buffer
	l := &natsLogger{log: slog.New(slog.NewTextHandler(&buf, nil)), limit: loglimit.Limiter{Burst: natsLogBurst}}
	for i := 0; i < 200; i++ {
		l.Errorf("%s - authentication error", "cid:1")
	}
	if n := strings.Count(buf.String(), "authentication error"); n == 0 || n > natsLogBurst {
		t.Fatalf("%d lines for 200 errors in a burst, want 1..%d", n, natsLogBurst)
	}
	l.Fatalf("Error listening on port: %s", "127.0.0.1:1")
	if !strings.Contains(l.fatal(), "Error listening on port") {
		t.Fatalf("fatal not kept: %q", l.fatal())
	}
}

// TestNATSRouteRetriesAreQuietWarnings: the embedded server's reports of
// a failed route, gateway or leaf node connection attempt (every second
// per connection while another server is down, and at every cluster start)
// are WARN, at most one per natsRetryLogEvery, and use none of the budget
// of other errors.
func TestNATSRouteRetriesAreQuietWarnings(t *testing.T) {
	var buf bytes.Buffer
	l := &natsLogger{log: slog.New(slog.NewTextHandler(&buf, nil)), limit: loglimit.Limiter{Burst: natsLogBurst},
		retries: loglimit.Limiter{Burst: 1, Per: natsRetryLogEvery}}
	for i := 0; i < 100; i++ {
		l.Errorf("Error trying to connect to route (attempt %v): %v", i+1, "dial tcp 127.0.0.1:1: connect: connection refused")
		l.Errorf("Error trying to connect as leafnode to remote server %q (attempt %v): %v", "x", i+1, "refused")
		l.Errorf("Error connecting to %s gateway %q (%s) at %s (attempt %v): %v", "explicit", "B", "id", "127.0.0.1:2", i+1, "refused")
	}
	out := buf.String()
	if strings.Contains(out, "level=ERROR") {
		t.Fatalf("a connection retry logged at ERROR:\n%s", out)
	}
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "level=WARN") {
		t.Fatalf("%d lines for 300 retries in a burst, want one WARN:\n%s", n, out)
	}
	// A route's write failing as its node stops is a WARN too.
	l.Errorf("127.0.0.1:6222 - rid:12 - Error flushing: %v", "writev: connection reset by peer")
	if out := buf.String(); strings.Contains(out, "level=ERROR") || !strings.Contains(out, "Error flushing") {
		t.Fatalf("a route's write error not logged at WARN:\n%s", out)
	}
	l.Errorf("%s - authentication error", "cid:1")
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatal("an error that is not a retry was not logged at ERROR")
	}
}
