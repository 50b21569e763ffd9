package raftstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
)

// Linearizable reads share raft ReadIndex rounds, by etcd's rule (its
// server's linearizableReadLoop and requestCurrentIndex): one goroutine per
// node, the read loop, issues one ReadIndex at a time. Callers of ReadIndex
// join the pending batch and wake the loop; the loop takes the whole
// pending batch, starts a new empty one, and only then hands raft one
// ReadIndex for the batch it took. Callers that arrive while that round is
// in flight join the new batch and wait for the next round. So a thousand
// keepalives a second cost a few rounds (one heartbeat broadcast each),
// not a thousand.
//
// Why it stays linearizable: a caller is released only by a round issued
// after it joined (its batch is taken from pending, under the batcher's
// lock, after the join and before the round goes to raft), and then only
// once the applied index reaches that round's read index. Raft confirms
// the read index with a quorum of heartbeats sent after the round was
// issued (ReadOnlySafe), so the index covers every write committed before
// the round started, hence every write committed before the caller
// called. Raft takes a round only while it leads (a follower's raft would
// forward it, which confirms another node's leadership, not this one's).
// A round that ends with an error (lost leadership, stop) fails
// its whole batch: no caller is ever answered from a round issued before
// it arrived, or from no round at all.
//
// A caller that can wait (ReadIndexWithin, a session keepalive) lets the
// pending batch start up to its hold later, so that more callers share
// the round: the batch is taken when its earliest hold ends, or at once
// when a caller that cannot wait (ReadIndex) joins it. Waiting only moves
// the round later, still after every caller of the batch joined, so the
// argument above is unchanged. A node that stops leading takes the batch
// at once (leadershipLost): its round fails ErrNotLeader without waiting
// out the holds, which could only end the same way or, if this node leads
// again by then, in a round of the new term, which is as good. Once the
// read loop exits, no hold timer stays armed (stop).

// readRoundTimeoutElections bounds one round, in election timeouts. With
// CheckQuorum a leader that cannot reach a quorum steps down within one
// election timeout, which fails the round with ErrNotLeader; the bound is
// a backstop so that the loop never waits forever on a read raft dropped.
const readRoundTimeoutElections = 2

// readBatch is the callers one round answers.
type readBatch struct {
	seq     uint64 // the round's number, set when it is issued
	readers int    // callers that joined it
	// now is set once a caller that cannot wait joined; otherwise due is
	// when the earliest hold of its callers ends, and timer wakes the
	// loop then.
	now   bool
	due   time.Time
	timer *time.Timer
	done  chan struct{} // closed once index and err are set
	index uint64        // the read index raft confirmed
	err   error
}

// readBatcher holds the pending batch and the read loop's counters.
type readBatcher struct {
	mu      sync.Mutex
	pending *readBatch // the batch new callers join; never nil
	issued  uint64     // seq of the last batch taken for a round
	stopped bool       // the read loop exited: arm no more timers
	wake    chan struct{}

	rounds  atomic.Uint64 // rounds issued to raft
	readers atomic.Uint64 // callers that joined a batch
}

// readHooks let tests watch and pause the read loop; nil in production.
type readHooks struct {
	// issuing runs on the read loop after a batch is taken and before its
	// ReadIndex goes to raft; it may block.
	issuing func(seq uint64)
	// leaderChecked runs in a round after its first leadership check and
	// before its ReadIndex is handed to raft; it may block.
	leaderChecked func()
	// served runs for each caller its round answered without error:
	// arrivedAfter is the last round issued when it joined, servedBy the
	// round that answered it.
	served func(arrivedAfter, servedBy uint64)
}

func (b *readBatcher) init() {
	b.pending = &readBatch{done: make(chan struct{})}
	b.wake = make(chan struct{}, 1)
}

// join adds a caller to the pending batch and says which round was the
// last one issued before it. A hold above zero lets the batch's round
// start up to hold from now.
func (b *readBatcher) join(hold time.Duration) (batch *readBatch, arrivedAfter uint64) {
	b.mu.Lock()
	batch = b.pending
	batch.readers++
	arrivedAfter = b.issued
	wakeNow := hold <= 0
	switch {
	case wakeNow:
		batch.now = true
	case batch.now, b.stopped: // the loop is woken, or gone
	case batch.timer == nil:
		batch.due = time.Now().Add(hold)
		batch.timer = time.AfterFunc(hold, b.poke)
	default:
		if due := time.Now().Add(hold); due.Before(batch.due) {
			batch.due = due
			batch.timer.Reset(hold)
		}
	}
	b.mu.Unlock()
	b.readers.Add(1)
	if wakeNow {
		b.poke()
	}
	return batch, arrivedAfter
}

// poke wakes the read loop.
func (b *readBatcher) poke() {
	select {
	case b.wake <- struct{}{}:
	default: // the loop is already woken
	}
}

// leadershipLost makes a pending batch that has callers start its round
// now: the round finds the node no longer leading and fails them, instead
// of leaving held callers to wait out their holds first. A batch with no
// caller is left alone: marking it would leave the next held caller to
// join it with no timer and no wake.
func (b *readBatcher) leadershipLost() {
	b.mu.Lock()
	urge := b.pending.readers > 0 && !b.pending.now
	if urge {
		b.pending.now = true
	}
	b.mu.Unlock()
	if urge {
		b.poke()
	}
}

// stop disarms the pending batch's timer when the read loop exits (its
// callers see the node stopped), so that no timer outlives the node.
func (b *readBatcher) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if t := b.pending.timer; t != nil {
		t.Stop()
	}
}

// take hands the pending batch to a round and starts a new one; nil when
// no caller joined since the last round, or when every caller of it can
// still wait (its timer wakes the loop when the first hold ends).
func (b *readBatcher) take() *readBatch {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := b.pending
	if batch.readers == 0 {
		return nil
	}
	if !batch.now && time.Now().Before(batch.due) {
		return nil
	}
	if batch.timer != nil {
		batch.timer.Stop()
	}
	b.issued++
	batch.seq = b.issued
	b.pending = &readBatch{done: make(chan struct{})}
	return batch
}

// ReadIndex returns once the applied state includes every write committed
// before the call (raft ReadIndex, safe mode, shared with the callers of
// the same round: see above). Only the leader serves it: a caller gets
// ErrNotLeader if this node does not lead when it calls or stops leading
// before its round is confirmed.
func (n *Node) ReadIndex(ctx context.Context) error {
	return n.ReadIndexWithin(ctx, 0)
}

// ReadIndexWithin is ReadIndex for a caller that accepts its round to
// start up to hold after the call, so that the callers arriving meanwhile
// share it: fewer rounds (one heartbeat broadcast to every follower each)
// for up to hold more latency. A hold of zero is ReadIndex.
func (n *Node) ReadIndexWithin(ctx context.Context, hold time.Duration) error {
	if !n.isLeader.Load() {
		return ErrNotLeader
	}
	batch, arrivedAfter := n.reads.join(hold)
	select {
	case <-batch.done:
	case <-ctx.Done():
		return fmt.Errorf("raftstore: read index: %w", ctx.Err())
	case <-n.donec:
		return ErrStopped
	}
	if batch.err != nil {
		return batch.err
	}
	if h := n.readHooks.Load(); h != nil && h.served != nil {
		h.served(arrivedAfter, batch.seq)
	}
	return n.WaitApplied(ctx, batch.index)
}

// ReadIndexRounds says how many ReadIndex rounds this node issued to raft
// and how many callers joined them.
func (n *Node) ReadIndexRounds() (rounds, readers uint64) {
	return n.reads.rounds.Load(), n.reads.readers.Load()
}

// readLoop issues one round at a time for whatever batch is pending, until
// the node loop exits.
func (n *Node) readLoop() {
	defer n.bg.Done()
	defer n.reads.stop()
	timeout := readRoundTimeoutElections * time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval
	for {
		select {
		case <-n.reads.wake:
		case <-n.donec:
			return
		}
		batch := n.reads.take()
		if batch == nil {
			continue
		}
		if h := n.readHooks.Load(); h != nil && h.issuing != nil {
			h.issuing(batch.seq)
		}
		batch.index, batch.err = n.readRound(timeout)
		close(batch.done)
	}
}

// readRound asks raft for one read index and waits for it to be confirmed.
func (n *Node) readRound(timeout time.Duration) (uint64, error) {
	if !n.isLeader.Load() {
		return 0, ErrNotLeader
	}
	n.reads.rounds.Add(1)
	if h := n.readHooks.Load(); h != nil && h.leaderChecked != nil {
		h.leaderChecked()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var rctx [8]byte
	binary.BigEndian.PutUint64(rctx[:], n.nextRequestID())
	key := string(rctx[:])
	ch := n.waiting.addRead(key)
	defer n.waiting.dropRead(key)
	// Raft takes the ReadIndex only while it leads: a follower's raft
	// would forward it to the leader and answer with that leader's index,
	// a read that no longer confirms that this node leads. The check above
	// may be stale by now (the node may have stepped down since, and
	// failed the reads registered then, before this one was). Once raft
	// took it as leader, either a quorum confirms it or the node steps
	// down and fails it (waiting.failLostLeadership).
	notLeader := false
	if !n.call(ctx, func(rn *raft.RawNode) {
		if notLeader = rn.BasicStatus().RaftState != raft.StateLeader; !notLeader {
			rn.ReadIndex(rctx[:])
		}
	}) {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("%w: read index not taken by raft within %v", ErrNotLeader, timeout)
		}
		return 0, ErrStopped
	}
	if notLeader {
		return 0, ErrNotLeader
	}
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: read index not confirmed within %v", ErrNotLeader, timeout)
	case <-n.donec:
		return 0, ErrStopped
	}
}
