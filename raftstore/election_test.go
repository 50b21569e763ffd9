package raftstore

import (
	"log/slog"

	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestAdvanceElectionCampaignsWithinOneTimeout: a restarted member of a
// three-voter cluster that hears from no leader starts its first
// (pre-)campaign within ElectionTicks ticks of starting, not after the
// 10–19 a cold election clock needs; both are checked, many times, since
// raft draws the timeout at random.
func TestAdvanceElectionCampaignsWithinOneTimeout(t *testing.T) {
	const electionTicks = 10
	firstCampaign := func(advance bool) int {
		ms := raft.NewMemoryStorage()
		if err := ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
			Index: 5, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: electionTicks, HeartbeatTick: 1, Storage: ms,
			MaxSizePerMsg: MaxSizePerMsgDefault, MaxInflightMsgs: MaxInflightDefault, PreVote: true, CheckQuorum: true,
			Logger: raftLogger{l: slog.New(slog.DiscardHandler)}})
		if err != nil {
			t.Fatal(err)
		}
		if advance {
			advanceElection(rn, electionTicks)
		}
		for ticks := 1; ticks <= 3*electionTicks; ticks++ {
			rn.Tick()
			if rn.Status().RaftState != raft.StateFollower {
				return ticks
			}
		}
		t.Fatal("no campaign")
		return 0
	}
	for i := 0; i < 200; i++ {
		if got := firstCampaign(true); got > electionTicks {
			t.Fatalf("advanced: first campaign after %d ticks, want at most %d", got, electionTicks)
		}
		if got := firstCampaign(false); got < electionTicks {
			t.Fatalf("cold: first campaign after %d ticks", got)
		}
	}
}
