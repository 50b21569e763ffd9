package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// TestInProcessSessions checks sessions and lock-delays under leader
// crashes (issue 24 item 4), apart from the porcupine model (whose lock
// model has leases, not sessions). Holders keep a lock in a session (TTL
// 2 s, lock-delay 500 ms) and never release it; one of them, now and
// then, "dies" (its connection closes, so its keepalives stop) and comes
// back with a new session; contenders try the same keys and release at
// once what they get; the leader is stopped and restarted meanwhile.
// Everything runs in one process, on one monotonic clock, without clock
// jumps, and the checks are sound without knowing when the server acted:
//
//   - kept alive, never lost: a keepalive answered not_found (the session
//     ended on the server) before the holder's local deadline (the send
//     of its last acknowledged keepalive plus the TTL) is a violation;
//   - the locks of an ended session, and the lock-delay, never shortened:
//     the holder never releases, so its lock ends only when its session
//     ends on the server, at or after every deadline it promised (D), and
//     the key is then delayed by the lock-delay; any grant of the key (a
//     contender's, or the same holder's next session's, which waits for
//     it in the queue) sent after the holder's grant reply and answered
//     before D + lock-delay is a violation (two holders, or a delay cut
//     short, across leader changes too).
func TestInProcessSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process cluster with leader crashes skipped in -short mode")
	}
	const (
		ttl        = 2 * time.Second
		lockDelay  = 500 * time.Millisecond
		holders    = 3
		contenders = 3
		duration   = 12 * time.Second
	)
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	urls := make([]string, c.Size())
	for i := range urls {
		urls[i] = c.ClientURL(i)
	}
	connect := func() *sdk.Client {
		cl, err := sdk.Connect(strings.Join(urls, ","), sdk.WithRequestTimeout(time.Second), sdk.WithRetryBackoff(5*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	type hold struct {
		key      string
		got      time.Time // the holder's grant reply
		s        *sdk.Session
		deadline time.Time // s.Deadline() once the session ended locally (it never moves back)
	}
	type grant struct {
		key        string
		sent, recv time.Time
		token      uint64
	}
	var (
		mu         sync.Mutex
		holds      []*hold
		grants     []grant
		violations []string
		lostSeen   int
	)
	violate := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithTimeout(t.Context(), duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < holders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("sess/%d", i)
			for cycle := 0; ctx.Err() == nil && cycle < 100; cycle++ {
				cl := connect()
				s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(ttl), sdk.WithSessionLockDelay(lockDelay))
				if err != nil {
					_ = cl.Close()
					continue // no leader now, or the run ended
				}
				sent := time.Now()
				l, err := s.Acquire(ctx, key, sdk.WithWait(5*time.Second))
				if err != nil {
					_, _ = s.Close(context.WithoutCancel(ctx))
					_ = cl.Close()
					continue
				}
				h := &hold{key: key, got: time.Now(), s: s}
				mu.Lock()
				holds = append(holds, h)
				// Checked against the key's earlier sessions like a contender's.
				grants = append(grants, grant{key: key, sent: sent, recv: h.got, token: l.Token})
				mu.Unlock()
				die := time.After(3 * time.Second) // holder 0 dies now and then
				if i != 0 {
					die = nil
				}
				select {
				case <-s.Done():
				case <-die:
					_ = cl.Close() // keepalives stop; the server expires the session
					<-s.Done()
				case <-ctx.Done():
				}
				if err := s.Err(); err != nil && strings.Contains(err.Error(), "keepalive refused") && time.Now().Before(s.Deadline()) {
					violate("session %s of %s ended on the server (%v) %v before its local deadline", s.ID, key, err, time.Until(s.Deadline()))
				}
				mu.Lock()
				h.deadline = s.Deadline()
				if s.Err() != nil {
					lostSeen++
				}
				mu.Unlock()
				_ = cl.Close()
			}
		}()
	}
	for i := 0; i < contenders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := connect()
			defer cl.Close()
			for n := 0; ctx.Err() == nil && n < 10000; n++ {
				key := fmt.Sprintf("sess/%d", n%holders)
				sent := time.Now()
				l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Second))
				if err == nil {
					mu.Lock()
					grants = append(grants, grant{key: key, sent: sent, recv: time.Now(), token: l.Token})
					mu.Unlock()
					_ = l.Release(context.WithoutCancel(ctx))
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond): // the contenders' pace, not a wait for a condition
				}
			}
		}()
	}
	crashes := 0
	for ctx.Err() == nil && crashes < 4 {
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second): // the time between faults
		}
		if ctx.Err() != nil {
			break
		}
		lead = c.Leader(10 * time.Second)
		if err := c.Stop(lead); err != nil {
			t.Fatal(err)
		}
		crashes++
		c.Leader(10 * time.Second)
		if err := c.Start(lead); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	now := time.Now()
	mu.Lock()
	defer mu.Unlock()
	for _, h := range holds {
		if h.deadline.IsZero() {
			h.deadline = h.s.Deadline()
		}
		until := h.deadline.Add(lockDelay)
		if h.s.Err() == nil {
			until = now // still kept alive at the end: held throughout
		}
		for _, g := range grants {
			if g.key == h.key && g.sent.After(h.got) && g.recv.Before(until) {
				violations = append(violations, fmt.Sprintf("%s granted (token %d, answered %v) while session %s held it or its lock-delay ran (until %v)",
					g.key, g.token, g.recv.Sub(h.got), h.s.ID, until.Sub(h.got)))
			}
		}
	}
	t.Logf("%d leader crashes, %d holder sessions (%d ended), %d grants checked", crashes, len(holds), lostSeen, len(grants))
	for _, v := range violations {
		t.Error(v)
	}
	for _, h := range holds {
		if h.s.Err() == nil {
			_, _ = h.s.Close(context.Background())
		}
	}
	if len(grants) <= len(holds) || lostSeen == 0 {
		t.Errorf("the run exercised too little: %d grants (%d of them holders'), %d ended sessions", len(grants), len(holds), lostSeen)
	}
}
