package lockservice

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// newLeaderV6 is newLeader at cluster version 6 (Settle).
func newLeaderV6(t *testing.T, cfg Config) (*Service, *fakeNode) {
	t.Helper()
	s, f := newLeader(t, cfg)
	for v := uint64(3); v <= 6; v++ {
		if r := f.m.Apply(core.SetClusterVersion(v)); r.Kind != core.ResultControlApplied {
			t.Fatalf("SetClusterVersion(%d) = %v", v, r)
		}
	}
	return s, f
}

// wantSettledRefusal checks that err is the refusal of a late attempt of
// a settled request: grant_ended with token 0.
func wantSettledRefusal(t *testing.T, err error) {
	t.Helper()
	var ge *GrantEndedError
	if !errors.As(err, &ge) || ge.Token != 0 || !errors.Is(err, ErrGrantEnded) {
		t.Fatalf("late attempt: %v, want grant_ended with token 0", err)
	}
}

// At cluster version 6 a withdrawal by request id is one Settle: held,
// released; ended, reported; another key, unknown; never granted, a
// tombstone, after which a late attempt of the request is refused
// (grant_ended, token 0) and the key stays free.
func TestSettleByRequestID(t *testing.T) {
	ctxA := WithIdentity(context.Background(), "A")
	tests := []struct {
		name  string
		grant bool
		// then runs after the grant (if any) and says the key to
		// withdraw and the Withdrawal wanted.
		then func(t *testing.T, s *Service, g Grant) (string, Withdrawal)
	}{
		{"held: released", true, func(t *testing.T, s *Service, g Grant) (string, Withdrawal) {
			return "k", Withdrawal{ReleasedToken: g.Token}
		}},
		{"ended: reported", true, func(t *testing.T, s *Service, g Grant) (string, Withdrawal) {
			if err := s.Release(ctxA, "k", g.Token); err != nil {
				t.Fatal(err)
			}
			return "k", Withdrawal{EndedToken: g.Token}
		}},
		{"another key: unknown", true, func(t *testing.T, s *Service, g Grant) (string, Withdrawal) {
			return "k2", Withdrawal{}
		}},
		{"never granted: not granted, and never later", false, func(t *testing.T, s *Service, g Grant) (string, Withdrawal) {
			return "k", Withdrawal{NotGranted: true}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newLeaderV6(t, Config{})
			var g Grant
			if tc.grant {
				var err error
				if g, err = acquireReq(context.Background(), s, "A", "k", "r1", 0); err != nil {
					t.Fatal(err)
				}
			}
			key, want := tc.then(t, s, g)
			s.OnLeaderReady(2) // a new term: the leader-local wait memory is gone
			before := f.proposals.Load()
			got, err := s.Withdraw(ctxA, key, "w-unknown", "r1")
			if err != nil || got != want {
				t.Fatalf("withdraw: %+v %v, want %+v", got, err, want)
			}
			if n := f.proposals.Load() - before; n != 1 {
				t.Fatalf("%d proposals, want one Settle", n)
			}
			if l, _ := s.currentLock("k"); want.ReleasedToken != 0 && l.Token != 0 {
				t.Fatalf("the request's grant is still held: %+v", l)
			}
			if want.NotGranted {
				_, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
				wantSettledRefusal(t, err)
				if l, _ := s.currentLock("k"); l.Token != 0 {
					t.Fatalf("a settled request was granted: %+v", l)
				}
				// A second withdrawal finds the tombstone: not granted.
				if got, err := s.Withdraw(ctxA, "k", "", "r1"); err != nil || got != (Withdrawal{NotGranted: true}) {
					t.Fatalf("second withdraw: %+v %v", got, err)
				}
			}
		})
	}
}

// An attempt of a settled request still queued on this leader is refused
// when its turn comes (its Grant applies against the tombstone): it is
// answered grant_ended, the key is free, nothing is left registered.
func TestSettleRefusesAnAttemptQueuedHere(t *testing.T) {
	s, _ := newLeaderV6(t, Config{})
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "queued", func() bool {
		_, busy := s.attempts("A", "r1")
		return busy
	})
	if got, err := s.Withdraw(WithIdentity(context.Background(), "A"), "k", "", "r1"); err != nil || got != (Withdrawal{NotGranted: true}) {
		t.Fatalf("withdraw: %+v %v", got, err)
	}
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	wantSettledRefusal(t, (<-first).err)
	if l, _ := s.currentLock("k"); l.Token != 0 {
		t.Fatalf("a settled request was granted: %+v", l)
	}
	if _, busy := s.attempts("A", "r1"); busy {
		t.Fatal("the attempt is still registered")
	}
	s.lead.mu.Lock()
	waiters := s.lead.waiters
	s.lead.mu.Unlock()
	if waiters != 0 {
		t.Fatalf("%d waiters left", waiters)
	}
	// The key is free for anyone else.
	if _, err := acquire(s, "B", "k", 0); err != nil {
		t.Fatal(err)
	}
}

// A withdrawal by wait id that carries the request id takes the wait out
// and settles the request: another attempt of the same request that was
// still in the network (here: arriving after the withdrawal) is refused.
func TestWithdrawByWaitIDSettlesTheRequest(t *testing.T) {
	s, _ := newLeaderV6(t, Config{})
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctxA := WithIdentity(context.Background(), "A")
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctxA, AcquireParams{Key: "k", Lease: time.Minute, Wait: 10 * time.Second, Timeout: 15 * time.Second, WaitID: "w1", RequestID: "r1"})
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	if got, err := s.Withdraw(ctxA, "k", "w1", "r1"); err != nil || got != (Withdrawal{Withdrawn: true}) {
		t.Fatalf("withdraw: %+v %v", got, err)
	}
	if err := <-done; err == nil {
		t.Fatal("the withdrawn wait was answered with a grant")
	}
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	_, err = acquireReq(context.Background(), s, "A", "k", "r1", 0)
	wantSettledRefusal(t, err)
	if l, _ := s.currentLock("k"); l.Token != 0 {
		t.Fatalf("a settled request was granted: %+v", l)
	}
}

// Below cluster version 6 a withdrawal by request id proposes no Settle:
// today's behaviour (a record-less request is reported not granted and a
// later attempt of it may still be granted).
func TestSettleNeedsVersion6(t *testing.T) {
	s, f := newLeaderV3(t, Config{})
	before := f.proposals.Load()
	if got, err := s.Withdraw(WithIdentity(context.Background(), "A"), "k", "", "r1"); err != nil || got != (Withdrawal{NotGranted: true}) {
		t.Fatalf("withdraw: %+v %v", got, err)
	}
	if f.proposals.Load() != before {
		t.Fatal("a withdrawal below cluster version 6 proposed something")
	}
	if _, err := acquireReq(context.Background(), s, "A", "k", "r1", 0); err != nil {
		t.Fatalf("below version 6 the request is not settled: %v", err)
	}
}

// A Settle that releases a semaphore slot frees it on the leader too: the
// slot can be taken again at once (the leader's view of the key's holders
// follows a Settle as it follows a Release).
func TestSettleFreesASemaphoreSlot(t *testing.T) {
	s, _ := newLeaderV6(t, Config{})
	ctxA := WithIdentity(context.Background(), "A")
	sem := func(rid string) (Grant, error) {
		return s.Acquire(ctxA, AcquireParams{Key: "sem", Lease: time.Minute, Timeout: 5 * time.Second, Limit: 2, RequestID: rid})
	}
	if _, err := sem(""); err != nil {
		t.Fatal(err)
	}
	g, err := sem("r1")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Withdraw(ctxA, "sem", "", "r1"); err != nil || got != (Withdrawal{ReleasedToken: g.Token}) {
		t.Fatalf("withdraw: %+v %v", got, err)
	}
	if _, err := sem(""); err != nil {
		t.Fatalf("the settled slot is not free: %v", err)
	}
}
