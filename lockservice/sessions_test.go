package lockservice

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// newSessionLeader is newLeader at cluster version 4 on a settable clock.
func newSessionLeader(t *testing.T, cfg Config) (*Service, *fakeNode, *clockAt) {
	t.Helper()
	clk := &clockAt{}
	cfg.Now = clk.now
	cfg.Logger = testkit.QuietLogger()
	s := New(cfg)
	f := &fakeNode{m: core.NewMachine(), obs: s}
	f.m.Apply(core.SetClusterVersion(4))
	s.Attach(f)
	s.OnLeaderReady(1)
	t.Cleanup(s.Close)
	return s, f, clk
}

func as(identity string) context.Context { return WithIdentity(context.Background(), identity) }

func openSession(t *testing.T, s *Service, identity string, ttl, delay time.Duration) uint64 {
	t.Helper()
	si, err := s.OpenSession(as(identity), ttl, delay)
	if err != nil {
		t.Fatalf("open session: %v", err)
	}
	return si.ID
}

func acquireIn(s *Service, identity, key string, session uint64, wait time.Duration) (Grant, error) {
	return s.Acquire(as(identity), AcquireParams{Key: key, Session: session, Wait: wait, Timeout: wait + 5*time.Second})
}

// advance moves the clock and wakes both timer loops, which computed their
// waits on the old time.
func advance(s *Service, clk *clockAt, d time.Duration) {
	clk.advance(d)
	s.signalTimersChanged()
	s.signalSessions()
}

func view[T any](f *fakeNode, fn func(m *core.Machine) T) T {
	var v T
	f.View(func(m *core.Machine) { v = fn(m) })
	return v
}

func held(f *fakeNode, key string) bool {
	return view(f, func(m *core.Machine) bool { _, ok := m.Get(key); return ok })
}

// A session's locks end with it: a close releases every one in one
// command (no lock-delay: a close is a release); only the opening identity
// may use, keep alive or close it.
func TestSessionCloseReleasesItsLocks(t *testing.T) {
	s, f, _ := newSessionLeader(t, Config{})
	id := openSession(t, s, "A", 5*time.Second, 10*time.Second)
	for _, k := range []string{"k1", "k2"} {
		g, err := acquireIn(s, "A", k, id, 0)
		if err != nil || g.Lease != 0 {
			t.Fatalf("acquire %s in the session: %+v, %v", k, g, err)
		}
	}
	if l, _ := f.m.Get("k1"); l.SessionID != id || l.LeaseMS != 0 || l.Identity != "A" {
		t.Fatalf("lock = %+v, want session %d without a lease", l, id)
	}
	h, err := s.Get(context.Background(), "k1")
	if err != nil || h.Remaining <= 0 || h.Remaining > 5*time.Second {
		t.Fatalf("get = %+v, %v; want the session's time left", h, err)
	}
	before := f.proposals.Load()
	for name, op := range map[string]func() error{
		"acquire":   func() error { _, err := acquireIn(s, "B", "k3", id, 0); return err },
		"keepalive": func() error { _, err := s.KeepAlive(as("B"), id); return err },
		"close":     func() error { _, err := s.CloseSession(as("B"), id); return err },
	} {
		if err := op(); !errors.Is(err, ErrPermissionDenied) {
			t.Errorf("%s by another identity: %v, want permission denied", name, err)
		}
	}
	if f.proposals.Load() != before {
		t.Fatal("a refused session request was proposed")
	}
	if _, err := s.Renew(as("A"), "k1", view(f, func(m *core.Machine) uint64 { l, _ := m.Get("k1"); return l.Token }), time.Minute); err == nil {
		t.Fatal("renew of a session lock succeeded")
	}
	n, err := s.CloseSession(as("A"), id)
	if err != nil || n != 2 {
		t.Fatalf("close = %d, %v; want 2 released", n, err)
	}
	if held(f, "k1") || held(f, "k2") || f.m.DelayCount() != 0 {
		t.Fatal("a close left a lock or a lock-delay")
	}
	if _, err := acquire(s, "B", "k1", 0); err != nil {
		t.Fatalf("acquire after the close: %v", err)
	}
	for name, op := range map[string]func() error{
		"acquire":   func() error { _, err := acquireIn(s, "A", "k9", id, 0); return err },
		"keepalive": func() error { _, err := s.KeepAlive(as("A"), id); return err },
		"close":     func() error { _, err := s.CloseSession(as("A"), id); return err },
	} {
		if err := op(); !errors.Is(err, ErrSessionNotFound) || !errors.Is(err, ErrNotFound) {
			t.Errorf("%s of a closed session: %v, want not found", name, err)
		}
	}
}

// The leader's timer ends a session that is not kept alive: its locks are
// freed into their lock-delay, a try meets held with the delay left, a
// waiter is granted once the delay clears, never before.
func TestSessionExpiryAndLockDelay(t *testing.T) {
	s, f, clk := newSessionLeader(t, Config{})
	id := openSession(t, s, "A", 2*time.Second, 3*time.Second)
	if _, err := acquireIn(s, "A", "k", id, 0); err != nil {
		t.Fatal(err)
	}
	advance(s, clk, time.Second)
	if _, ok := f.m.Session(id); !ok {
		t.Fatal("the session ended before its TTL")
	}
	advance(s, clk, 1100*time.Millisecond)
	testkit.Eventually(t, 5*time.Second, "the session expired", func() bool {
		return view(f, func(m *core.Machine) bool { _, ok := m.Session(id); return !ok })
	})
	if held(f, "k") {
		t.Fatal("the lock of an expired session is held")
	}
	_, err := acquire(s, "B", "k", 0)
	var de *DelayedError
	if !errors.Is(err, ErrHeld) || !errors.As(err, &de) || de.Remaining <= 2*time.Second || de.Remaining > 3*time.Second {
		t.Fatalf("try in the lock-delay: %v, want held with about 3s left", err)
	}
	got := make(chan error, 1)
	go func() { _, err := acquire(s, "B", "k", 10*time.Second); got <- err }()
	testkit.Eventually(t, 5*time.Second, "the waiter queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	advance(s, clk, 2*time.Second)
	select {
	case err := <-got:
		t.Fatalf("granted before the lock-delay ran out: %v", err)
	default:
	}
	advance(s, clk, 1100*time.Millisecond)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter after the lock-delay: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted once the lock-delay ran out")
	}
	if f.m.DelayCount() != 0 {
		t.Fatal("the delay was not cleared")
	}
}

// A keepalive restarts the timer without writing the log (one ReadIndex,
// no proposal), so a kept-alive session outlives many TTLs.
func TestKeepAliveIsNotLogged(t *testing.T) {
	s, f, clk := newSessionLeader(t, Config{})
	id := openSession(t, s, "A", 2*time.Second, 0)
	if _, err := acquireIn(s, "A", "k", id, 0); err != nil {
		t.Fatal(err)
	}
	before, reads := f.proposals.Load(), f.readIndexes.Load()
	for i := 0; i < 5; i++ {
		advance(s, clk, 1500*time.Millisecond)
		ttl, err := s.KeepAlive(as("A"), id)
		if err != nil || ttl != 2*time.Second {
			t.Fatalf("keepalive %d: %v, %v", i, ttl, err)
		}
	}
	if f.proposals.Load() != before {
		t.Fatalf("keepalives proposed %d commands", f.proposals.Load()-before)
	}
	if f.readIndexes.Load()-reads < 5 {
		t.Fatal("a keepalive was acknowledged without a ReadIndex")
	}
	if !held(f, "k") {
		t.Fatal("a kept-alive session lost its lock")
	}
}

// Rule 3 of core/sessions.go: a keepalive that meets an expiry in flight is
// logged as RefreshSession; the expiry, ordered after it, changes nothing.
func TestKeepAliveDuringExpiryIsLogged(t *testing.T) {
	s, f, _ := newSessionLeader(t, Config{})
	id := openSession(t, s, "A", 2*time.Second, 0)
	if _, err := acquireIn(s, "A", "k", id, 0); err != nil {
		t.Fatal(err)
	}
	s.lead.mu.Lock()
	s.lead.sess.byID[id].expiring = true // as the session loop marks it
	s.lead.mu.Unlock()
	before := f.proposals.Load()
	if _, err := s.KeepAlive(as("A"), id); err != nil {
		t.Fatal(err)
	}
	if f.proposals.Load() != before+1 {
		t.Fatal("a keepalive during an expiry was not logged")
	}
	x, _ := f.m.Session(id)
	if x.Epoch != 2 {
		t.Fatalf("epoch %d after a logged keepalive, want 2", x.Epoch)
	}
	// The expiry the leader had in flight applies after it: stale.
	a, err := f.Propose(context.Background(), core.ExpireSession(id, 1))
	if err != nil || a.Result.Existed {
		t.Fatalf("stale expiry applied as %v, %v", a.Result, err)
	}
	if !held(f, "k") {
		t.Fatal("a stale expiry ended a kept-alive session's lock")
	}
	s.lead.mu.Lock()
	expiring := s.lead.sess.byID[id].expiring
	s.lead.mu.Unlock()
	if expiring {
		t.Fatal("the refresh left the timer expiring: every later keepalive would be logged")
	}
}

// A new leader arms every session and every delayed key with its full
// TTL or delay from its LeaderReady: never shorter than before.
func TestNewLeaderNeverShortens(t *testing.T) {
	s, f, clk := newSessionLeader(t, Config{})
	id := openSession(t, s, "A", 4*time.Second, 0)
	if _, err := acquireIn(s, "A", "s", id, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(as("A"), AcquireParams{Key: "d", Lease: time.Second, LockDelay: 4 * time.Second, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	advance(s, clk, 1100*time.Millisecond)
	testkit.Eventually(t, 5*time.Second, "the lease expired into its lock-delay", func() bool {
		return view(f, func(m *core.Machine) bool { _, ok := m.Delay("d"); return ok })
	})
	advance(s, clk, 2*time.Second) // half of each used up on this leader
	s.OnLeadershipLost()
	s.OnLeaderReady(2)
	s.lead.mu.Lock()
	left, _ := s.lead.sess.delayLeft("d", clk.now())
	sessLeft := s.lead.sess.byID[id].deadline.Sub(clk.now())
	s.lead.mu.Unlock()
	if left < 4*time.Second-100*time.Millisecond || sessLeft < 4*time.Second-100*time.Millisecond {
		t.Fatalf("after a leader change: delay %v, session %v left; want the full 4s each", left, sessLeft)
	}
	advance(s, clk, 3*time.Second)
	if !held(f, "s") || f.m.DelayCount() != 1 {
		t.Fatal("a new leader ended a session or a delay early")
	}
}

// Below cluster version 4 every session field and request is refused
// (unsupported) and nothing is proposed.
func TestSessionsNeedClusterVersion4(t *testing.T) {
	s, f := newLeader(t, Config{}) // cluster version 2
	f.m.Apply(core.SetClusterVersion(3))
	for name, op := range map[string]func() error{
		"open":      func() error { _, err := s.OpenSession(as("A"), time.Minute, 0); return err },
		"keepalive": func() error { _, err := s.KeepAlive(as("A"), 1); return err },
		"close":     func() error { _, err := s.CloseSession(as("A"), 1); return err },
		"session":   func() error { _, err := acquireIn(s, "A", "k", 1, 0); return err },
		"lock delay": func() error {
			_, err := s.Acquire(as("A"), AcquireParams{Key: "k", Lease: time.Second, LockDelay: time.Second, Timeout: time.Second})
			return err
		},
	} {
		if err := op(); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s at cluster version 3: %v, want unsupported", name, err)
		}
	}
	if f.proposals.Load() != 0 {
		t.Fatal("something was proposed")
	}
}

// The session bounds: in all, per identity, and locks per session (core's
// hard cap, with a test-sized machine limit); each its own resource.
func TestSessionBounds(t *testing.T) {
	s, _, _ := newSessionLeader(t, Config{Limits: Limits{MaxSessions: 3, MaxSessionsPerIdentity: 2, MaxLocksPerSession: 2}})
	openSession(t, s, "A", time.Minute, 0)
	openSession(t, s, "A", time.Minute, 0)
	_, err := s.OpenSession(as("A"), time.Minute, 0)
	wantLimit(t, err, ResourceIdentitySessions)
	id := openSession(t, s, "B", time.Minute, 0)
	_, err = s.OpenSession(as("C"), time.Minute, 0)
	wantLimit(t, err, ResourceSessions)

	for i := 0; i < 2; i++ {
		if _, err := acquireIn(s, "B", fmt.Sprint("k", i), id, 0); err != nil {
			t.Fatal(err)
		}
	}
	_, err = acquireIn(s, "B", "k2", id, 0)
	wantLimit(t, err, ResourceSessionLocks)
	if _, err := s.OpenSession(as("B"), 999*time.Millisecond, 0); err == nil {
		t.Fatal("a TTL below core.MinSessionTTL was accepted")
	}
}

// A lock-delay applies only to a failure: a released lock is free at once.
func TestLockDelayOnlyAfterFailure(t *testing.T) {
	s, f, _ := newSessionLeader(t, Config{})
	g, err := s.Acquire(as("A"), AcquireParams{Key: "k", Lease: time.Minute, LockDelay: 30 * time.Second, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(as("A"), "k", g.Token); err != nil {
		t.Fatal(err)
	}
	if f.m.DelayCount() != 0 {
		t.Fatal("a release left a lock-delay")
	}
	if _, err := acquire(s, "B", "k", 0); err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
}
