package raftstore

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
)

// Handing leadership over before a planned stop.
//
// A leader that just stops leaves the cluster leaderless for an election
// timeout, and every proposal it had taken but not yet applied ends
// indeterminate. HandOver asks raft to transfer leadership to the most
// up-to-date active voter first (etcd's server does the same on a clean
// stop). Raft drops every proposal made during the transfer (the callers
// get ErrNotLeader: certainly not proposed, retry) and sends the target
// MsgTimeoutNow only once the target's log matches the leader's. With
// three voters, the leader and the target are a majority: the target's
// acknowledgment commits every entry the leader had appended in the same
// step that sends MsgTimeoutNow, so they apply here, with their answers,
// in that Ready, before the target's election can depose this node. With
// more voters an entry that no third node acknowledged yet can still be
// pending when the target campaigns; its caller then gets indeterminate,
// as in any change of leader.

// handOverPoll is how often HandOver looks whether leadership moved.
const handOverPoll = 5 * time.Millisecond

// HandOver transfers leadership away from this node and waits until
// another node leads, or ctx ends (then raft abandons the transfer after
// an election timeout by itself). It returns nil at once when this node
// is not the leader or the only voter, and an error when no other voter is
// active.
func (n *Node) HandOver(ctx context.Context) error {
	if !n.isLeader.Load() || len(n.ConfState().Voters) < 2 {
		return nil
	}
	t := time.NewTicker(handOverPoll)
	defer t.Stop()
	// With CheckQuorum raft marks every follower inactive at each election
	// timeout until its next response: look again for a moment.
	var target uint64
	for target = n.transferTarget(); target == 0; target = n.transferTarget() {
		if !n.isLeader.Load() {
			return nil // deposed meanwhile: nothing to hand over
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("raftstore: hand over leadership: no other active voter: %w", ctx.Err())
		case <-n.donec:
			return ErrStopped
		case <-t.C:
		}
	}
	start := time.Now()
	var leading bool
	if !n.call(ctx, func(rn *raft.RawNode) { leading = transferIfLeader(rn, target) }) {
		return fmt.Errorf("raftstore: hand over leadership to %d: %w", target, ctx.Err())
	}
	if !leading {
		return nil
	}
	for n.isLeader.Load() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("raftstore: hand over leadership to %d: %w", target, ctx.Err())
		case <-n.donec:
			return ErrStopped
		case <-t.C:
		}
	}
	n.log.Info("leadership handed over", "to", target, "took", time.Since(start))
	return nil
}
