package raftstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"

	"github.com/ticketd/ticketd/core"
)

type proposalResult struct {
	applied Applied
	err     error
}

type readResult struct {
	index uint64
	err   error
}

type indexWaiter struct {
	index uint64
	ch    chan struct{}
}

// waiting holds the callers blocked until the Ready loop answers them:
// proposers waiting for their entry to apply, ReadIndex callers waiting for
// their read state, and WaitApplied callers waiting for an applied index.
type waiting struct {
	mu        sync.Mutex                     // guards the fields below
	proposals map[uint64]chan proposalResult // by request id
	// stepped are the proposals the loop has handed to raft; the others
	// are still queued for it (or being queued), never seen by raft.
	stepped      map[uint64]struct{}
	reads        map[string]chan readResult // by ReadIndex request context
	indexWaiters []indexWaiter
}

// Propose proposes one lock command and waits until it is applied.
//
// ErrNotLeader means it was certainly not proposed. Once raft has accepted
// it, any failure to learn the result (ctx done, leadership lost, stop) is
// ErrIndeterminate: the entry may still commit.
func (n *Node) Propose(ctx context.Context, cmd core.Command) (Applied, error) {
	if err := cmd.Validate(); err != nil {
		return Applied{}, err
	}
	if !n.isLeader.Load() {
		return Applied{}, ErrNotLeader
	}
	id := n.nextRequestID()
	ch := n.waiting.addProposal(id)
	data := core.EncodeEntry(core.Entry{RequestID: id, Command: cmd})
	// Until the loop has the entry queued, nothing was proposed; from then
	// on raft may take it, and only the loop's answer (or ErrNotLeader for
	// a proposal raft dropped) says what happened.
	notQueued := func(err error) (Applied, error) {
		n.waiting.dropProposal(id)
		return Applied{}, err
	}
	select {
	case <-n.donec:
		return notQueued(ErrStopped)
	default:
	}
	if err := ctx.Err(); err != nil {
		return notQueued(fmt.Errorf("raftstore: propose: %w", err))
	}
	select {
	case n.propc <- queuedProposal{id: id, data: data}:
	case <-ctx.Done():
		return notQueued(fmt.Errorf("raftstore: propose: %w", ctx.Err()))
	case <-n.donec:
		return notQueued(ErrStopped)
	}
	select {
	case r := <-ch:
		return r.applied, r.err
	case <-ctx.Done():
		n.waiting.dropProposal(id)
		return Applied{}, fmt.Errorf("%w: %w", ErrIndeterminate, ctx.Err())
	case <-n.donec:
		// The loop is gone: it may have proposed the entry before it
		// stopped, and the answer may already be here.
		n.waiting.dropProposal(id)
		select {
		case r := <-ch:
			return r.applied, r.err
		default:
			return Applied{}, fmt.Errorf("%w: %w", ErrIndeterminate, ErrStopped)
		}
	}
}

// WaitApplied waits until the applied index reaches index.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	if n.applied.Load() >= index {
		return nil
	}
	ch, reached := n.waiting.addIndexWaiter(index, &n.applied)
	if reached {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		// A waiter nobody waits on would stay queued until the index is
		// applied, which on a stuck node is never.
		n.waiting.dropIndexWaiter(ch)
		return fmt.Errorf("raftstore: wait applied %d: %w", index, ctx.Err())
	case <-n.stopc:
		return ErrStopped
	}
}

func (n *Node) nextRequestID() uint64 { return n.reqBase + n.reqSeq.Add(1) }

// pendingProposals are the ids of the proposals waiting for their result.
func (w *waiting) pendingProposals() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]uint64, 0, len(w.proposals))
	for id := range w.proposals {
		ids = append(ids, id)
	}
	return ids
}

// anyPending says whether any of ids still waits for its result.
func (w *waiting) anyPending(ids []uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if _, ok := w.proposals[id]; ok {
			return true
		}
	}
	return false
}

func (w *waiting) addProposal(id uint64) chan proposalResult {
	ch := make(chan proposalResult, 1)
	w.mu.Lock()
	w.proposals[id] = ch
	w.mu.Unlock()
	return ch
}

func (w *waiting) dropProposal(id uint64) {
	w.mu.Lock()
	delete(w.proposals, id)
	delete(w.stepped, id)
	w.mu.Unlock()
}

// markStepped records that raft took the proposals ids.
func (w *waiting) markStepped(ids []uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if _, ok := w.proposals[id]; ok {
			w.stepped[id] = struct{}{}
		}
	}
}

func (w *waiting) addRead(key string) chan readResult {
	ch := make(chan readResult, 1)
	w.mu.Lock()
	w.reads[key] = ch
	w.mu.Unlock()
	return ch
}

func (w *waiting) dropRead(key string) {
	w.mu.Lock()
	delete(w.reads, key)
	w.mu.Unlock()
}

// addIndexWaiter queues a wait for index, unless applied already reached
// it. applied is checked again under mu: the Ready loop stores a new
// applied index before it takes mu to release waiters, so a waiter is
// either queued in time for that release or sees the new index here.
func (w *waiting) addIndexWaiter(index uint64, applied *atomic.Uint64) (ch chan struct{}, reached bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if applied.Load() >= index {
		return nil, true
	}
	ch = make(chan struct{})
	w.indexWaiters = append(w.indexWaiters, indexWaiter{index: index, ch: ch})
	return ch, false
}

// dropIndexWaiter removes the waiter whose channel is ch, if still queued.
func (w *waiting) dropIndexWaiter(ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.indexWaiters = slices.DeleteFunc(w.indexWaiters, func(iw indexWaiter) bool { return iw.ch == ch })
}

// completeProposals answers the proposals a Ready's applied events came
// from (requestIDs[i] is the proposal of events[i]; deliverApplied says
// when).
func (w *waiting) completeProposals(events []Applied, requestIDs []uint64) {
	if len(requestIDs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, id := range requestIDs {
		if ch, ok := w.proposals[id]; ok {
			delete(w.proposals, id)
			delete(w.stepped, id)
			ch <- proposalResult{applied: events[i]}
		}
	}
}

// complete answers, after a Ready is durable, the reads of its read states
// and the index waiters that applied now reaches.
func (w *waiting) complete(readStates []raft.ReadState, applied uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, rs := range readStates {
		if ch, ok := w.reads[string(rs.RequestCtx)]; ok {
			delete(w.reads, string(rs.RequestCtx))
			ch <- readResult{index: rs.Index}
		}
	}
	kept := w.indexWaiters[:0]
	for _, iw := range w.indexWaiters {
		if iw.index <= applied {
			close(iw.ch)
		} else {
			kept = append(kept, iw)
		}
	}
	w.indexWaiters = kept
}

// failProposals ends the waiting proposals ids with err.
func (w *waiting) failProposals(ids []uint64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		if ch, ok := w.proposals[id]; ok {
			delete(w.proposals, id)
			delete(w.stepped, id)
			ch <- proposalResult{err: err}
		}
	}
}

// failLostLeadership ends the proposals raft took with err, and every
// waiting read with ErrNotLeader, when this node stops leading. Proposals
// still queued for the loop stay: raft never saw them, and the loop
// answers them ErrNotLeader when it takes them (a follower's raft drops
// proposals), unless this node leads again by then and proposes them.
func (w *waiting) failLostLeadership(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.stepped {
		delete(w.stepped, id)
		if ch, ok := w.proposals[id]; ok {
			delete(w.proposals, id)
			ch <- proposalResult{err: err}
		}
	}
	w.failReads()
}

// failReads ends every waiting read with ErrNotLeader (raft drops the
// pending reads of a node that stops leading). The caller holds w.mu.
func (w *waiting) failReads() {
	for key, ch := range w.reads {
		delete(w.reads, key)
		ch <- readResult{err: ErrNotLeader}
	}
}

// failAll ends every waiting proposal with err and every waiting read with
// ErrNotLeader (raft drops pending reads of a deposed leader). Index
// waiters are left alone: they end with their context or Stop.
func (w *waiting) failAll(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, ch := range w.proposals {
		delete(w.proposals, id)
		ch <- proposalResult{err: err}
	}
	clear(w.stepped)
	w.failReads()
}
