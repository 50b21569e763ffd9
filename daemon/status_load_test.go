package daemon_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// fillLocks takes n locks (24h leases) on d through its lock service,
// 64 at a time.
func fillLocks(t testing.TB, d *daemon.Daemon, n int) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				_, err := d.Locks().Acquire(context.Background(), lockservice.AcquireParams{
					Key: fmt.Sprintf("fill/%07d", i), Owner: "filler", Lease: 24 * time.Hour, Timeout: time.Minute})
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d fill acquires failed", failed.Load(), n)
	}
}

// acquireP99 runs cycles acquire+release cycles through the SDK and
// returns the 99th percentile of the acquires.
func acquireP99(t testing.TB, cl *sdk.Client, cycles int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lat := make([]time.Duration, 0, cycles)
	for i := 0; i < cycles; i++ {
		start := time.Now()
		l, err := cl.Acquire(ctx, fmt.Sprintf("probe/%d", i%16), sdk.WithLease(10*time.Second))
		if err != nil {
			t.Fatalf("probe acquire: %v", err)
		}
		lat = append(lat, time.Since(start))
		if err := l.Release(ctx); err != nil {
			t.Fatalf("probe release: %v", err)
		}
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// statusUnderLoad is the measurement: acquire p99 on a table of
// locks, quiet and then while 16 callers ask for status as fast as they
// can (each waits 5ms between replies). Status reads a summary the raft
// loop publishes once per applied index (O(1), no lock the apply path takes), so the two must be close.
func statusUnderLoad(t *testing.T, locks, cycles int) (quiet, loaded time.Duration, statuses int64) {
	d := startNodeWith(t, t.TempDir(), daemon.Options{}, func(c *daemon.Config) {})
	fillLocks(t, d, locks)
	_, cl := connect(t, d)
	acquireP99(t, cl, cycles/10) // warm up
	quiet = acquireP99(t, cl, cycles)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var n atomic.Int64
	for c := 0; c < 16; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc := testkit.Connect(t, d.ClientURL())
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := nc.Request(protocol.SubjectStatus, []byte("{}"), 5*time.Second); err == nil {
					n.Add(1)
				}
				// Callers that poll, not a CPU burner: on a 2-core box 16
				// tight loops of any request would take the CPU from the
				// node whatever status costs. 16 x 200/s is far above what
				// monitoring asks, and each one cost 147ms of a locked
				// table walk at 30k locks before.
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
	}
	loaded = acquireP99(t, cl, cycles)
	close(stop)
	wg.Wait()
	return quiet, loaded, n.Load()
}

// TestStatusDoesNotSlowAcquire100k: 16 status callers on a 100k-lock
// table leave the acquire p99 within 2x of the quiet one. Opt-in
// (TICKETD_BIG=1, about a minute): the figure is quoted in the issue note.
func TestStatusDoesNotSlowAcquire100k(t *testing.T) {
	if os.Getenv("TICKETD_BIG") == "" {
		t.Skip("set TICKETD_BIG=1 to load 100k locks and measure")
	}
	quiet, loaded, n := statusUnderLoad(t, 100_000, 2000)
	t.Logf("100k locks: acquire p99 %v quiet, %v with 16 status callers (%d status replies meanwhile)", quiet, loaded, n)
	if loaded > 2*quiet {
		t.Fatalf("acquire p99 %v under status load is above 2x the quiet %v", loaded, quiet)
	}
}

// TestStatusDoesNotSlowAcquire is the same on 10k locks. It is a timing
// comparison, so it is opt-in too (TICKETD_BIG=1): a shared CI machine can
// move a p99 by more than 2x for reasons of its own.
func TestStatusDoesNotSlowAcquire(t *testing.T) {
	if os.Getenv("TICKETD_BIG") == "" {
		t.Skip("set TICKETD_BIG=1 to measure")
	}
	quiet, loaded, n := statusUnderLoad(t, 10_000, 500)
	t.Logf("10k locks: acquire p99 %v quiet, %v with 16 status callers (%d status replies meanwhile)", quiet, loaded, n)
	if loaded > 2*quiet {
		t.Fatalf("acquire p99 %v under status load is above 2x the quiet %v", loaded, quiet)
	}
}
