package raftstore

import "go.etcd.io/raft/v3/raftpb"

// coalesce merges the raft messages of one Ready that say in several
// messages what one would say, before they go to the transport.
//
// Why: a leader in StateReplicate sends each proposal to each follower as
// soon as raft takes it, so a Ready carrying 16 proposals carries 16
// one-entry appends per follower, and each follower answers each with its
// own MsgAppResp: every message costs a frame on the peer link, a step
// through the receiver's raft loop and, for appends, an answer. Under load
// that per-message work, not the fsync, was most of a follower's raft CPU.
//
// Which merges, and why each is safe:
//   - Two MsgApp to the same peer, same term, the second starting where the
//     first ends (its Index and LogTerm are the first's last entry): one
//     MsgApp with the first's Index/LogTerm, both entry runs and the second's
//     Commit. It is exactly what raft sends when the proposals arrive
//     together; the follower checks and appends it as it would the two in a
//     row, and its one answer acknowledges the last index, which frees the
//     leader's inflight records of both (Inflights.FreeLE).
//   - Two accepting MsgAppResp to the same peer, same term: the one with the
//     higher Index. An acknowledgment of index i says the follower's log
//     matches the leader's up to i, which includes every lower index; the
//     lower one dropped is a lost message, which raft tolerates.
//
// Only messages adjacent in the per-peer order are merged (any other
// message to that peer in between stops it), so what each peer receives
// keeps its order. Merged appends stay under maxBytes of entry data. The
// Ready contract is untouched: this runs where rd.Messages were sent, at
// the same point (before the leader's persist, after every other node's),
// and only on messages raft already produced. Entry slices are copied,
// never appended to in place: they may share raft's unstable log.
func coalesce(msgs []raftpb.Message, self uint64, maxBytes uint64) []raftpb.Message {
	if len(msgs) < 2 {
		return msgs
	}
	out := make([]raftpb.Message, 0, len(msgs))
	last := make(map[uint64]int, 2) // peer -> index in out of its last message
	owned := make(map[int]bool)     // out indexes whose Entries we allocated
	for _, m := range msgs {
		if m.To == self {
			out = append(out, m)
			continue
		}
		if i, ok := last[m.To]; ok && merge(&out[i], m, maxBytes, owned[i]) {
			if m.Type == raftpb.MsgApp {
				owned[i] = true
			}
			continue
		}
		last[m.To] = len(out)
		out = append(out, m)
	}
	return out
}

// merge folds next into prev if one of the two rules applies and reports
// whether it did. owned says prev.Entries is a copy of ours to append to.
func merge(prev *raftpb.Message, next raftpb.Message, maxBytes uint64, owned bool) bool {
	if prev.Type != next.Type || prev.Term != next.Term || prev.From != next.From {
		return false
	}
	switch next.Type {
	case raftpb.MsgApp:
		n := uint64(len(prev.Entries))
		if next.Index != prev.Index+n {
			return false
		}
		if n > 0 && next.LogTerm != prev.Entries[n-1].Term {
			return false
		}
		if n == 0 && next.LogTerm != prev.LogTerm {
			return false
		}
		if entriesSize(prev.Entries)+entriesSize(next.Entries) > maxBytes {
			return false
		}
		if !owned {
			prev.Entries = append(make([]raftpb.Entry, 0, len(prev.Entries)+len(next.Entries)+8), prev.Entries...)
		}
		prev.Entries = append(prev.Entries, next.Entries...)
		prev.Commit = max(prev.Commit, next.Commit)
		return true
	case raftpb.MsgAppResp:
		if prev.Reject || next.Reject {
			return false
		}
		if next.Index >= prev.Index {
			*prev = next
		}
		return true
	}
	return false
}

func entriesSize(ents []raftpb.Entry) uint64 {
	var n uint64
	for i := range ents {
		n += uint64(ents[i].Size())
	}
	return n
}
