package lockservice

import (
	"context"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Withdrawing a wait (SPEC §4.4, for a requester that gives up but is
// still connected): an acquire may carry a wait id; its requester can then
// take it out of the key's queue, or, if its Grant raced the withdrawal,
// have that grant released with its exact token instead of left to expire.
//
// A wait is named by (key, identity, wait id): the identity is the one the
// transport authenticated, so one client cannot withdraw another's wait.
// All of it is leader state: a withdrawal that reaches a new leader finds
// nothing (the old leader's queue is gone, and a grant it made expires
// within its lease), unless it names the acquire's request id: the
// replicated request records then settle it (requests.go).

// Bounds of the recent-grant memory.
const (
	// RecentGrantTTL is how long the grant of an acquire with a wait id
	// can still be withdrawn (released) after it was made: long enough
	// for a requester that gave up just as it was granted to send its
	// withdrawal, short enough that a client which did receive the grant
	// does not have it released later by a stray withdrawal.
	RecentGrantTTL = 5 * time.Second
	// MaxRecentGrants bounds the grants remembered for withdrawal, over
	// every key; the oldest is forgotten first (its lock then expires with
	// its lease if it was lost).
	MaxRecentGrants = 4096
)

// waitRef names one acquire with a wait id.
type waitRef struct {
	key, identity, waitID string
}

// recentGrants remembers the tokens of grants made to acquires with a wait
// id, for RecentGrantTTL, at most MaxRecentGrants (FIFO).
type recentGrants struct {
	byRef map[waitRef]recentGrant
	order []recentEntry
	seq   uint64
}

type recentGrant struct {
	token uint64
	at    time.Time
	seq   uint64
}

type recentEntry struct {
	ref waitRef
	seq uint64
}

// add remembers ref's grant, forgetting expired and surplus entries.
func (r *recentGrants) add(ref waitRef, token uint64, now time.Time) {
	if r.byRef == nil {
		r.byRef = make(map[waitRef]recentGrant)
	}
	for len(r.order) > 0 && (len(r.order) >= MaxRecentGrants || now.Sub(r.byRef[r.order[0].ref].at) > RecentGrantTTL) {
		r.forget(r.order[0])
		r.order = r.order[1:]
	}
	r.seq++
	r.byRef[ref] = recentGrant{token: token, at: now, seq: r.seq}
	r.order = append(r.order, recentEntry{ref: ref, seq: r.seq})
}

// forget drops e's grant unless ref was remembered again since.
func (r *recentGrants) forget(e recentEntry) {
	if g, ok := r.byRef[e.ref]; ok && g.seq == e.seq {
		delete(r.byRef, e.ref)
	}
}

// take returns and forgets ref's grant if it is recent.
func (r *recentGrants) take(ref waitRef, now time.Time) (uint64, bool) {
	g, ok := r.byRef[ref]
	if !ok {
		return 0, false
	}
	delete(r.byRef, ref)
	return g.token, now.Sub(g.at) <= RecentGrantTTL
}

// Withdrawal is what a withdrawal found.
type Withdrawal struct {
	// Withdrawn: the wait was queued (or its Grant not yet proposed) and
	// is gone; nothing was granted.
	Withdrawn bool
	// ReleasedToken: the wait had been granted this token, and that grant
	// is released (or was already gone).
	ReleasedToken uint64
	// EndedToken: (request id) the request's grant had this token and
	// has ended.
	EndedToken uint64
	// NotGranted: (request id) the applied state records no grant of the
	// request and no attempt of it is in progress on this leader.
	NotGranted bool
}

// trackWait registers w under ref when the request has a wait id.
// s.lead.mu held.
func (s *Service) trackWait(ref waitRef, w *waiter) *waiter {
	w.done = make(chan struct{})
	if ref.waitID != "" {
		w.ref = ref
		s.lead.waits[ref] = w
	}
	return w
}

// unlessWithdrawn gives up a turn that a withdrawal overtook before the
// Grant was proposed: the key goes to the next waiter.
func (s *Service) unlessWithdrawn(w *waiter) error {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !w.withdrawn {
		return nil
	}
	s.unreserveKind(w.ref.key, w.limit, w.mode, w.epoch, w.identity)
	return fmt.Errorf("%w: the wait for %q was withdrawn", ErrTimeout, w.ref.key)
}

// endWait finishes an acquire: a grant to a withdrawn wait is released at
// once with its exact token (and not returned); one to a wait id is
// remembered for late withdrawals.
func (s *Service) endWait(w *waiter, g Grant, err error) (Grant, error) {
	defer close(w.done)
	s.lead.mu.Lock()
	if w.ref.waitID != "" && s.lead.waits[w.ref] == w {
		delete(s.lead.waits, w.ref)
	}
	withdrawn := w.withdrawn
	if err == nil && !withdrawn && w.ref.waitID != "" {
		s.lead.recent.add(w.ref, g.Token, s.cfg.Now())
	}
	s.lead.mu.Unlock()
	if err != nil || !withdrawn {
		return g, err
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
	defer cancel()
	// Read by Withdraw after done closes.
	w.token = g.Token
	if _, rerr := s.propose(ctx, core.Release(g.Key, g.Token)); rerr != nil {
		s.log.Warn("release of a withdrawn wait's grant failed; it will expire with its lease", "key", g.Key, "token", g.Token, "err", rerr)
	} else {
		w.released = true
	}
	return Grant{}, fmt.Errorf("%w: the wait for %q was withdrawn; its grant (token %d) is released", ErrTimeout, g.Key, g.Token)
}

// Withdraw takes the caller's wait waitID on key out of the queue, or
// releases its grant if it was granted within RecentGrantTTL. It finds
// only the caller's own waits (identity from ctx). Neither found: with a
// request id, what the replicated request records say (withdrawRequest);
// without, the zero Withdrawal.
//
// From cluster version 6, a withdrawal by wait id that also names the
// request id settles the request after taking the wait out (a Settle,
// settleRequest): another attempt of the same request still in the
// network cannot be granted later. A grant that Settle releases (an
// attempt that won meanwhile) is reported as ReleasedToken.
func (s *Service) Withdraw(ctx context.Context, key, waitID, requestID string) (Withdrawal, error) {
	w, byRequest, err := s.withdraw(ctx, key, waitID, requestID)
	if err != nil || byRequest || waitID == "" || requestID == "" || s.node.ClusterVersion() < 6 {
		return w, err
	}
	sw, err := s.settleRequest(ctx, key, IdentityFrom(ctx), requestID)
	if err != nil {
		return Withdrawal{}, fmt.Errorf("%w: the wait is withdrawn but its request is not settled: %w", ErrIndeterminate, err)
	}
	if w.ReleasedToken == 0 {
		w.ReleasedToken = sw.ReleasedToken
	}
	return w, nil
}

// withdraw is Withdraw's wait part: the wait, a recent grant of it, or
// else the request (withdrawRequest: byRequest).
func (s *Service) withdraw(ctx context.Context, key, waitID, requestID string) (_ Withdrawal, byRequest bool, _ error) {
	if err := core.ValidateKey(key); err != nil {
		return Withdrawal{}, false, err
	}
	// Withdrawing is part of acquiring.
	if err := s.authorize(ctx, OpAcquire, key); err != nil {
		return Withdrawal{}, false, err
	}
	ref := waitRef{key: key, identity: IdentityFrom(ctx), waitID: waitID}
	s.lead.mu.Lock()
	if !s.lead.ready {
		s.lead.mu.Unlock()
		return Withdrawal{}, false, s.notLeader()
	}
	if w := s.lead.waits[ref]; w != nil && waitID != "" {
		wd, err := s.withdrawWait(ctx, w)
		return wd, false, err
	}
	token, recent := s.lead.recent.take(ref, s.cfg.Now())
	s.lead.mu.Unlock()
	if (!recent || waitID == "") && requestID != "" {
		wd, err := s.withdrawRequest(ctx, key, requestID)
		return wd, true, err
	}
	if !recent || waitID == "" {
		return Withdrawal{}, false, nil
	}
	a, err := s.propose(ctx, core.Release(key, token))
	if err != nil {
		return Withdrawal{}, false, err
	}
	s.log.Info("released the grant of a withdrawn wait", "key", key, "token", token, "result", a.Result.String())
	return Withdrawal{ReleasedToken: token}, false, nil
}

// withdrawWait withdraws a wait still in progress. s.lead.mu held; it
// unlocks it.
func (s *Service) withdrawWait(ctx context.Context, w *waiter) (Withdrawal, error) {
	w.withdrawn = true
	if w.elem != nil {
		// Still queued: nothing was reserved for it.
		q := s.lead.queues[w.ref.key]
		q.remove(w)
		s.unqueued(w)
		// A waiter behind it may fit now (a reader behind a withdrawn
		// writer); handOff drops the queue when it is empty.
		s.handOff(w.ref.key)
		delete(s.lead.waits, w.ref)
		close(w.gone)
		s.lead.mu.Unlock()
		return Withdrawal{Withdrawn: true}, nil
	}
	// Its Grant may be in flight: endWait releases it, and we report it.
	s.lead.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
		return Withdrawal{}, fmt.Errorf("%w: the withdrawn wait's grant is still in flight; it will be released: %w", ErrIndeterminate, ctx.Err())
	}
	switch {
	case w.released:
		return Withdrawal{ReleasedToken: w.token}, nil
	case w.token != 0:
		return Withdrawal{}, fmt.Errorf("%w: the withdrawn wait was granted token %d, whose release failed; it expires within its lease", ErrIndeterminate, w.token)
	}
	return Withdrawal{Withdrawn: true}, nil
}

// resetWaits forgets every wait and recent grant (leadership changed).
// s.lead.mu held.
func (s *Service) resetWaits() {
	s.lead.waits = make(map[waitRef]*waiter)
	s.lead.recent = recentGrants{}
}
