package raftstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// Handing leadership over: before a planned stop (HandOver), to the node
// the clients use (TransferLeadership, daemon's leader placement) and away
// from a disk running full (yieldLoop, disk.go).
//
// A leader that just stops leaves the cluster leaderless for an election
// timeout, and every proposal it had taken but not yet applied ends
// indeterminate. A planned move avoids both, in two steps:
//
//  1. Drain: the loop refuses new proposals (ErrNotLeader: certainly not
//     proposed; the client transport sends such a request on to the new
//     leader once it is known) and the move waits until every proposal
//     already taken has applied here and been answered. A proposal that
//     raft took while this node led commits while it still leads, since
//     nothing deposes it yet.
//  2. Transfer: raft's leadership transfer to an active voter, which sends
//     the target MsgTimeoutNow once the target's log matches the leader's;
//     the target wins the next term at once, well inside an election
//     timeout (etcd's server moves leadership the same way).
//
// No proposal is left in flight when the target campaigns, so none ends
// indeterminate, whatever the number of voters. If the move fails (no
// target, ctx ends) the loop takes proposals again.

// handOverPoll is how often a move looks whether the drain ended or
// leadership moved: each takes about a peer round trip and an fsync, so
// a coarser poll would add most of a move's time.
const handOverPoll = time.Millisecond

// HandOver transfers leadership away from this node to the most
// up-to-date active voter and waits until another node leads, or ctx ends
// (then raft abandons the transfer after an election timeout by itself).
// It returns nil at once when this node is not the leader or the only
// voter, and an error when no other voter is active.
func (n *Node) HandOver(ctx context.Context) error {
	if !n.isLeader.Load() || len(n.ConfState().Voters) < 2 {
		return nil
	}
	t := time.NewTicker(handOverPoll)
	defer t.Stop()
	// A move already running (the low-disk yield) goes first: a stop
	// waits for it rather than stop in the middle of its drain.
	for !n.moving.TryLock() {
		if err := n.nextPoll(ctx, t); err != nil {
			return fmt.Errorf("raftstore: hand over leadership: another move is running: %w", err)
		}
	}
	n.moving.Unlock()
	// With CheckQuorum raft marks every follower inactive at each election
	// timeout until its next response: look again for a moment.
	var target uint64
	for target = n.transferTarget(); target == 0; target = n.transferTarget() {
		if !n.isLeader.Load() {
			return nil // deposed meanwhile: nothing to hand over
		}
		if err := n.nextPoll(ctx, t); err != nil {
			return fmt.Errorf("raftstore: hand over leadership: no other active voter: %w", err)
		}
	}
	if err := n.handOverTo(ctx, target); !errors.Is(err, ErrNotLeader) {
		return err
	}
	return nil // deposed meanwhile: nothing to hand over
}

// handOverTo is the move of HandOver and of the low-disk yield: to target,
// aborting a transfer a given-up move left running (transferIfLeader).
func (n *Node) handOverTo(ctx context.Context, target uint64) error {
	return n.move(ctx, target, func(rn *raft.RawNode) error {
		if !transferIfLeader(rn, target) {
			return ErrNotLeader
		}
		return nil
	})
}

// ErrNoTransfer says a leadership transfer was not started: the target is
// not a voter that is active and replicating, or a transfer already runs.
var ErrNoTransfer = errors.New("raftstore: leadership not transferable to that node now")

// TransferLeadership moves leadership to target, which must be another
// voter that the leader heard from lately and that is replicating
// normally (so raft's transfer takes one round trip, not a catch-up), and
// waits until this node no longer leads, or ctx ends. ErrNotLeader: this
// node does not lead; ErrNoTransfer: target cannot take over now.
func (n *Node) TransferLeadership(ctx context.Context, target uint64) error {
	if !n.isLeader.Load() {
		return ErrNotLeader
	}
	var err error
	if !n.call(ctx, func(rn *raft.RawNode) { err = transferCheck(rn, n.cfg.ID, target) }) {
		return fmt.Errorf("raftstore: transfer leadership to %d: %w", target, ctx.Err())
	}
	if err != nil {
		return err
	}
	return n.move(ctx, target, func(rn *raft.RawNode) error {
		if err := transferCheck(rn, n.cfg.ID, target); err != nil {
			return err
		}
		rn.TransferLeader(target)
		return nil
	})
}

// move drains this leader's proposals and then runs start on the loop,
// which begins the transfer to target (or says why not), and waits until
// this node no longer leads. One move runs at a time.
func (n *Node) move(ctx context.Context, target uint64, start func(rn *raft.RawNode) error) error {
	if !n.moving.TryLock() {
		return fmt.Errorf("%w: another move is running", ErrNoTransfer)
	}
	defer n.moving.Unlock()
	began := time.Now()
	moved := false
	// Registered before the call that sets the flag, which the loop may
	// still run after call gave up on ctx: the loop takes functions in
	// order, so this reset always comes after it. Once deposed the flag is
	// already clear.
	defer func() {
		if !moved {
			n.post(func(*raft.RawNode) { n.refuseProposals = false })
		}
	}()
	leading := false
	var taken []uint64 // the proposals to wait for: later ones are refused
	if !n.call(ctx, func(rn *raft.RawNode) {
		leading = rn.BasicStatus().RaftState == raft.StateLeader
		n.refuseProposals = leading
		taken = n.waiting.pendingProposals()
	}) {
		return fmt.Errorf("raftstore: move leadership to %d: %w", target, ctx.Err())
	}
	if !leading {
		return ErrNotLeader
	}
	t := time.NewTicker(handOverPoll)
	defer t.Stop()
	for n.waiting.anyPending(taken) && n.isLeader.Load() {
		if err := n.nextPoll(ctx, t); err != nil {
			return fmt.Errorf("raftstore: move leadership to %d: proposals still in flight: %w", target, err)
		}
	}
	drained := time.Since(began)
	var err error
	if !n.call(ctx, func(rn *raft.RawNode) { err = start(rn) }) {
		return fmt.Errorf("raftstore: move leadership to %d: %w", target, ctx.Err())
	}
	if err != nil {
		return err
	}
	var lead uint64
	for {
		// Raft gives a transfer up after an election timeout; then stop
		// refusing proposals at once rather than when ctx ends.
		var leading, transferring bool
		if !n.call(ctx, func(rn *raft.RawNode) {
			st := rn.BasicStatus()
			leading, transferring = st.RaftState == raft.StateLeader, st.LeadTransferee != 0
			lead = st.Lead
		}) {
			return fmt.Errorf("raftstore: move leadership to %d: %w", target, ctx.Err())
		}
		if !leading {
			break
		}
		if !transferring {
			return fmt.Errorf("%w: raft gave the transfer to %d up", ErrNoTransfer, target)
		}
		if err := n.nextPoll(ctx, t); err != nil {
			return fmt.Errorf("raftstore: move leadership to %d: %w", target, err)
		}
	}
	moved = true
	if lead != 0 && lead != target {
		// Deposed by another election (a higher term, a lost quorum),
		// not by this move.
		return fmt.Errorf("%w: node %d leads, not the move's target %d", ErrNotLeader, lead, target)
	}
	n.log.Info("leadership handed over", "to", target, "took", time.Since(began), "drain", drained)
	return nil
}

// nextPoll waits for t's next tick: ctx's error when ctx ends first,
// ErrStopped when the node stops.
func (n *Node) nextPoll(ctx context.Context, t *time.Ticker) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return ErrStopped
	case <-t.C:
		return nil
	}
}

// transferCheck says whether self leads and target can take over at once.
func transferCheck(rn *raft.RawNode, self, target uint64) error {
	st := rn.Status()
	if st.RaftState != raft.StateLeader {
		return ErrNotLeader
	}
	if target == self {
		return fmt.Errorf("%w: %d is this node", ErrNoTransfer, target)
	}
	if st.LeadTransferee != 0 {
		return fmt.Errorf("%w: a transfer to %d is running", ErrNoTransfer, st.LeadTransferee)
	}
	if _, voter := st.Config.Voters.IDs()[target]; !voter {
		return fmt.Errorf("%w: %d is not a voter", ErrNoTransfer, target)
	}
	pr, ok := st.Progress[target]
	if !ok || !pr.RecentActive || pr.State != tracker.StateReplicate {
		return fmt.Errorf("%w: %d is not active and replicating", ErrNoTransfer, target)
	}
	return nil
}
