package daemon_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// The metrics listener (Prometheus's scrape target, usually reachable
// from a network) kept every keep-alive connection for ever: no idle
// timeout, no bound. Anyone who reaches it could hold as many
// connections (file descriptors, goroutines, buffers) as they can open.
// Connections are bounded now, in all and per source, the oldest idle
// one evicted, and a scrape still gets through.
func TestMetricsConnectionsBounded(t *testing.T) {
	const sources, each = 8, daemon.MaxMetricsConnsPerSource
	addr := testkit.FreeAddr(t)
	startNodeWith(t, filepath.Join(t.TempDir(), "data"), daemon.Options{}, func(cfg *daemon.Config) { cfg.MetricsListen = addr })
	var conns []net.Conn
	for s := range sources {
		ip := net.IPv4(127, 0, 4, byte(1+s))
		for range each {
			dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 3 * time.Second}
			c, err := dl.Dial("tcp", addr)
			if err != nil {
				t.Skipf("cannot dial from %s: %v", ip, err)
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				// Evicted before it was answered: the bound at work.
				continue
			}
			resp.Body.Close()
			conns = append(conns, c)
		}
	}
	// A scrape gets through the idle crowd.
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	resp.Body.Close()
	open := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		}
	}
	if open > daemon.MaxMetricsConns {
		t.Fatalf("%d of %d idle connections still held, want at most %d", open, sources*each, daemon.MaxMetricsConns)
	}
	t.Logf("%d of %d idle connections held", open, sources*each)
}
