package raftstore

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The node loop drives a raft.RawNode itself instead of running raft.Node,
// which puts raft on a goroutine of its own: there, every proposal is a
// round trip between the proposer and raft's goroutine (the proposer waits
// for raft to take the entry), every Ready and Advance a hand-off between
// raft's goroutine and this loop, and every received message another. On a
// small machine under load those wake-ups were a fifth of a node's CPU.
// Here other goroutines only queue work in buffered channels (a send to a
// loop that is busy wakes no one), and the loop takes everything queued
// before it asks raft for the next Ready, so one Ready and one fsync carry
// every proposal that arrived during the previous one, as one MsgProp.
//
// The Ready contract is raft.Node's, unchanged: the loop is the only
// goroutine that touches the RawNode, it handles a Ready (handleReady) and
// calls Advance before it steps anything else into raft, and it asks for a
// Ready only when HasReady says there is one.

// Bounds of the loop's queues. A full queue blocks the sender (with its
// context), which is the back-pressure raft.Node's unbuffered channels gave:
// a peer's read loop stops reading its connection, a proposer waits.
const (
	maxQueuedProposals = 1024
	maxQueuedMessages  = 1024
	maxQueuedCalls     = 64
)

// queuedProposal is an encoded entry waiting for the loop to propose it;
// id is the request id its caller waits on.
type queuedProposal struct {
	id   uint64
	data []byte
}

// run is the node loop: tick, take queued proposals, messages and calls,
// handle a Ready and Advance, or stop.
func (n *Node) run() {
	defer close(n.donec)
	defer func() {
		// A storage failure in this loop's own write (logged once by the
		// store) stops the node like any other failed Ready.
		if r := recover(); r != nil {
			sf, ok := r.(*StorageFailure)
			if !ok {
				panic(r)
			}
			n.fail(sf)
		}
	}()
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	lastTick := time.Now()
	var batch []raftpb.Entry
	var ids []uint64
	poll := make(chan struct{})
	close(poll)
	for {
		// Block only when raft has nothing to hand out; otherwise just
		// look at what is queued, so a steady stream of Readys still
		// lets ticks and stop through.
		var wait <-chan struct{}
		if n.rn.HasReady() {
			wait = poll
		}
		select {
		case now := <-ticker.C:
			n.observeTick(now.Sub(lastTick))
			lastTick = now
			n.flushHeldCommits()
			n.rn.Tick()
			n.publishStatus()
		case m := <-n.recvc:
			n.stepReceived(m)
		case p := <-n.propc:
			batch, ids = append(batch, raftpb.Entry{Data: p.data}), append(ids, p.id)
		case f := <-n.callc:
			f(n.rn)
		case err := <-n.bgErrc:
			n.fail(err)
			return
		case <-n.stopc:
			return
		case <-wait:
		}
		batch, ids = n.drainQueues(batch, ids)
		n.proposeBatch(batch, ids)
		batch, ids = batch[:0], ids[:0]
		if !n.rn.HasReady() {
			continue
		}
		rd := n.rn.Ready()
		if err := n.handleReady(rd); err != nil {
			n.fail(err)
			return
		}
		n.rn.Advance(rd)
	}
}

// drainQueues takes, without blocking, what is already queued: at most one
// queue's capacity of each, so a flood on one cannot hold the loop.
func (n *Node) drainQueues(batch []raftpb.Entry, ids []uint64) ([]raftpb.Entry, []uint64) {
	drain(n.recvc, maxQueuedMessages, n.stepReceived)
	drain(n.propc, maxQueuedProposals, func(p queuedProposal) {
		batch, ids = append(batch, raftpb.Entry{Data: p.data}), append(ids, p.id)
	})
	drain(n.callc, maxQueuedCalls, func(f func(*raft.RawNode)) { f(n.rn) })
	return batch, ids
}

// drain hands take up to limit values already in c, without waiting.
func drain[T any](c <-chan T, limit int, take func(T)) {
	for range limit {
		select {
		case v := <-c:
			take(v)
		default:
			return
		}
	}
}

// proposeBatch proposes the queued entries as one MsgProp, as raft.Node
// would step them one by one but in one append (and one message per
// follower). A proposal raft drops (no leader, a leadership transfer, the
// uncommitted-size limit) was certainly not proposed: its caller gets
// ErrNotLeader.
func (n *Node) proposeBatch(batch []raftpb.Entry, ids []uint64) {
	if len(batch) == 0 {
		return
	}
	if n.refuseProposals {
		// A leadership transfer is draining (handover.go).
		n.waiting.failProposals(ids, ErrNotLeader)
		return
	}
	// raft keeps the entries (in its unstable log), so they must not share
	// the loop's reusable slice.
	ents := make([]raftpb.Entry, len(batch))
	copy(ents, batch)
	err := n.rn.Step(raftpb.Message{Type: raftpb.MsgProp, From: n.cfg.ID, Entries: ents})
	if err != nil {
		n.waiting.failProposals(ids, ErrNotLeader)
		return
	}
	n.waiting.markStepped(ids)
}

// stepReceived steps a message from a peer into raft. Proposals are never
// taken from peers (forwarding is off: a follower answers ErrNotLeader
// itself), and raft refuses local message types and answers from peers
// it does not know; those are dropped like any lost message.
func (n *Node) stepReceived(m raftpb.Message) {
	if m.Type == raftpb.MsgProp {
		return
	}
	if err := n.rn.Step(m); err != nil {
		n.log.Debug("peer message dropped", "type", m.Type.String(), "from", m.From, "err", err)
	}
}

// post queues f to run on the loop with the RawNode and returns without
// waiting for it (raft's reports from the transport: nobody waits on their
// effect). Before Start it runs f here; after the loop has exited, never.
func (n *Node) post(f func(rn *raft.RawNode)) {
	n.startMu.Lock()
	if !n.started {
		defer n.startMu.Unlock()
		f(n.rn)
		return
	}
	n.startMu.Unlock()
	select {
	case n.callc <- f:
	case <-n.donec:
	}
}

// call runs f on the loop with the RawNode and waits for it, or for ctx.
// Before Start (no loop yet) it runs f here, serialised by startMu. It
// returns false when f did not run, or may run later: the caller must then
// not read what f writes (f runs on the loop, possibly after call returned).
func (n *Node) call(ctx context.Context, f func(rn *raft.RawNode)) bool {
	n.startMu.Lock()
	if !n.started {
		defer n.startMu.Unlock()
		f(n.rn)
		return true
	}
	n.startMu.Unlock()
	done := make(chan struct{})
	select {
	case n.callc <- func(rn *raft.RawNode) { f(rn); close(done) }:
	case <-ctx.Done():
		return false
	case <-n.donec:
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	case <-n.donec:
		// The loop may have run f just before it exited.
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// statusWait bounds how long Status waits for a loop busy with a Ready (a
// slow fsync, a stalled disk) before it answers with the last status the
// loop published: a status reader is how an operator looks at a stuck node.
const statusWait = time.Second

// publishStatus records raft's status for Status to fall back on, and
// returns it. Loop only (or before Start).
func (n *Node) publishStatus() raft.Status {
	st := n.rn.Status()
	n.lastStatus.Store(&st)
	return st
}
