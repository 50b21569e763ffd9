package lockservice

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/plugins"
)

// One identity's waiters fill its own share, never the node's: its next
// wait is refused with identity_waiters while another identity, and
// anonymous callers (one shared identity), still queue.
func TestWaitersPerIdentity(t *testing.T) {
	s, _ := newLeader(t, Config{Limits: Limits{MaxWaitersPerIdentity: 2, MaxWaiters: 10}})
	for _, id := range []string{"holder"} {
		if _, err := acquire(s, id, "k", 0); err != nil {
			t.Fatal(err)
		}
	}
	waiters := func(id string) int {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waitersBy[id]
	}
	errs := make(chan error, 8)
	wait := func(id string) {
		go func() {
			_, err := s.Acquire(WithIdentity(context.Background(), id), AcquireParams{Key: "k", Lease: time.Minute, Wait: 300 * time.Millisecond, Timeout: 5 * time.Second})
			errs <- err
		}()
	}
	wait("A")
	wait("A")
	testkit.Eventually(t, 5*time.Second, "two of A's waits queued", func() bool { return waiters("A") == 2 })
	_, err := acquire(s, "A", "k", 10*time.Second)
	wantLimit(t, err, ResourceIdentityWaiters)
	var le *LimitError
	if errors.As(err, &le); le.Identity != "A" || le.Limit != 2 {
		t.Fatalf("limit error %+v, want identity A at 2", le)
	}
	wait("B")
	wait("")
	testkit.Eventually(t, 5*time.Second, "B and an anonymous caller queued", func() bool { return waiters("B") == 1 && waiters("") == 1 })
	for range 4 {
		if err := <-errs; !errors.Is(err, ErrTimeout) {
			t.Fatalf("queued wait ended with %v, want a timeout", err)
		}
	}
	testkit.Eventually(t, 5*time.Second, "every share counted out", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return len(s.lead.waitersBy) == 0 && s.lead.waiters == 0
	})
}

// BeginRequest admits MaxInflightPerIdentity requests of one identity; a
// parked acquire (Parked) leaves the count, so an identity whose requests
// all wait can still send a try.
func TestInflightPerIdentity(t *testing.T) {
	s, _ := newLeader(t, Config{Limits: Limits{MaxInflightPerIdentity: 2}})
	done1, err := s.BeginRequest("A")
	if err != nil {
		t.Fatal(err)
	}
	done2, err := s.BeginRequest("A")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginRequest("A"); err == nil {
		t.Fatal("a third request of A was admitted")
	} else {
		wantLimit(t, err, ResourceIdentityInflight)
	}
	if done, err := s.BeginRequest("B"); err != nil {
		t.Fatalf("B refused for A's requests: %v", err)
	} else {
		done()
	}
	done1()
	done1() // idempotent: does not free A's other request
	if _, err := s.BeginRequest("A"); err != nil {
		t.Fatalf("A after one request ended: %v", err)
	}
	if _, err := s.BeginRequest("A"); err == nil {
		t.Fatal("done twice freed two requests")
	}
	done2()

	// An acquire that parks in its key's queue calls Parked.
	if _, err := acquire(s, "holder", "k", 0); err != nil {
		t.Fatal(err)
	}
	parked := make(chan struct{})
	go func() {
		_, _ = s.Acquire(WithIdentity(context.Background(), "W"), AcquireParams{Key: "k", Lease: time.Minute, Wait: 200 * time.Millisecond, Timeout: 5 * time.Second,
			Parked: func() { close(parked) }})
	}()
	select {
	case <-parked:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting acquire never parked")
	}
}

// Release is tied to the identity the lock was granted to, as renew is:
// carol releasing alice's lock with its token is permission_denied and
// changes nothing; anonymous locks stay releasable by anyone; the
// cluster's own lost-reply release passes.
func TestReleaseTiedToGrantingIdentity(t *testing.T) {
	s, f := newLeader(t, Config{})
	alice := WithIdentity(context.Background(), "TENANT_A/alice")
	carol := WithIdentity(context.Background(), "TENANT_A/carol")
	g, err := s.Acquire(alice, AcquireParams{Key: "a/1", Lease: time.Minute, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before := f.proposals.Load()
	err = s.Release(carol, "a/1", g.Token)
	var pe *PermissionError
	if !errors.Is(err, ErrPermissionDenied) || !errors.As(err, &pe) || pe.Identity != "TENANT_A/carol" {
		t.Fatalf("carol's release of alice's lock: %v, want permission_denied", err)
	}
	if err := s.Release(context.Background(), "a/1", g.Token); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("anonymous release of alice's lock: %v, want permission_denied", err)
	}
	if f.proposals.Load() != before {
		t.Fatal("a refused release was proposed")
	}
	if l, _ := s.lockOf("a/1", g.Token); l.Token != g.Token || l.Identity != "TENANT_A/alice" {
		t.Fatalf("alice's lock after carol's release: %+v", l)
	}
	if err := s.Release(alice, "a/1", g.Token); err != nil {
		t.Fatalf("alice's own release: %v", err)
	}

	// A lock granted to nobody in particular is released by anyone.
	g, err = acquire(s, "", "anon", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(carol, "anon", g.Token); err != nil {
		t.Fatalf("release of an anonymous lock: %v", err)
	}
	// The cluster's lost-reply release passes.
	g, err = s.Acquire(alice, AcquireParams{Key: "a/2", Lease: time.Minute, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(WithNodeAuthority(carol), "a/2", g.Token); err != nil {
		t.Fatalf("node-authority release: %v", err)
	}
}

// A release of a token above the last one issued is not_found after a
// ReadIndex, without a proposal: a Release guessed for the token of a
// Grant still in flight can never free that lock. An older token no
// longer held is proposed and applies as not_found, as before.
func TestReleaseOfUnheldTokenIsNotProposed(t *testing.T) {
	s, f := newLeader(t, Config{})
	g, err := acquire(s, "A", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	before, reads := f.proposals.Load(), f.readIndexes.Load()
	if err := s.Release(WithIdentity(context.Background(), "C"), "k", g.Token+1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("release of the next token: %v, want not_found", err)
	}
	if f.proposals.Load() != before || f.readIndexes.Load() != reads+1 {
		t.Fatalf("proposals %d -> %d, read indexes %d -> %d: want none and one", before, f.proposals.Load(), reads, f.readIndexes.Load())
	}
	if err := s.Release(WithIdentity(context.Background(), "A"), "k", g.Token); err != nil {
		t.Fatal(err)
	}
	before = f.proposals.Load()
	if err := s.Release(WithIdentity(context.Background(), "C"), "k", g.Token); !errors.Is(err, ErrNotFound) || f.proposals.Load() != before+1 {
		t.Fatalf("release of a released token: %v after %d proposals, want not_found after one", err, f.proposals.Load()-before)
	}
	if g, err = acquire(s, "A", "k", 0); err != nil {
		t.Fatal(err)
	}
	// A deposed leader says so instead of not_found.
	f.readIndex = func() error { return errors.New("raftstore: not the leader") }
	if err := s.Release(WithIdentity(context.Background(), "C"), "k", g.Token+1); errors.Is(err, ErrNotFound) {
		t.Fatalf("a failed ReadIndex answered not_found: %v", err)
	}
	var l core.Lock
	f.View(func(m *core.Machine) { l, _ = m.Get("k") })
	if l.Token != g.Token {
		t.Fatalf("lock k is %+v, want token %d", l, g.Token)
	}
}

// spentPolicy refuses identity "slow" as a plugin does once its share of
// plugin time is spent.
type spentPolicy struct{}

func (spentPolicy) ValidateGrant(_ context.Context, g plugins.Grant) (plugins.Verdict, error) {
	if g.Identity == "slow" {
		err := &plugins.ShareError{Plugin: "p", Identity: g.Identity, PerSecond: 250 * time.Millisecond}
		return plugins.Verdict{Reason: "plugin error"}, err
	}
	return plugins.Verdict{Allow: true}, nil
}

// A policy plugin's share refusal is a *LimitError (identity_plugin_time),
// not a denial, and is counted as a refusal.
func TestPluginShareIsALimit(t *testing.T) {
	s, _ := newLeader(t, Config{Policy: spentPolicy{}})
	_, err := acquire(s, "slow", "k", 0)
	wantLimit(t, err, ResourceIdentityPluginTime)
	var le *LimitError
	if errors.As(err, &le); le.Limit != 250 || le.Identity != "slow" {
		t.Fatalf("limit error %+v, want 250 ms per second for slow", le)
	}
	if errors.Is(err, ErrDenied) {
		t.Fatalf("%v matches ErrDenied", err)
	}
	if _, err := acquire(s, "other", "k", 0); err != nil {
		t.Fatalf("another identity: %v", err)
	}
}
