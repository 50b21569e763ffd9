package lockservice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// currentLock reads key's mutex or exclusive lock and the last token.
func (s *Service) currentLock(key string) (held core.Lock, lastToken uint64) {
	s.node.View(func(m *core.Machine) {
		held, _ = m.Get(key)
		lastToken = m.LastToken()
	})
	return held, lastToken
}

// newKindsLeader is newSessionLeader at cluster version 5.
func newKindsLeader(t *testing.T, cfg Config) (*Service, *fakeNode, *clockAt) {
	t.Helper()
	s, f, clk := newSessionLeader(t, cfg)
	f.m.Apply(core.SetClusterVersion(5))
	return s, f, clk
}

// kindAcquire acquires key as (limit, mode) with a one-minute lease.
func kindAcquire(s *Service, identity, key string, limit uint32, mode core.Mode, lease, wait time.Duration) (Grant, error) {
	return s.Acquire(as(identity), AcquireParams{Key: key, Lease: lease, Wait: wait, Timeout: wait + 5*time.Second, Limit: limit, Mode: mode})
}

// result is an acquire's outcome, delivered on a channel by a waiter.
type result struct {
	name string
	g    Grant
	err  error
}

// waitFor starts a waiting acquire and returns once it is queued (the
// key's queue has n waiters): the order of queued waiters is then known.
func waitFor(t *testing.T, s *Service, out chan<- result, name, key string, limit uint32, mode core.Mode, n int) {
	t.Helper()
	go func() {
		g, err := kindAcquire(s, "", key, limit, mode, time.Minute, 10*time.Second)
		out <- result{name, g, err}
	}()
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("%s queued", name), func() bool { return queued(s, key) == n })
}

func queued(s *Service, key string) int {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if q := s.lead.queues[key]; q != nil {
		return q.len()
	}
	return 0
}

func next(t *testing.T, out <-chan result) result {
	t.Helper()
	select {
	case r := <-out:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no waiter was served")
	}
	return result{}
}

func none(t *testing.T, out <-chan result) {
	t.Helper()
	select {
	case r := <-out:
		t.Fatalf("%s served out of turn: %+v %v", r.name, r.g, r.err)
	default:
	}
}

func release(t *testing.T, s *Service, key string, token uint64) {
	t.Helper()
	if err := s.Release(context.Background(), key, token); err != nil {
		t.Fatalf("release %s/%d: %v", key, token, err)
	}
}

// A semaphore of limit N has N holders with rising tokens, then held; its
// waiters are served in FIFO order, one freed slot each.
func TestSemaphoreHoldersAndFIFO(t *testing.T) {
	s, _, _ := newKindsLeader(t, Config{})
	var tokens []uint64
	for i := 0; i < 3; i++ {
		g, err := kindAcquire(s, "", "sem", 3, core.ModeExclusive, time.Minute, 0)
		if err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
		if i > 0 && g.Token <= tokens[i-1] {
			t.Fatalf("token %d after %d", g.Token, tokens[i-1])
		}
		tokens = append(tokens, g.Token)
	}
	if _, err := kindAcquire(s, "", "sem", 3, core.ModeExclusive, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("fourth try: %v, want held", err)
	}
	h, err := s.Get(context.Background(), "sem")
	if err != nil || !h.Held || h.Limit != 3 || len(h.All) != 3 || h.All[2].Lock.Token != tokens[2] || h.All[0].Remaining <= 0 {
		t.Fatalf("get: %+v %v", h, err)
	}
	out := make(chan result, 3)
	waitFor(t, s, out, "w1", "sem", 3, core.ModeExclusive, 1)
	waitFor(t, s, out, "w2", "sem", 3, core.ModeExclusive, 2)
	waitFor(t, s, out, "w3", "sem", 3, core.ModeExclusive, 3)
	release(t, s, "sem", tokens[1])
	if r := next(t, out); r.name != "w1" || r.err != nil {
		t.Fatalf("first served: %s %v, want w1", r.name, r.err)
	}
	none(t, out)
	release(t, s, "sem", tokens[0])
	if r := next(t, out); r.name != "w2" || r.err != nil {
		t.Fatalf("second served: %s %v, want w2", r.name, r.err)
	}
	none(t, out)
	// The check accepts any current holder, and no longer a released one.
	if c, err := s.Check(context.Background(), "sem", tokens[2]); err != nil || !c.Current {
		t.Fatalf("check of a holder: %+v %v", c, err)
	}
	if c, err := s.Check(context.Background(), "sem", tokens[0]); err != nil || c.Current {
		t.Fatalf("check of a released holder: %+v %v", c, err)
	}
	release(t, s, "sem", tokens[2])
	if r := next(t, out); r.name != "w3" || r.err != nil {
		t.Fatalf("third served: %s %v, want w3", r.name, r.err)
	}
}

// Every holder and waiter names the key's limit: a mismatch is
// invalid_argument naming the current one.
func TestKindLimitMismatch(t *testing.T) {
	s, _, _ := newKindsLeader(t, Config{})
	if _, err := kindAcquire(s, "", "m", 0, core.ModeExclusive, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key   string
		limit uint32
		mode  core.Mode
		want  string
	}{
		{"m", 2, core.ModeExclusive, "has limit 1"},
		{"sem", 3, core.ModeExclusive, "has limit 2"},
		{"sem", 0, core.ModeExclusive, "has limit 2"},
		{"sem", 0, core.ModeShared, "has limit 2"},
		{"sem", 2, core.ModeShared, "no shared mode"},
		{"x", core.MaxSemaphoreLimit + 1, core.ModeExclusive, "above"},
	}
	for _, tc := range tests {
		for _, wait := range []time.Duration{0, time.Second} {
			_, err := kindAcquire(s, "", tc.key, tc.limit, tc.mode, time.Minute, wait)
			if !errors.Is(err, core.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s limit %d %v wait %v: %v, want invalid_argument %q", tc.key, tc.limit, tc.mode, wait, err, tc.want)
			}
		}
	}
	// A waiter's limit binds the waiters behind it too.
	s2, _, _ := newKindsLeader(t, Config{})
	g, err := kindAcquire(s2, "", "q", 0, core.ModeExclusive, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 1)
	waitFor(t, s2, out, "mutex waiter", "q", 0, core.ModeExclusive, 1)
	release(t, s2, "q", g.Token)
	r := next(t, out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := kindAcquire(s2, "", "q", 4, core.ModeExclusive, time.Minute, time.Second); !errors.Is(err, core.ErrInvalidArgument) {
		t.Fatalf("semaphore on a held mutex: %v", err)
	}
}

// Read/write: shared holders coexist; an exclusive waiter is not
// overtaken by later shared requests (a shared try answers held); its
// token is above every earlier shared token.
func TestReadWriteFIFO(t *testing.T) {
	s, _, _ := newKindsLeader(t, Config{})
	r1, err := kindAcquire(s, "", "rw", 0, core.ModeShared, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kindAcquire(s, "", "rw", 0, core.ModeShared, time.Minute, 0)
	if err != nil {
		t.Fatalf("second shared: %v", err)
	}
	if _, err := kindAcquire(s, "", "rw", 0, core.ModeExclusive, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("exclusive try beside readers: %v, want held", err)
	}
	out := make(chan result, 4)
	waitFor(t, s, out, "writer", "rw", 0, core.ModeExclusive, 1)
	if _, err := kindAcquire(s, "", "rw", 0, core.ModeShared, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("shared try behind a queued writer: %v, want held", err)
	}
	waitFor(t, s, out, "reader3", "rw", 0, core.ModeShared, 2)
	waitFor(t, s, out, "reader4", "rw", 0, core.ModeShared, 3)
	release(t, s, "rw", r1.Token)
	none(t, out)
	release(t, s, "rw", r2.Token)
	w := next(t, out)
	if w.name != "writer" || w.err != nil || w.g.Token <= r2.Token {
		t.Fatalf("served %s %+v %v, want the writer with a token above %d", w.name, w.g, w.err, r2.Token)
	}
	none(t, out)
	release(t, s, "rw", w.g.Token)
	// Both readers behind it fit together.
	a, b := next(t, out), next(t, out)
	if a.err != nil || b.err != nil || a.name == "writer" || b.name == "writer" {
		t.Fatalf("readers: %+v %+v", a, b)
	}
	h, err := s.Get(context.Background(), "rw")
	if err != nil || len(h.All) != 2 || h.Mode != core.ModeShared {
		t.Fatalf("get: %+v %v", h, err)
	}
}

// Each holder has its own lease: one runs out and frees one slot, to the
// head waiter; the others stay. A renew and a release name one holder.
func TestKindPerHolderLeases(t *testing.T) {
	s, f, clk := newKindsLeader(t, Config{})
	short, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	long, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(context.Background(), "sem", long.Token, 2*time.Minute); err != nil {
		t.Fatalf("renew of one holder: %v", err)
	}
	if _, err := s.Renew(context.Background(), "sem", long.Token+100, time.Minute); !errors.Is(err, ErrNotFound) {
		t.Fatalf("renew of no holder: %v", err)
	}
	out := make(chan result, 1)
	waitFor(t, s, out, "waiter", "sem", 2, core.ModeExclusive, 1)
	advance(s, clk, 2*time.Second)
	r := next(t, out)
	if r.err != nil {
		t.Fatal(r.err)
	}
	holders := view(f, func(m *core.Machine) []core.Lock { return m.Holders("sem") })
	if len(holders) != 2 || holders[0].Token != long.Token || holders[1].Token != r.g.Token {
		t.Fatalf("holders after one expiry: %+v (short %d, long %d)", holders, short.Token, long.Token)
	}
	// The renewed holder's lease outlives the first one's by far.
	advance(s, clk, 90*time.Second)
	testkit.Eventually(t, 5*time.Second, "the waiter's holder expires", func() bool {
		return len(view(f, func(m *core.Machine) []core.Lock { return m.Holders("sem") })) == 1
	})
	if _, ok := view(f, func(m *core.Machine) core.Lock { l, _ := m.Holder("sem", long.Token); return l }), true; !ok || !holderOf(f, "sem", long.Token) {
		t.Fatal("the renewed holder expired")
	}
}

func holderOf(f *fakeNode, key string, token uint64) bool {
	return view(f, func(m *core.Machine) bool { _, ok := m.Holder(key, token); return ok })
}

// A new leader re-arms every holder's timer and view: the key still
// counts its holders and they still expire.
func TestKindLeaderChangeKeepsHolders(t *testing.T) {
	s, f, clk := newKindsLeader(t, Config{})
	var tokens []uint64
	for i := 0; i < 2; i++ {
		g, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, g.Token)
	}
	if _, err := kindAcquire(s, "", "rw", 0, core.ModeShared, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	s.OnLeadershipLost()
	s.OnLeaderReady(2)
	if _, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("try of a full semaphore after a leader change: %v, want held", err)
	}
	if _, err := kindAcquire(s, "", "rw", 0, core.ModeExclusive, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("exclusive try beside a reader after a leader change: %v, want held", err)
	}
	h, err := s.Get(context.Background(), "sem")
	if err != nil || len(h.All) != 2 || h.All[1].Remaining <= 0 {
		t.Fatalf("get: %+v %v", h, err)
	}
	advance(s, clk, 2*time.Second)
	testkit.Eventually(t, 5*time.Second, "both holders expire on the new leader", func() bool {
		return !holderOf(f, "sem", tokens[0]) && !holderOf(f, "sem", tokens[1])
	})
}

// A failed semaphore holder with a lock-delay keeps its slot until the
// leader clears the delay.
func TestKindSlotDelay(t *testing.T) {
	s, f, clk := newKindsLeader(t, Config{})
	g, err := s.Acquire(as(""), AcquireParams{Key: "sem", Lease: time.Second, Timeout: 5 * time.Second, Limit: 2, LockDelay: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	advance(s, clk, 2*time.Second)
	testkit.Eventually(t, 5*time.Second, "the short holder expires", func() bool { return !holderOf(f, "sem", g.Token) })
	if _, err := kindAcquire(s, "", "sem", 2, core.ModeExclusive, time.Minute, 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("try while the slot is delayed: %v, want held", err)
	}
	out := make(chan result, 1)
	waitFor(t, s, out, "waiter", "sem", 2, core.ModeExclusive, 1)
	advance(s, clk, 11*time.Second)
	if r := next(t, out); r.err != nil {
		t.Fatalf("waiter after the delay: %v", r.err)
	}
}

// Below cluster version 5 a limit or a mode is refused as unsupported,
// and nothing is proposed.
func TestKindVersionGate(t *testing.T) {
	s, f, _ := newSessionLeader(t, Config{}) // version 4
	before := f.proposals.Load()
	for _, p := range []struct {
		limit uint32
		mode  core.Mode
		want  string
	}{{3, core.ModeExclusive, "limit"}, {0, core.ModeShared, "mode"}} {
		_, err := kindAcquire(s, "", "k", p.limit, p.mode, time.Minute, 0)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), p.want) {
			t.Fatalf("limit %d mode %v at version 4: %v, want unsupported naming %s", p.limit, p.mode, err, p.want)
		}
	}
	if _, err := kindAcquire(s, "", "k", 1, core.ModeExclusive, time.Minute, 0); err != nil {
		t.Fatalf("limit 1 (a mutex) at version 4: %v", err)
	}
	if f.proposals.Load() != before+1 {
		t.Fatal("a refused acquire was proposed")
	}
}
