package lockservice

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// kindReq is an acquire of one kind with a request id.
type kindReq struct {
	key   string
	limit uint32
	mode  core.Mode
}

func (k kindReq) acquire(ctx context.Context, s *Service, requestID string, wait time.Duration) (Grant, error) {
	return s.Acquire(WithIdentity(ctx, "A"), AcquireParams{Key: k.key, Lease: time.Minute, Wait: wait, Timeout: wait + 5*time.Second,
		RequestID: requestID, Limit: k.limit, Mode: k.mode})
}

var (
	mutexK  = kindReq{key: "k"}
	sem3K   = kindReq{key: "k", limit: 3}
	sem2K   = kindReq{key: "k", limit: 2}
	sharedK = kindReq{key: "k", mode: core.ModeShared}
	mutexK2 = kindReq{key: "k2"}
)

// newLeaderV5 is newLeader at cluster version 5 (kinds), with a real clock.
func newLeaderV5(t *testing.T, cfg Config) (*Service, *fakeNode) {
	t.Helper()
	s, f := newLeader(t, cfg)
	f.m.Apply(core.SetClusterVersion(5))
	return s, f
}

// holdersOf is every holder of key, in token order.
func holdersOf(f *fakeNode, key string) []core.Lock {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.Holders(key)
}

// wantMismatch checks err is the refusal of a retry that asks for
// something else than its request: invalid_argument, a
// RequestMismatchError, a message naming what the request was made for.
func wantMismatch(t *testing.T, err error, mentions ...string) {
	t.Helper()
	var me *RequestMismatchError
	if !errors.Is(err, core.ErrInvalidArgument) || !errors.As(err, &me) {
		t.Fatalf("err = %v, want invalid_argument (RequestMismatchError)", err)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("err = %v, want it to mention %q", err, m)
		}
	}
}

// A retry whose request id is known is answered with the original grant
// only when it asks for the same key and kind; another limit, another
// mode or another key is refused with invalid_argument and changes
// nothing (no proposal, the grant and the queue as they were), whether
// the request's grant is held or its first attempt still waits in the
// queue. An ended grant's record keeps no kind: grant_ended answers any.
func TestRequestIDRetryOfAnotherKind(t *testing.T) {
	tests := []struct {
		name         string
		first, retry kindReq
		// waiting: the first attempt waits in the queue (the key is held
		// by another identity) when the retry arrives; ended: its grant
		// was released first.
		waiting, ended bool
		// mentions are in the refusal; none: the retry is answered.
		mentions []string
	}{
		{name: "held, same kind: the grant", first: sem3K, retry: sem3K},
		{name: "held, mutex as limit 1: the grant", first: mutexK, retry: kindReq{key: "k", limit: 1}},
		{name: "held, shared: the grant", first: sharedK, retry: sharedK},
		{name: "held, other limit", first: sem3K, retry: sem2K, mentions: []string{"semaphore of limit 3", "semaphore of limit 2", `"k"`}},
		{name: "held, semaphore retried as mutex", first: sem3K, retry: mutexK, mentions: []string{"semaphore of limit 3", "a mutex"}},
		{name: "held, mutex retried as semaphore", first: mutexK, retry: sem3K, mentions: []string{"a mutex", "semaphore of limit 3"}},
		{name: "held, shared retried exclusive", first: sharedK, retry: mutexK, mentions: []string{"a shared hold", "a mutex"}},
		{name: "held, exclusive retried shared", first: mutexK, retry: sharedK, mentions: []string{"a mutex", "a shared hold"}},
		{name: "held, other key", first: mutexK, retry: mutexK2, mentions: []string{`"k"`, `"k2"`}},
		{name: "ended, same kind: grant_ended", first: sem3K, retry: sem3K, ended: true},
		{name: "ended, other kind: grant_ended (no kind recorded)", first: sem3K, retry: mutexK, ended: true},
		{name: "ended, other key", first: mutexK, retry: mutexK2, ended: true, mentions: []string{"another key", `"k2"`}},
		{name: "waiting, same kind: takes over the wait", first: sharedK, retry: sharedK, waiting: true},
		{name: "waiting, other mode", first: mutexK, retry: sharedK, waiting: true, mentions: []string{"in progress", "a mutex", "a shared hold"}},
		{name: "waiting, other limit", first: sem3K, retry: sem2K, waiting: true, mentions: []string{"in progress", "semaphore of limit 3", "semaphore of limit 2"}},
		{name: "waiting, other key", first: mutexK, retry: mutexK2, waiting: true, mentions: []string{"in progress", `"k"`, `"k2"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newLeaderV5(t, Config{})
			var first Grant
			var firstDone <-chan reqResult
			var blocker Grant
			if tc.waiting {
				// Another identity fills "k" (every slot of a semaphore
				// of the first's limit, else the exclusive lock): the
				// first attempt queues.
				for range max(1, tc.first.limit) {
					var err error
					if blocker, err = kindAcquire(s, "H", "k", tc.first.limit, core.ModeExclusive, time.Minute, 0); err != nil {
						t.Fatal(err)
					}
				}
				c := make(chan reqResult, 1)
				go func() {
					g, err := tc.first.acquire(context.Background(), s, "r1", 10*time.Second)
					c <- reqResult{g, err}
				}()
				firstDone = c
				testkit.Eventually(t, 5*time.Second, "first queued", func() bool { return s.Waiting("k") == 1 })
			} else {
				var err error
				if first, err = tc.first.acquire(context.Background(), s, "r1", 0); err != nil || first.Repeated {
					t.Fatalf("first: %+v %v", first, err)
				}
				if tc.ended {
					if err := s.Release(as("A"), first.Key, first.Token); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := f.proposals.Load()
			holders := holdersOf(f, "k")

			if tc.waiting && tc.mentions == nil {
				// Same kind: the retry becomes the heir and gets the grant.
				retry := make(chan reqResult, 1)
				go func() {
					g, err := tc.retry.acquire(context.Background(), s, "r1", 10*time.Second)
					retry <- reqResult{g, err}
				}()
				testkit.Eventually(t, 5*time.Second, "retry attached", func() bool {
					heirs, _ := s.attempts("A", "r1")
					return heirs == 1
				})
				if err := s.Release(as("H"), "k", blocker.Token); err != nil {
					t.Fatal(err)
				}
				r := <-retry
				if r.err != nil || r.g.Key != "k" || r.g.Limit != tc.first.limit || r.g.Mode != tc.first.mode {
					t.Fatalf("heir: %+v %v", r.g, r.err)
				}
				if fr := <-firstDone; !errors.Is(fr.err, ErrIndeterminate) {
					t.Fatalf("first attempt: %+v %v, want indeterminate", fr.g, fr.err)
				}
				return
			}

			g, err := tc.retry.acquire(context.Background(), s, "r1", 0)
			switch {
			case tc.mentions != nil:
				wantMismatch(t, err, tc.mentions...)
			case tc.ended:
				var ge *GrantEndedError
				if !errors.As(err, &ge) || ge.Token != first.Token {
					t.Fatalf("err = %v, want grant_ended with token %d", err, first.Token)
				}
			default:
				if err != nil || !g.Repeated || g.Token != first.Token || g.Limit != tc.first.limit || g.Mode != tc.first.mode {
					t.Fatalf("retry: %+v %v, want the first grant %+v", g, err, first)
				}
			}
			// Changed nothing.
			if got := f.proposals.Load(); got != before {
				t.Fatalf("%d proposals by the retry, want none", got-before)
			}
			if got := holdersOf(f, "k"); len(got) != len(holders) || len(got) > 0 && got[0].Token != holders[0].Token {
				t.Fatalf("holders of k: %+v, were %+v", got, holders)
			}
			if got := holdersOf(f, "k2"); len(got) != 0 {
				t.Fatalf("k2 granted: %+v", got)
			}
			if !tc.waiting {
				return
			}
			// The refused retry did not attach: the first attempt still
			// waits, alone, and is granted its own kind.
			if heirs, busy := s.attempts("A", "r1"); heirs != 0 || !busy || s.Waiting("k") != 1 {
				t.Fatalf("after the refused retry: %d heirs, in progress %v, %d waiting; want 0, true, 1", heirs, busy, s.Waiting("k"))
			}
			if err := s.Release(as("H"), "k", blocker.Token); err != nil {
				t.Fatal(err)
			}
			fr := <-firstDone
			if fr.err != nil || fr.g.Key != tc.first.key || fr.g.Limit != tc.first.limit || fr.g.Mode != tc.first.mode {
				t.Fatalf("first attempt: %+v %v", fr.g, fr.err)
			}
		})
	}
}

// The race the lookup cannot see: the request's first attempt is granted
// (as through another leader) after this leader's lookup found nothing
// and admitted the retry, before the retry's Grant applies. Apply
// compares only the key and answers GrantRepeated; the leader refuses
// another kind from the held lock, and grants nothing more.
func TestRequestIDRepeatedAtApplyOfAnotherKind(t *testing.T) {
	for _, tc := range []struct {
		name         string
		raced, retry kindReq
	}{
		{name: "same kind", raced: sem3K, retry: sem3K},
		{name: "semaphore retried as mutex", raced: sem3K, retry: mutexK},
		{name: "shared retried exclusive", raced: sharedK, retry: mutexK},
		{name: "exclusive retried shared", raced: mutexK, retry: sharedK},
		{name: "mutex retried as semaphore", raced: mutexK, retry: sem2K},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newLeaderV5(t, Config{})
			raced := core.Grant("k", "other", 60_000, 1).WithKind(tc.raced.limit, tc.raced.mode)
			raced.Identity, raced.RequestID = "A", "r1"
			once := false
			f.beforePropose = func(cmd core.Command) {
				if cmd.Kind == core.KindGrant && cmd.RequestID == "r1" && !once {
					once = true
					if a, err := f.Propose(context.Background(), raced); err != nil || a.Result.Kind != core.ResultGranted {
						t.Errorf("raced grant: %+v %v", a.Result, err)
					}
				}
			}
			g, err := tc.retry.acquire(context.Background(), s, "r1", 0)
			if !once {
				t.Fatal("the retry proposed no Grant: no race")
			}
			holders := holdersOf(f, "k")
			if len(holders) != 1 || holders[0].Limit != tc.raced.limit || holders[0].Mode != tc.raced.mode {
				t.Fatalf("holders %+v, want the raced grant alone", holders)
			}
			if tc.raced == tc.retry {
				if err != nil || !g.Repeated || g.Token != holders[0].Token || g.Limit != tc.raced.limit || g.Mode != tc.raced.mode {
					t.Fatalf("retry: %+v %v, want the raced grant", g, err)
				}
				return
			}
			wantMismatch(t, err, "was granted", kindText(tc.raced.limit, tc.raced.mode), kindText(tc.retry.limit, tc.retry.mode))
		})
	}
}
