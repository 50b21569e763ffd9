package lockservice

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/plugins"
)

// clockAt is a settable lease clock.
type clockAt struct{ offset atomic.Int64 }

func (c *clockAt) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clockAt) advance(d time.Duration) { c.offset.Add(int64(d)) }

func TestRenew(t *testing.T) {
	tests := []struct {
		name      string
		granted   time.Duration // lease of the grant
		ask       time.Duration // lease asked in the renew (0: keep)
		wrongTok  bool
		version1  bool
		wantErr   error
		wantLease time.Duration
	}{
		{name: "longer lease", granted: time.Second, ask: 10 * time.Second, wantLease: 10 * time.Second},
		{name: "keep lease", granted: 5 * time.Second, ask: 0, wantLease: 5 * time.Second},
		{name: "shorter never shortens", granted: 5 * time.Second, ask: time.Second, wantLease: 5 * time.Second},
		{name: "wrong token", granted: time.Second, wrongTok: true, wantErr: ErrNotFound},
		{name: "cluster version 1", granted: time.Second, version1: true, wantErr: ErrUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var clk clockAt
			s, f := newLeader(t, Config{Now: clk.now})
			if tc.version1 {
				f.m = core.NewMachine() // a fresh table at cluster version 1
				s.OnLeaderReady(2)
			}
			g, err := s.Acquire(context.Background(), AcquireParams{Key: "k", Lease: tc.granted, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			tok := g.Token
			if tc.wrongTok {
				tok++
			}
			before := f.proposals.Load()
			clk.advance(tc.granted / 2)
			r, err := s.Renew(context.Background(), "k", tok, tc.ask)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				if f.proposals.Load() != before {
					t.Fatal("a refused renew was proposed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Lease != tc.wantLease || r.Token != g.Token || r.Index <= g.Index {
				t.Fatalf("renewal %+v, want lease %v token %d", r, tc.wantLease, g.Token)
			}
			// The leader's timer now runs from the renewal.
			h, err := s.Get(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if h.Lock.LeaseMS != uint64(tc.wantLease.Milliseconds()) || h.Remaining < tc.wantLease-time.Second {
				t.Fatalf("after renew: lease %dms remaining %v, want %v", h.Lock.LeaseMS, h.Remaining, tc.wantLease)
			}
		})
	}
}

// A renew arriving after the lease ran out on the leader is refused
// without a proposal, and the lock expires.
func TestRenewAfterLeaseRanOut(t *testing.T) {
	var clk clockAt
	s, f := newLeader(t, Config{Now: clk.now})
	g, err := s.Acquire(context.Background(), AcquireParams{Key: "k", Lease: time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Only Renews count: the expiry loop may propose the lock's Expire
	// meanwhile (counting every proposal made this test flaky).
	var renews atomic.Int64
	f.beforePropose = func(cmd core.Command) {
		if cmd.Kind == core.KindRenew {
			renews.Add(1)
		}
	}
	clk.advance(2 * time.Second)
	if _, err := s.Renew(context.Background(), "k", g.Token, time.Minute); !errors.Is(err, ErrNotFound) {
		t.Fatalf("renew after the lease: %v, want not found", err)
	}
	if n := renews.Load(); n != 0 {
		t.Fatalf("a late renew was proposed (%d)", n)
	}
}

// The expiry loop never hands out a lock with a Renew in flight, and a
// lock handed out for expiry refuses renewals: a Renew and an Expire of
// one lock are never in flight together.
func TestLeaseHeapRenewExpireExclusive(t *testing.T) {
	h := newLeaseTable()
	t0 := time.Unix(1000, 0)
	h.arm("a", 1, "", time.Second, t0)
	h.arm("b", 2, "", time.Second, t0)
	h.addRenewing("a", 1, +1)
	due := h.due(t0.Add(2*time.Second), time.Second, 10)
	if len(due) != 1 || due[0].key != "b" {
		t.Fatalf("due = %+v, want only b (a has a renew in flight)", due)
	}
	if b, _ := h.get("b"); !b.expiring {
		t.Fatal("b handed out for expiry is not marked expiring")
	}
	// The renewal applies: a's deadline moves to now + the longer lease.
	now := t0.Add(2 * time.Second)
	if !h.extend("a", 1, 5*time.Second, now) {
		t.Fatal("extend found no timer")
	}
	if a, _ := h.get("a"); !a.deadline.Equal(now.Add(5*time.Second)) || a.lease != 5*time.Second {
		t.Fatalf("a: deadline %v lease %v", a.deadline.Sub(t0), a.lease)
	}
	// A shorter lease never moves it earlier.
	h.extend("a", 1, time.Second, now)
	if a, _ := h.get("a"); !a.deadline.Equal(now.Add(5 * time.Second)) {
		t.Fatal("a shorter renewal moved the deadline earlier")
	}
	if h.extend("a", 9, time.Minute, now) {
		t.Fatal("extend with another token found a timer")
	}
}

// leaseCap is a policy that allows leases up to max.
type leaseCap struct{ max uint64 }

func (p leaseCap) ValidateGrant(_ context.Context, g plugins.Grant) (plugins.Verdict, error) {
	if g.LeaseMS > p.max {
		return plugins.Verdict{Reason: fmt.Sprintf("lease %d ms over the cap", g.LeaseMS)}, nil
	}
	return plugins.Verdict{Allow: true}, nil
}

// TestRenewKeepsTheGrantsRules: only the identity a lock was granted to
// may renew it, and a renewal that lengthens the lease is asked of the
// policy like a grant of that lease.
func TestRenewKeepsTheGrantsRules(t *testing.T) {
	s, _ := newLeader(t, Config{Policy: leaseCap{max: 30_000}})
	g, err := acquire(s, "alice", "k", 0) // a one-minute lease would be over the cap
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("acquire over the cap: %v, %+v", err, g)
	}
	ctx := WithIdentity(context.Background(), "alice")
	g, err = s.Acquire(ctx, AcquireParams{Key: "k", Lease: 10 * time.Second, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	bob := WithIdentity(context.Background(), "bob")
	if _, err := s.Renew(bob, "k", g.Token, 0); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("bob renews alice's lock: %v, want permission_denied", err)
	}
	if _, err := s.Renew(ctx, "k", g.Token, time.Hour); !errors.Is(err, ErrDenied) {
		t.Fatalf("renew past the policy's cap: %v, want denied", err)
	}
	r, err := s.Renew(ctx, "k", g.Token, 20*time.Second)
	if err != nil || r.Lease != 20*time.Second {
		t.Fatalf("renew within the cap: %+v, %v", r, err)
	}
	if r, err := s.Renew(ctx, "k", g.Token, 0); err != nil || r.Lease != 20*time.Second {
		t.Fatalf("renew keeping the lease: %+v, %v", r, err)
	}
}
