package lockservice

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// Fair admission of proposals (issue 21): one identity must not be able to
// take raft's throughput from the others.
//
// The per-identity share of requests in progress (fair.go) bounds how
// many requests an identity has open, not how much of the raft pipeline
// they take: every release or renew is a raft entry, even of a lock long
// gone, and with hundreds of one identity's entries in every Ready,
// another identity's one entry waits behind them all (its latency is the
// flood's: requests in flight over throughput). So while more than one
// identity proposes, the leader keeps at most MaxProposingDefault
// (Config.MaxProposing) proposals in raft at once, counted from when a
// proposal is handed to the node until the node answers it. When more are
// ready, they wait in one FIFO queue per identity, and a place that comes
// free goes to the identities with a proposal waiting in round-robin
// order: deficit round robin by entry count, where every proposal is one
// entry and the quantum is one entry. An identity with one proposal
// waiting is therefore admitted before any other identity's next one,
// within one round of places coming free, however many another identity
// queues; and the Ready it lands in carries at most about MaxProposing
// entries.
//
// The bound holds for ContentionWindowDefault after the identity of the
// client proposals last changed. One identity alone (open mode: everyone
// is the anonymous "") is not bounded once that window has passed, so its
// throughput is what it was without this queue: on a small machine a
// bound low enough to keep another identity's latency near its quiet one
// also halves what one identity with hundreds of requests in flight gets
// through (docs/benchmarks.md, fair admission). When a second identity
// turns up, its first proposal may wait for what the first had in raft to
// drain below the bound; from then on the bound holds.
//
// What waits here was never handed to raft: a proposal enters the queue
// before it is proposed, and once admitted it goes to the node at once.
// A request whose time runs out in the queue is answered ErrTimeout (or
// ErrShuttingDown when the service stops) and nothing was proposed, which
// is a determinate outcome; nothing admitted is ever taken back or
// dropped. So the queue adds no indeterminate outcome: the only ones are
// still those of an entry raft has taken (Node.Propose). Before this
// queue, the same wait happened in the node's proposal channel, whose full
// buffer blocked the proposer until its context ended, with the same
// determinate answer.
//
// The cluster's own proposals (an Expire, the release of a grant whose
// reply was lost or whose wait was withdrawn: contexts without a client
// identity, or with WithNodeAuthority) are counted but never queued, so a
// flood of client requests never holds a lease past its end; they are
// bounded elsewhere (ExpireWorkers, and one release per grant). A Grant
// waits under the identity of its acquire, for at most the acquire's
// deadline.
//
// What the queue holds is bounded without a limit of its own: every
// queued client proposal is a request in progress (BeginRequest's
// per-identity share and the transport's node budget bound them) or the
// Grant of a waiter whose turn came (the waiter limits bound them).
//
// A proposal whose requester gives up after raft took it (its context
// ended: ErrIndeterminate) stops counting then, while its entry may still
// be in raft; the transport gives requests seconds, so such entries are
// few and short-lived.

// MaxProposingDefault is how many proposals the leader keeps in raft at
// once while more than one identity proposes (Config.MaxProposing). A
// Ready then carries at most about this many entries, which bounds how
// long one identity's proposal waits behind another's. Measured on a
// shared 2-core box with fsync on (daemon TestProposalFloodIsolated,
// docs/benchmarks.md): at 32, another identity's p50 was 3-5 ms against
// the flooding identity's 50-250 ms, its p99 0.2-0.3 of the flooder's mean
// latency on a loaded box (at 64: 0.5-1; unbounded: 3-4).
const MaxProposingDefault = 32

// ContentionWindowDefault is how long MaxProposing holds after the
// proposing client identity last changed (Config.ContentionWindow).
const ContentionWindowDefault = 2 * time.Second

// admission is the leader's proposals in raft and the queue of those
// waiting to enter (the file comment).
type admission struct {
	limit  int
	window time.Duration // ContentionWindowDefault
	// leaveFn is leave as a func value, made once: a method value
	// allocates each time it is taken, and every proposal returns it.
	leaveFn func()
	mu      sync.Mutex // guards the fields below
	// last is the identity of the latest client proposal (seen: there was
	// one); sharedUntil is until when the limit applies, the window after
	// the latest change of identity.
	last        string
	seen        bool
	sharedUntil time.Time
	// proposing counts admitted proposals not yet answered by the node.
	proposing int
	// waiting counts the proposals queued in by.
	waiting int
	// by holds the queue of each identity with a proposal waiting.
	by map[string]*identityQueue
	// turns is the round-robin order of the identities in by: the front
	// is served next, then moved to the back if it still has proposals
	// waiting.
	turns list.List
}

// identityQueue is one identity's proposals waiting, in arrival order.
type identityQueue struct {
	identity string
	tickets  list.List // of *ticket
	turn     *list.Element
}

// ticket is one queued proposal; ready closes when it is admitted.
type ticket struct {
	ready    chan struct{}
	q        *identityQueue
	elem     *list.Element // in q.tickets while queued
	admitted bool          // set under admission.mu before ready closes
}

func newAdmission(limit int, window time.Duration) *admission {
	a := &admission{limit: limit, window: window, by: make(map[string]*identityQueue)}
	a.leaveFn = a.leave
	return a
}

// proposalClass says whose turn a proposal of ctx waits for: the client
// identity the transport put in ctx, or (system) the cluster's own.
func proposalClass(ctx context.Context) (identity string, system bool) {
	identity, client := ctx.Value(identityKey{}).(string)
	return identity, !client || nodeAuthority(ctx)
}

// admitProposal waits for a place in raft for a proposal of ctx (its
// class: proposalClass) and returns the function that gives it back,
// which the caller calls once, when the node has answered the proposal. A
// context that ends first is ErrTimeout (ErrShuttingDown when the
// service stops), and nothing was proposed.
func (s *Service) admitProposal(ctx context.Context) (leave func(), err error) {
	identity, system := proposalClass(ctx)
	t := s.admission.enter(identity, system, s.cfg.Now())
	if t == nil {
		return s.admission.leaveFn, nil
	}
	return s.awaitAdmission(ctx, t, identity)
}

// awaitAdmission waits for the queued ticket t of identity's proposal
// (admitProposal's second half).
func (s *Service) awaitAdmission(ctx context.Context, t *ticket, identity string) (leave func(), err error) {
	a := s.admission
	s.cfg.Metrics.ProposalQueue.Inc()
	err = a.await(ctx, t)
	s.cfg.Metrics.ProposalQueue.Dec()
	if err != nil {
		if s.ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrShuttingDown, err)
		}
		return nil, fmt.Errorf("%w: waited for a place in raft (the node keeps %d proposals in it at once; identity %q waited its turn behind others'); nothing was proposed: %w",
			ErrTimeout, a.limit, identity, err)
	}
	return a.leaveFn, nil
}

// enter admits a proposal at once (nil ticket) when it is the cluster's
// own, or nobody waits and there is room (or one identity has been alone
// for the contention window); otherwise it queues a ticket at the back of
// identity's queue.
func (a *admission) enter(identity string, system bool, now time.Time) *ticket {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !system && (identity != a.last || !a.seen) {
		if a.seen {
			a.sharedUntil = now.Add(a.window)
		}
		a.last, a.seen = identity, true
	}
	alone := !now.Before(a.sharedUntil)
	if system || (a.waiting == 0 && (a.proposing < a.limit || alone)) {
		a.proposing++
		return nil
	}
	q := a.by[identity]
	if q == nil {
		q = &identityQueue{identity: identity}
		a.by[identity] = q
		q.turn = a.turns.PushBack(q)
	}
	t := &ticket{ready: make(chan struct{}), q: q}
	t.elem = q.tickets.PushBack(t)
	a.waiting++
	return t
}

// await waits until t is admitted or ctx ends; in the second case t
// leaves its queue, or, admitted meanwhile, gives its place on.
func (a *admission) await(ctx context.Context, t *ticket) error {
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.admitted {
		// Admitted just as the context ended: nothing is proposed, so
		// the place goes to the next in turn.
		a.proposing--
		a.serve()
		return ctx.Err()
	}
	a.dequeue(t)
	return ctx.Err()
}

// leave gives back an admitted proposal's place and hands the free places
// on to the proposals waiting.
func (a *admission) leave() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.proposing--
	a.serve()
}

// serve admits waiting proposals while there is room, one per identity
// in turn: the identity at the front of turns gets the place, then goes
// to the back if it has more waiting. The caller holds mu.
func (a *admission) serve() {
	for a.proposing < a.limit && a.waiting > 0 {
		q := a.turns.Front().Value.(*identityQueue)
		t := q.tickets.Front().Value.(*ticket)
		a.dequeue(t)
		if q.tickets.Len() > 0 {
			a.turns.MoveToBack(q.turn)
		}
		a.proposing++
		t.admitted = true
		close(t.ready)
	}
}

// dequeue takes t out of its queue, and its identity out of turns when
// that was its last. The caller holds mu.
func (a *admission) dequeue(t *ticket) {
	q := t.q
	q.tickets.Remove(t.elem)
	a.waiting--
	if q.tickets.Len() == 0 {
		a.turns.Remove(q.turn)
		delete(a.by, q.identity)
	}
}

// proposeGrant proposes a Grant of identity's acquire: admitted in
// identity's turn before deadline, then bound to the service's lifetime
// only (grant says why).
func (s *Service) proposeGrant(cmd core.Command, deadline time.Time, identity string) (raftstore.Applied, error) {
	// The class admitProposal would take from WithIdentity(s.ctx,
	// identity): a client's (the service's context never carries node
	// authority). Only a proposal that has to queue needs the deadline's
	// context; most enter at once, without a context, its timer or the
	// identity value (issue 26 item 4: per-grant allocations).
	t := s.admission.enter(identity, false, s.cfg.Now())
	leave := s.admission.leaveFn
	if t != nil {
		actx, cancel := context.WithDeadline(s.ctx, deadline)
		l, err := s.awaitAdmission(actx, t, identity)
		cancel()
		if err != nil {
			return raftstore.Applied{}, err
		}
		leave = l
	}
	defer leave()
	return s.proposeAdmitted(s.ctx, cmd)
}
