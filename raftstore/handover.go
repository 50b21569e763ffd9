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
// stop). Raft sends the target MsgTimeoutNow only once the target's log
// matches the leader's, and drops every proposal made during the transfer
// (the callers get ErrNotLeader: certainly not proposed, retry). So every
// entry the leader had appended is on the target, which with the leader
// is a majority of three: it commits and applies here, with its answer,
// before the target's election deposes this node.

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
	target := n.transferTarget()
	if target == 0 {
		return fmt.Errorf("raftstore: hand over leadership: no other active voter")
	}
	start := time.Now()
	if !n.call(ctx, func(rn *raft.RawNode) { rn.TransferLeader(target) }) {
		return fmt.Errorf("raftstore: hand over leadership to %d: %w", target, ctx.Err())
	}
	t := time.NewTicker(handOverPoll)
	defer t.Stop()
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
