package sdk_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// TestSessionScaleFigure is opt-in (TICKETD_SESSION_SCALE=1): S sessions
// holding L locks each, kept alive for D, next to the same S*L locks held
// with per-lock auto-renew, on a three-node in-process cluster; it reports
// the leader's raft entries per second and the test process's CPU per
// second (every node and client is in it) for each. Sizes:
// TICKETD_SESSION_SCALE_SESSIONS (default 1000), _LOCKS (per session,
// default 10), _SECONDS (default 30). Issue 24 item 5 asks for 10,000
// sessions and 100,000 locks for 5 minutes on three machines; this is the
// same measurement at a size a shared test machine runs.
func TestSessionScaleFigure(t *testing.T) {
	if os.Getenv("TICKETD_SESSION_SCALE") == "" {
		t.Skip("opt-in: TICKETD_SESSION_SCALE=1")
	}
	num := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv("TICKETD_SESSION_SCALE_" + name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	sessions, perSession, seconds := num("SESSIONS", 1000), num("LOCKS", 10), num("SECONDS", 30)
	c, lead := cluster(t, 3)
	cl := client(t, c, lead)
	ctx := t.Context()
	const ttl = 10 * time.Second
	measure := func(name string) {
		d := c.Node(lead)
		startIdx, startCPU, start := d.Node().AppliedIndex(), processCPU(t), time.Now()
		time.Sleep(time.Duration(seconds) * time.Second) // the measured window: nothing to wait for
		el := time.Since(start).Seconds()
		t.Logf("%s: %.1f raft entries/s, %.3f CPU seconds per second (whole process: 3 nodes + clients), over %.0fs",
			name, float64(d.Node().AppliedIndex()-startIdx)/el, (processCPU(t)-startCPU).Seconds()/el, el)
	}

	var ss []*sdk.Session
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := 0; i < sessions; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(ttl))
			if err != nil {
				t.Error(err)
				return
			}
			for j := 0; j < perSession; j++ {
				if _, err := s.Acquire(ctx, fmt.Sprintf("s/%d/%d", i, j)); err != nil {
					t.Error(err)
					return
				}
			}
			mu.Lock()
			ss = append(ss, s)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	measure(fmt.Sprintf("%d sessions x %d locks (TTL %v)", sessions, perSession, ttl))
	for _, s := range ss {
		select {
		case <-s.Done():
			t.Fatalf("session %s ended: %v", s.ID, s.Err())
		default:
		}
		if _, err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	var locks []*sdk.Lock
	for i := 0; i < sessions*perSession; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			l, err := cl.Acquire(ctx, fmt.Sprintf("l/%d", i), sdk.WithLease(ttl), sdk.WithAutoRenew())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			locks = append(locks, l)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	measure(fmt.Sprintf("%d locks with auto-renew (lease %v)", len(locks), ttl))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, l := range locks {
		_ = l.Release(rctx)
	}
}

// processCPU is the process's user + system CPU time so far.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
