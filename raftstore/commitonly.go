package raftstore

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Commit-only appends. When the commit index moves, raft's leader sends
// every follower an append with no entries just to tell it the new commit
// index, and each follower answers it. For a lock service that answers
// clients from the leader, that is half of all peer messages under light
// load (an entry costs one append and one commit-only append per follower,
// each with its answer), and on loopback every message is a write, a read,
// a wake-up and a raft step on both sides. raft itself says they are not
// needed: heartbeats (every tick) carry the commit index as well, and so
// does the next append with entries; they only let followers apply sooner.
//
// So the leader does not send a commit-only append to a follower that is
// replicating normally (StateReplicate, flow not paused):
//   - if the follower has acknowledged everything up to the append's Index,
//     the append could tell it nothing but the commit index: it is dropped;
//   - otherwise it is held: an append or snapshot raft sends that peer later
//     replaces it (it carries a newer commit index and asks the same
//     question), and at the next tick a held append whose Index the
//     follower has still not acknowledged is sent after all. That keeps
//     raft's recovery probes: after a lost append, an idle leader's answer
//     to a heartbeat response is exactly such an empty append, and it goes
//     out one tick later instead of at once.
//
// Safety: raft tolerates the loss or delay of any message; a dropped
// commit-only append is a lost message, a held one a late one, and a held
// one is never sent after a newer append to the same peer (that append
// deletes it), so each peer still sees appends in the order raft made
// them. Appends in any other state (probing, paused flow, snapshots) are
// sent as raft made them. Cost: a follower applies a committed entry when
// the next append or heartbeat arrives (at most one tick later when the
// cluster is idle); the leader, which answers clients, is not delayed.

// holdCommitOnly returns msgs without the leader's commit-only appends,
// which it drops or holds as described above. Called by the loop only, on
// the messages of a leader's Ready.
func (n *Node) holdCommitOnly(msgs []raftpb.Message) []raftpb.Message {
	var prs map[uint64]tracker.Progress
	var out []raftpb.Message // nil until a message is left out
	for i, m := range msgs {
		if m.Type == raftpb.MsgApp && len(m.Entries) == 0 && m.To != n.cfg.ID {
			if prs == nil {
				prs = n.progress()
			}
			if pr, ok := prs[m.To]; ok && pr.State == tracker.StateReplicate && !pr.MsgAppFlowPaused {
				if out == nil {
					out = append(make([]raftpb.Message, 0, len(msgs)), msgs[:i]...)
				}
				if pr.Match < m.Index {
					n.heldCommit[m.To] = m
				}
				continue
			}
		}
		if m.Type == raftpb.MsgApp || m.Type == raftpb.MsgSnap {
			delete(n.heldCommit, m.To)
		}
		if out != nil {
			out = append(out, m)
		}
	}
	if out == nil {
		return msgs
	}
	return out
}

// flushHeldCommits runs at each tick, before raft's: a held commit-only
// append whose Index its follower has acknowledged meanwhile is dropped
// (heartbeats carry the commit index), and so is one for a peer no longer
// in the configuration; any other is sent now. A node that is no longer
// leader sends none.
func (n *Node) flushHeldCommits() {
	if len(n.heldCommit) == 0 {
		return
	}
	if n.rn.BasicStatus().RaftState != raft.StateLeader {
		clear(n.heldCommit)
		return
	}
	prs := n.progress()
	var out []raftpb.Message
	for to, m := range n.heldCommit {
		delete(n.heldCommit, to)
		if pr, ok := prs[to]; !ok || pr.Match >= m.Index {
			continue
		}
		out = append(out, m)
	}
	n.send(out)
}

// progress is the leader's view of each peer, without the inflight
// records. Loop only.
func (n *Node) progress() map[uint64]tracker.Progress {
	prs := make(map[uint64]tracker.Progress, 4)
	n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) { prs[id] = pr })
	return prs
}
