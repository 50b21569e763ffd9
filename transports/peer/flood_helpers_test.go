package peer

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// FloodConnect is floodConnect for the package's external tests.
var FloodConnect = floodConnect

// floodConnect keeps perSource connections from each of sources loopback
// addresses (127.0.2.1, 127.0.2.2, ...; Linux routes all of 127.0.0.0/8
// to lo) to every address addrs returns, until ctx ends, as the issue's
// attacker did from other machines: each connection sends nothing, waits
// until the listener closes it and dials again. The test is skipped where
// such an address cannot be bound; its cleanup waits for every attacker.
func floodConnect(ctx context.Context, t testing.TB, addrs []func() string, sources, perSource int) {
	t.Helper()
	probe := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, 1)}}
	c, err := probe.Dial("tcp", addrs[0]())
	if err != nil {
		t.Skipf("cannot dial from 127.0.2.1 (%v): this system routes only 127.0.0.1", err)
	}
	c.Close()
	var wg sync.WaitGroup
	for _, addr := range addrs {
		for s := range sources {
			ip := net.IPv4(127, 0, 2, byte(1+s))
			for range perSource {
				wg.Add(1)
				go func() {
					defer wg.Done()
					holdOpen(ctx, ip, addr)
				}()
			}
		}
	}
	t.Cleanup(wg.Wait)
}

// holdOpen is one attacker connection, dialled again each time it is
// closed. A dial that fails, or a connection closed at once, waits
// floodPace before the next, so the loop is bounded in rate as well as
// in time.
func holdOpen(ctx context.Context, ip net.IP, addr func() string) {
	const floodPace = 10 * time.Millisecond
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
	buf := make([]byte, 64)
	for ctx.Err() == nil {
		began := time.Now()
		if c, err := d.DialContext(ctx, "tcp", addr()); err == nil {
			stop := context.AfterFunc(ctx, func() { c.Close() })
			for {
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			stop()
			c.Close()
		}
		if time.Since(began) < floodPace {
			select {
			case <-ctx.Done():
			case <-time.After(floodPace):
			}
		}
	}
}
