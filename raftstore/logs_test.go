package raftstore

import (
	"log/slog"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestRestartKnowsItsTerm: a restarted node reports the term it stored
// before its first Ready: a follower that hears of the current leader
// without a term change used to log "leader elected ... term=0".
func TestRestartKnowsItsTerm(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	n := startSingle(t, st, Config{})
	term := n.Term()
	n.Stop()
	if term == 0 {
		t.Fatal("a leading node at term 0")
	}
	st = reopen(t, st, dir)
	n2, err := NewNode(Config{ID: 1, Peers: []uint64{1}, Store: st, Logger: st.log})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Stop()
	if got := n2.Term(); got != term {
		t.Fatalf("restarted node reports term %d before its first Ready, want the stored %d", got, term)
	}
}

// TestConfChangeLogLines: each membership change is logged with the
// membership it left (not the last one of its Ready), with its index, and
// a promotion or demotion says so.
func TestConfChangeLogLines(t *testing.T) {
	cs := func(voters, learners []uint64) raftpb.ConfState {
		return raftpb.ConfState{Voters: voters, Learners: learners}
	}
	change := func(typ raftpb.ConfChangeType, id uint64) raftpb.ConfChangeV2 {
		return raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: id}}}
	}
	for _, tc := range []struct {
		ac   appliedConfChange
		want string
	}{
		{appliedConfChange{index: 4, cc: change(raftpb.ConfChangeAddLearnerNode, 4), prev: cs([]uint64{1, 2, 3}, nil), cs: cs([]uint64{1, 2, 3}, []uint64{4})},
			`msg="learner added" member=4 index=4 voters="[1 2 3]" learners=[4]`},
		{appliedConfChange{index: 9, cc: change(raftpb.ConfChangeAddNode, 4), prev: cs([]uint64{1, 2, 3}, []uint64{4}), cs: cs([]uint64{1, 2, 3, 4}, nil)},
			`msg="learner promoted to voter" member=4 index=9 voters="[1 2 3 4]" learners=[]`},
		{appliedConfChange{index: 2, cc: change(raftpb.ConfChangeAddNode, 2), prev: cs([]uint64{1}, nil), cs: cs([]uint64{1, 2}, nil)},
			`msg="voter added" member=2 index=2 voters="[1 2]"`},
		{appliedConfChange{index: 12, cc: change(raftpb.ConfChangeAddLearnerNode, 3), prev: cs([]uint64{1, 2, 3}, nil), cs: cs([]uint64{1, 2}, []uint64{3})},
			`msg="voter demoted to learner" member=3 index=12`},
		{appliedConfChange{index: 13, cc: change(raftpb.ConfChangeRemoveNode, 3), prev: cs([]uint64{1, 2}, []uint64{3}), cs: cs([]uint64{1, 2}, nil)},
			`msg="member removed" member=3 index=13 voters="[1 2]"`},
	} {
		var buf logBuffer
		logConfChange(slog.New(slog.NewTextHandler(&buf, nil)), tc.ac)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("logged %q, want it to hold %q", buf.String(), tc.want)
		}
	}
}
