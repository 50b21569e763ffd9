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
