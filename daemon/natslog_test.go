package daemon_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// TestNATSPortInUseSaysWhy: an embedded NATS server that cannot listen
// fails the start at once with the server's own reason, not after the
// whole start timeout with none.
func TestNATSPortInUseSaysWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = ln.Addr().String()
	cfg.TickMS = testkit.TickMS
	start := time.Now()
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err == nil {
		d.Close()
		t.Fatal("started on a port in use")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error does not say why: %v", err)
	}
	if took := time.Since(start); took > daemon.StartTimeoutDefault/2 {
		t.Fatalf("took %v to give up", took)
	}
}
