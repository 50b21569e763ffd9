package lockservice

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

func TestWithdraw(t *testing.T) {
	type result struct {
		g   Grant
		err error
	}
	tests := []struct {
		name string
		// grantFirst: the holder releases before the withdrawal, so the
		// wait was granted; otherwise it is still queued.
		grantFirst    bool
		withdrawAs    string
		wantWithdrawn bool
		wantReleased  bool
	}{
		{name: "queued", withdrawAs: "B", wantWithdrawn: true},
		{name: "granted", grantFirst: true, withdrawAs: "B", wantReleased: true},
		{name: "someone else's", withdrawAs: "C"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newLeader(t, Config{})
			held, err := acquire(s, "A", "k", 0)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan result, 1)
			go func() {
				ctx := WithIdentity(context.Background(), "B")
				g, err := s.Acquire(ctx, AcquireParams{Key: "k", Lease: time.Minute, Wait: 10 * time.Second, Timeout: 15 * time.Second, WaitID: "w1"})
				done <- result{g, err}
			}()
			testkit.Eventually(t, 5*time.Second, "B queued", func() bool {
				s.lead.mu.Lock()
				defer s.lead.mu.Unlock()
				return s.lead.waiters == 1
			})
			// The same wait id again while it waits is refused.
			if _, err := s.Acquire(WithIdentity(context.Background(), "B"), AcquireParams{Key: "k", Lease: time.Minute, Wait: time.Second, Timeout: 5 * time.Second, WaitID: "w1"}); !errors.Is(err, core.ErrInvalidArgument) {
				t.Fatalf("duplicate wait id: %v", err)
			}
			var granted Grant
			if tc.grantFirst {
				if err := s.Release(WithIdentity(context.Background(), "A"), "k", held.Token); err != nil {
					t.Fatal(err)
				}
				r := <-done
				if r.err != nil || !r.g.Queued {
					t.Fatalf("B: %+v %v", r.g, r.err)
				}
				granted = r.g
			}
			wd, err := s.Withdraw(WithIdentity(context.Background(), tc.withdrawAs), "k", "w1", "")
			if err != nil {
				t.Fatal(err)
			}
			if wd.Withdrawn != tc.wantWithdrawn || (wd.ReleasedToken != 0) != tc.wantReleased || tc.wantReleased && wd.ReleasedToken != granted.Token {
				t.Fatalf("withdrawal %+v, granted %d", wd, granted.Token)
			}
			var l core.Lock
			var isHeld bool
			f.View(func(m *core.Machine) { l, isHeld = m.Get("k") })
			switch {
			case tc.wantWithdrawn:
				if r := <-done; !errors.Is(r.err, ErrTimeout) {
					t.Fatalf("withdrawn acquire returned %+v %v", r.g, r.err)
				}
				if !isHeld || l.Token != held.Token {
					t.Fatal("the holder's lock changed")
				}
			case tc.wantReleased:
				if isHeld {
					t.Fatalf("released grant still held: %+v", l)
				}
				// A second withdrawal finds nothing.
				if wd, _ := s.Withdraw(WithIdentity(context.Background(), "B"), "k", "w1", ""); wd != (Withdrawal{}) {
					t.Fatalf("second withdrawal: %+v", wd)
				}
			default: // another identity withdrew nothing; B still waits
				s.lead.mu.Lock()
				n := s.lead.waiters
				s.lead.mu.Unlock()
				if n != 1 {
					t.Fatalf("%d waiters after a foreign withdrawal", n)
				}
				if err := s.Release(WithIdentity(context.Background(), "A"), "k", held.Token); err != nil {
					t.Fatal(err)
				}
				if r := <-done; r.err != nil {
					t.Fatal(r.err)
				}
			}
		})
	}
}

func TestRecentGrantsBounded(t *testing.T) {
	var r recentGrants
	t0 := time.Unix(1000, 0)
	for i := 0; i < MaxRecentGrants+10; i++ {
		r.add(waitRef{key: "k", waitID: string(rune('a'+i%26)) + string(rune(i))}, uint64(i+1), t0)
	}
	if len(r.byRef) > MaxRecentGrants || len(r.order) > MaxRecentGrants {
		t.Fatalf("%d/%d entries, bound %d", len(r.byRef), len(r.order), MaxRecentGrants)
	}
	r.add(waitRef{key: "k", waitID: "late"}, 7, t0)
	if _, ok := r.take(waitRef{key: "k", waitID: "late"}, t0.Add(RecentGrantTTL+time.Millisecond)); ok {
		t.Fatal("a grant older than RecentGrantTTL was withdrawable")
	}
}
