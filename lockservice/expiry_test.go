package lockservice

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// A mass expiry proposes every Expire with a bounded number of goroutines
// (the worker pool), never one per lease.
func TestMassExpiryBoundedGoroutines(t *testing.T) {
	const locks = 5000
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	s, f := newLeader(t, Config{Now: now, ExpireWorkers: 8})
	for i := 0; i < locks; i++ {
		if _, err := s.Acquire(context.Background(), AcquireParams{Key: fmt.Sprintf("k%05d", i), Lease: time.Minute, Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := int64(runtime.NumGoroutine()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	offset.Store(int64(2 * time.Minute)) // every lease runs out at once
	s.signalTimersChanged()
	testkit.Eventually(t, 30*time.Second, "every lease expired", func() bool {
		var n int
		f.View(func(m *core.Machine) { n = m.Len() })
		return n == 0
	})
	close(stop)
	<-sampled
	// base already counts the 8 workers; the sampler is one more. The
	// old code started one goroutine per due lease (thousands here).
	if extra := peak.Load() - int64(base); extra > 8 {
		t.Fatalf("%d leases expiring at once took %d extra goroutines; the pool has 8 workers", locks, extra)
	}
	t.Logf("%d leases expired with at most %d goroutines beyond the %d before", locks, peak.Load()-int64(base), base)
}

func TestLeaseHeapDueLimit(t *testing.T) {
	h := newLeaseTable()
	t0 := time.Unix(1000, 0)
	for i := 0; i < 5; i++ {
		h.arm(fmt.Sprint(i), uint64(i+1), "", time.Second, t0)
	}
	if due := h.due(t0.Add(time.Hour), time.Second, 2); len(due) != 2 {
		t.Fatalf("due with limit 2 gave %d", len(due))
	}
	// The two taken were pushed back past now by the retry interval.
	if due := h.due(t0.Add(time.Hour), time.Second, 10); len(due) != 3 {
		t.Fatalf("due gave %d, want the 3 not yet taken", len(due))
	}
}
