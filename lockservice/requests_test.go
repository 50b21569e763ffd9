package lockservice

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// newLeaderV3 is newLeader at cluster version 3 (request ids recorded).
func newLeaderV3(t *testing.T, cfg Config) (*Service, *fakeNode) {
	t.Helper()
	s, f := newLeader(t, cfg)
	f.m.Apply(core.SetClusterVersion(3))
	return s, f
}

func acquireReq(ctx context.Context, s *Service, identity, key, requestID string, wait time.Duration) (Grant, error) {
	ctx = WithIdentity(ctx, identity)
	return s.Acquire(ctx, AcquireParams{Key: key, Lease: time.Minute, Wait: wait, Timeout: wait + 5*time.Second, RequestID: requestID})
}

// A retry with the same request id learns the first outcome: the same
// grant while held (no second proposal), grant_ended with its token once
// it ended, invalid_argument naming the key for another key; the id is
// scoped to the identity; below cluster version 3 it is refused unproposed.
func TestAcquireRequestID(t *testing.T) {
	tests := []struct {
		name string
		// then is the retry after a first grant g of "k" to identity A
		// with request id "r1".
		then func(t *testing.T, s *Service, f *fakeNode, g Grant)
	}{
		{name: "held: the same grant", then: func(t *testing.T, s *Service, f *fakeNode, g Grant) {
			before, reads := f.proposals.Load(), f.readIndexes.Load()
			r, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
			if err != nil {
				t.Fatal(err)
			}
			if r.Token != g.Token || !r.Repeated || r.Key != "k" || r.Remaining <= 0 || r.Remaining > time.Minute {
				t.Fatalf("retry: %+v, want token %d repeated", r, g.Token)
			}
			if f.proposals.Load() != before {
				t.Fatal("a repeat was proposed")
			}
			if f.readIndexes.Load() == reads {
				t.Fatal("a repeat was answered without a ReadIndex (a deposed leader's table)")
			}
		}},
		{name: "held, the leader's confirmation fails", then: func(t *testing.T, s *Service, f *fakeNode, g Grant) {
			f.readIndex = func() error { return context.DeadlineExceeded }
			if _, err := acquireReq(context.Background(), s, "A", "k", "r1", 0); err == nil {
				t.Fatal("answered without a confirmed leadership")
			}
		}},
		{name: "ended: grant_ended with its token", then: func(t *testing.T, s *Service, f *fakeNode, g Grant) {
			if err := s.Release(WithIdentity(context.Background(), "A"), "k", g.Token); err != nil {
				t.Fatal(err)
			}
			before := f.proposals.Load()
			_, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
			var ge *GrantEndedError
			if !errors.Is(err, ErrGrantEnded) || !errors.As(err, &ge) || ge.Token != g.Token || ge.Key != "k" {
				t.Fatalf("err = %v, want grant_ended with token %d", err, g.Token)
			}
			if f.proposals.Load() != before {
				t.Fatal("an ended request was proposed")
			}
			// The key is free for a new request id.
			if n, err := acquireReq(context.Background(), s, "A", "k", "r2", 0); err != nil || n.Token <= g.Token || n.Repeated {
				t.Fatalf("new request id: %+v %v", n, err)
			}
		}},
		{name: "another key: invalid_argument", then: func(t *testing.T, s *Service, f *fakeNode, g Grant) {
			_, err := acquireReq(context.Background(), s, "A", "k2", "r1", 0)
			if !errors.Is(err, core.ErrInvalidArgument) || !strings.Contains(err.Error(), `"k"`) {
				t.Fatalf("err = %v, want invalid_argument naming \"k\"", err)
			}
			if l, _ := s.currentLock("k2"); l.Token != 0 {
				t.Fatal("k2 granted")
			}
		}},
		{name: "another identity: its own request", then: func(t *testing.T, s *Service, f *fakeNode, g Grant) {
			if _, err := acquireReq(context.Background(), s, "B", "k", "r1", 0); !errors.Is(err, ErrHeld) {
				t.Fatalf("B with A's request id: %v, want held", err)
			}
			if n, err := acquireReq(context.Background(), s, "B", "k2", "r1", 0); err != nil || n.Repeated {
				t.Fatalf("B on k2: %+v %v", n, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newLeaderV3(t, Config{})
			g, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
			if err != nil || g.Repeated {
				t.Fatalf("first: %+v %v", g, err)
			}
			tc.then(t, s, f, g)
		})
	}
}

func TestAcquireRequestIDNeedsVersion3(t *testing.T) {
	s, f := newLeader(t, Config{}) // version 2
	_, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err = %v, want unsupported", err)
	}
	if f.proposals.Load() != 0 {
		t.Fatal("proposed")
	}
	if _, err := acquireReq(context.Background(), s, "A", "k", "", 0); err != nil {
		t.Fatalf("without request id: %v", err)
	}
}

type reqResult struct {
	g   Grant
	err error
}

func goAcquireReq(ctx context.Context, s *Service, identity, key, requestID string, wait time.Duration) <-chan reqResult {
	c := make(chan reqResult, 1)
	go func() {
		g, err := acquireReq(ctx, s, identity, key, requestID, wait)
		c <- reqResult{g, err}
	}()
	return c
}

func (s *Service) attempts(identity, requestID string) (heirs uint64, inProgress bool) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	a := s.lead.requests[core.RequestKey(identity, requestID)]
	if a == nil {
		return 0, false
	}
	return a.heirs, true
}

// A retry that reaches the leader while the first attempt still waits in
// the queue does not wait a second time: it becomes the heir, gets the
// one grant, and the first attempt (whose requester is gone) answers
// indeterminate.
func TestRequestIDRetryTakesOverTheWait(t *testing.T) {
	s, f := newLeaderV3(t, Config{})
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "first queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	retry := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "retry attached", func() bool {
		heirs, _ := s.attempts("A", "r1")
		return heirs == 1
	})
	s.lead.mu.Lock()
	waiters := s.lead.waiters
	s.lead.mu.Unlock()
	if waiters != 1 {
		t.Fatalf("%d waiters, want 1 (the retry must not wait twice)", waiters)
	}
	before := f.proposals.Load()
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	r := <-retry
	if r.err != nil || r.g.Token == 0 || r.g.Key != "k" {
		t.Fatalf("retry: %+v %v", r.g, r.err)
	}
	if fr := <-first; !errors.Is(fr.err, ErrIndeterminate) {
		t.Fatalf("first attempt: %+v %v, want indeterminate", fr.g, fr.err)
	}
	if got := f.proposals.Load() - before; got != 2 { // the release and one grant
		t.Fatalf("%d proposals, want 2", got)
	}
	if l, _ := s.currentLock("k"); l.Token != r.g.Token {
		t.Fatalf("lock %+v, want token %d", l, r.g.Token)
	}
	if _, busy := s.attempts("A", "r1"); busy {
		t.Fatal("the attempt is still registered")
	}
}

// A first attempt that ends without a grant (its requester's context
// ended) lets its heir start a wait of its own, which is then granted.
func TestRequestIDHeirStartsAfresh(t *testing.T) {
	s, _ := newLeaderV3(t, Config{})
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := goAcquireReq(ctx, s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "first queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	retry := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "retry attached", func() bool {
		heirs, _ := s.attempts("A", "r1")
		return heirs == 1
	})
	cancel()
	if fr := <-first; fr.err == nil {
		t.Fatalf("first attempt granted: %+v", fr.g)
	}
	testkit.Eventually(t, 5*time.Second, "the heir waits on its own", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	if r := <-retry; r.err != nil || r.g.Token <= held.Token {
		t.Fatalf("heir: %+v %v", r.g, r.err)
	}
}

// A heir that gives up before the first attempt ends is answered
// indeterminate and leaves the first attempt free to deliver its grant.
func TestRequestIDHeirGivesUp(t *testing.T) {
	s, _ := newLeaderV3(t, Config{})
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "first queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	ctx, cancel := context.WithCancel(context.Background())
	retry := goAcquireReq(ctx, s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "retry attached", func() bool {
		heirs, _ := s.attempts("A", "r1")
		return heirs == 1
	})
	cancel()
	if r := <-retry; !errors.Is(r.err, ErrIndeterminate) {
		t.Fatalf("heir: %+v %v, want indeterminate", r.g, r.err)
	}
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	if fr := <-first; fr.err != nil || fr.g.Token <= held.Token {
		t.Fatalf("first attempt: %+v %v", fr.g, fr.err)
	}
}

// queuedGrantWithID grants "k" to identity A's request "r1" through the
// queue (so the transport would deliver it watching), and returns it.
func queuedGrantWithID(t *testing.T, s *Service) Grant {
	t.Helper()
	held, err := acquire(s, "H", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	first := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
	testkit.Eventually(t, 5*time.Second, "first queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
		t.Fatal(err)
	}
	r := <-first
	if r.err != nil || !r.g.Queued {
		t.Fatalf("queued grant: %+v %v", r.g, r.err)
	}
	return r.g
}

// A retry that arrives while its queued grant's delivery is watched is
// not answered with the grant until the delivery settles: when the
// delivery turns out lost (the transport releases it), the retry learns
// grant_ended, never a grant that is being taken away.
func TestRequestIDRetryWaitsForDelivery(t *testing.T) {
	s, f := newLeaderV3(t, Config{SettleWindow: time.Minute})
	g := queuedGrantWithID(t, s)
	reads := make(chan struct{}, 8)
	f.readIndex = func() error { reads <- struct{}{}; return nil }
	retry := goAcquireReq(context.Background(), s, "A", "k", "r1", 0)
	<-reads                            // the retry found the record and confirms the leadership
	s.ReleaseUndelivered("k", g.Token) // NATS said nobody received it
	r := <-retry
	var ge *GrantEndedError
	if !errors.As(r.err, &ge) || ge.Token != g.Token {
		t.Fatalf("retry during a lost delivery: %+v %v, want grant_ended with token %d", r.g, r.err, g.Token)
	}
}

// A lost-reply release that applies and settles between the retry's
// View (held) and its look at the settling marks does not make the retry
// answer with the grant it just saw: it looks at the state once more.
func TestRequestIDRetrySeesAReleaseThatSettledAfterItsView(t *testing.T) {
	s, f := newLeaderV3(t, Config{SettleWindow: time.Minute})
	g := queuedGrantWithID(t, s)
	var once sync.Once
	f.readIndex = func() error {
		// Past the retry's confirming ReadIndex: its next View sees the
		// grant held; settle the lost delivery right after that View.
		f.afterView = func() {
			once.Do(func() {
				s.ReleaseUndelivered("k", g.Token)
				testkit.Eventually(t, 5*time.Second, "release settled", func() bool {
					s.lead.mu.Lock()
					defer s.lead.mu.Unlock()
					return len(s.lead.settling) == 0
				})
			})
		}
		return nil
	}
	_, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
	var ge *GrantEndedError
	if !errors.As(err, &ge) || ge.Token != g.Token {
		t.Fatalf("retry after a release that settled behind its View: %v, want grant_ended with token %d", err, g.Token)
	}
}

// Once the delivery window has passed, the retry gets the grant.
func TestRequestIDRetryAfterDeliveryWindow(t *testing.T) {
	s, _ := newLeaderV3(t, Config{SettleWindow: 50 * time.Millisecond})
	g := queuedGrantWithID(t, s)
	r, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
	if err != nil || !r.Repeated || r.Token != g.Token {
		t.Fatalf("retry: %+v %v, want token %d repeated", r, err, g.Token)
	}
	s.lead.mu.Lock()
	n := len(s.lead.settling)
	s.lead.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d settling marks left", n)
	}
}

// A withdrawal with a request id settles the request from the replicated
// records, on a leader that knows nothing of its wait: a held grant is
// released, an ended one reported, none reported as not granted; an
// attempt still in progress here, or another key's record, stays unknown.
func TestWithdrawByRequestID(t *testing.T) {
	ctxA := WithIdentity(context.Background(), "A")
	tests := []struct {
		name  string
		setup func(t *testing.T, s *Service) (key string, want func(g Grant) Withdrawal)
	}{
		{"held: released", func(t *testing.T, s *Service) (string, func(Grant) Withdrawal) {
			return "k", func(g Grant) Withdrawal { return Withdrawal{ReleasedToken: g.Token} }
		}},
		{"ended: reported", func(t *testing.T, s *Service) (string, func(Grant) Withdrawal) {
			return "k", func(g Grant) Withdrawal {
				if err := s.Release(ctxA, "k", g.Token); err != nil {
					t.Fatal(err)
				}
				return Withdrawal{EndedToken: g.Token}
			}
		}},
		{"another key: unknown", func(t *testing.T, s *Service) (string, func(Grant) Withdrawal) {
			return "k2", func(Grant) Withdrawal { return Withdrawal{} }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newLeaderV3(t, Config{})
			g, err := acquireReq(context.Background(), s, "A", "k", "r1", 0)
			if err != nil {
				t.Fatal(err)
			}
			key, want := tc.setup(t, s)
			w := want(g)
			s.OnLeaderReady(2) // a new term: the leader-local wait memory is gone
			got, err := s.Withdraw(ctxA, key, "w-unknown", "r1")
			if err != nil || got != w {
				t.Fatalf("withdraw: %+v %v, want %+v", got, err, w)
			}
			if l, _ := s.currentLock("k"); w.ReleasedToken != 0 && l.Token != 0 {
				t.Fatalf("the request's grant is still held: %+v", l)
			}
		})
	}
	t.Run("never granted", func(t *testing.T) {
		s, _ := newLeaderV3(t, Config{})
		got, err := s.Withdraw(ctxA, "k", "", "r9")
		if err != nil || got != (Withdrawal{NotGranted: true}) {
			t.Fatalf("withdraw: %+v %v", got, err)
		}
		// Another identity's request id names nothing of A's.
		if _, err := acquireReq(context.Background(), s, "B", "k", "r9", 0); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Withdraw(ctxA, "k", "", "r9"); got != (Withdrawal{NotGranted: true}) {
			t.Fatalf("A's withdraw after B's grant: %+v", got)
		}
	})
	t.Run("in progress here: unknown", func(t *testing.T) {
		s, _ := newLeaderV3(t, Config{})
		held, err := acquire(s, "H", "k", 0)
		if err != nil {
			t.Fatal(err)
		}
		first := goAcquireReq(context.Background(), s, "A", "k", "r1", 10*time.Second)
		testkit.Eventually(t, 5*time.Second, "queued", func() bool {
			_, busy := s.attempts("A", "r1")
			return busy
		})
		if got, err := s.Withdraw(ctxA, "k", "", "r1"); err != nil || got != (Withdrawal{}) {
			t.Fatalf("withdraw of an attempt in progress: %+v %v", got, err)
		}
		if err := s.Release(WithIdentity(context.Background(), "H"), "k", held.Token); err != nil {
			t.Fatal(err)
		}
		if r := <-first; r.err != nil {
			t.Fatal(r.err)
		}
	})
}
