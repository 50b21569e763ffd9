package lockservice

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// TestRearmInStepsWhileApplying: a new leader of a table larger than
// RearmChunk re-arms it off the raft loop in steps while the loop goes on
// applying grants, releases, expiries and renewals (each changing the
// machine first, then telling OnApplied, as the loop does). When the
// service says it is ready, its timers are exactly the held locks, with
// their tokens and identities, and the per-identity counts match.
func TestRearmInStepsWhileApplying(t *testing.T) {
	for round := 0; round < 5; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			s := New(Config{Logger: testkit.QuietLogger(), RearmChunk: 7})
			f := &fakeNode{m: core.NewMachine(), obs: s}
			f.m.Apply(core.SetClusterVersion(2))
			idents := []string{"", "A", "B"}
			for i := 0; i < 3000; i++ {
				f.m.Apply(grantAs(fmt.Sprintf("k%04d", i), idents[i%3]))
			}
			s.Attach(f)
			defer s.Close()

			// The raft loop applies a few commands between any two steps
			// of the re-arm: each changes the machine first, then tells
			// OnApplied, as the loop does.
			rng := rand.New(rand.NewPCG(uint64(round), 9))
			apply := func() {
				key := fmt.Sprintf("k%04d", rng.IntN(3500))
				f.mu.Lock()
				held, ok := f.m.Get(key)
				var cmd core.Command
				switch {
				case !ok:
					cmd = grantAs(key, idents[rng.IntN(3)])
				case rng.IntN(3) == 0:
					cmd = core.Renew(key, held.Token, 90_000)
				case rng.IntN(2) == 0:
					cmd = core.Expire(key, held.Token)
				default:
					cmd = core.Release(key, held.Token)
				}
				f.index++
				a := raftstore.Applied{Index: f.index, Term: 2, Command: cmd, Result: f.m.Apply(cmd)}
				if l, ok := f.m.Get(key); ok {
					a.LeaseMS = l.LeaseMS
				}
				f.mu.Unlock()
				s.OnApplied(a)
			}
			f.beforeView = func() {
				for i := 0; i < 4; i++ {
					apply()
				}
			}
			s.OnLeaderReady(2)
			testkit.Eventually(t, 30*time.Second, "the leader ready", s.IsLeader)
			f.beforeView = nil
			f.mu.Lock()
			defer f.mu.Unlock()
			s.lead.mu.Lock()
			defer s.lead.mu.Unlock()
			h := s.lead.leases
			h.check(t)
			held := map[string]int{}
			f.m.ForEachLock(func(l core.Lock) {
				held[l.Identity]++
				if it, ok := h.get(l.Key); !ok || it.token != l.Token {
					t.Fatalf("lock %+v has timer %+v (%v)", l, it, ok)
				}
			})
			if h.Len() != f.m.Len() {
				t.Fatalf("%d timers for %d locks", h.Len(), f.m.Len())
			}
			for _, id := range idents {
				if h.held(id) != held[id] {
					t.Fatalf("identity %q: %d timers, %d locks", id, h.held(id), held[id])
				}
			}
		})
	}
}

// TestRearmGivesUpWhenLeadershipEnds: a re-arm whose leadership ended
// never makes the service ready, and arms nothing more.
func TestRearmGivesUpWhenLeadershipEnds(t *testing.T) {
	s := New(Config{Logger: testkit.QuietLogger(), RearmChunk: 1})
	f := &fakeNode{m: core.NewMachine(), obs: s}
	for i := 0; i < 2000; i++ {
		f.m.Apply(core.Grant(fmt.Sprintf("k%04d", i), "o", 60_000, 0))
	}
	s.Attach(f)
	defer s.Close()
	s.OnLeaderReady(2) // 2000 steps of one lock: still running below
	s.OnLeadershipLost()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if s.IsLeader() {
			t.Fatal("a re-arm of an ended leadership made the service ready")
		}
		s.lead.mu.Lock()
		n := s.lead.leases.Len()
		s.lead.mu.Unlock()
		if n > 0 {
			t.Fatalf("%d timers armed after the leadership ended", n)
		}
		time.Sleep(10 * time.Millisecond) // watching for a state that must not come
	}
}

// grantAs is a Grant of key for identity.
func grantAs(key, identity string) core.Command {
	c := core.Grant(key, "o", 60_000, 0)
	c.Identity = identity
	return c
}
