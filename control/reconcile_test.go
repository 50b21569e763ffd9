package control

import (
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

func TestConfChangeFor(t *testing.T) {
	voter := func(id uint64) core.Member { return core.Member{NodeID: id, Incarnation: 1, Role: core.RoleVoter} }
	learner := func(id uint64) core.Member { return core.Member{NodeID: id, Incarnation: 1, Role: core.RoleLearner} }
	add := func(id uint64) raftpb.ConfChangeSingle {
		return raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: id}
	}
	addLearner := func(id uint64) raftpb.ConfChangeSingle {
		return raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id}
	}
	remove := func(id uint64) raftpb.ConfChangeSingle {
		return raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: id}
	}
	placeholder := core.Member{NodeID: 3, Incarnation: 3, Role: core.RoleLearner, Address: placeholderAddress}
	tests := []struct {
		name    string
		cs      raftpb.ConfState
		members []core.Member
		retired []uint64
		want    []raftpb.ConfChangeSingle // nil: they agree
	}{
		{"agree", raftpb.ConfState{Voters: []uint64{1, 2, 3}}, []core.Member{voter(1), voter(2), voter(3)}, nil, nil},
		{"agree with a learner", raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}}, []core.Member{voter(1), learner(2)}, nil, nil},
		// Raft has already promoted it; demoting is never reconcile's job.
		{"learner that raft made a voter", raftpb.ConfState{Voters: []uint64{1, 2}}, []core.Member{voter(1), learner(2)}, nil, nil},
		{"admitted learner", raftpb.ConfState{Voters: []uint64{1}}, []core.Member{voter(1), learner(2)}, nil, []raftpb.ConfChangeSingle{addLearner(2)}},
		{"promoted learner", raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}}, []core.Member{voter(1), voter(2)}, nil, []raftpb.ConfChangeSingle{add(2)}},
		{"retired voter", raftpb.ConfState{Voters: []uint64{1, 2}}, []core.Member{voter(1)}, []uint64{2}, []raftpb.ConfChangeSingle{remove(2)}},
		{"retired learner", raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}}, []core.Member{voter(1)}, []uint64{2}, []raftpb.ConfChangeSingle{remove(2)}},
		{"replacement completed", raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}, []core.Member{voter(1), voter(2), voter(4)}, []uint64{3},
			[]raftpb.ConfChangeSingle{add(4), remove(3)}},
		// A static voter that adoption has not recorded yet stays a voter.
		{"static voters being adopted", raftpb.ConfState{Voters: []uint64{1, 2, 3}}, []core.Member{voter(1), learner(2)}, nil, nil},
		{"empty control state", raftpb.ConfState{Voters: []uint64{1}}, nil, nil, nil},
		// The placeholder of a skipped static id never joins raft.
		{"placeholder", raftpb.ConfState{Voters: []uint64{1, 2, 4}}, []core.Member{voter(1), voter(2), placeholder}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			retired := map[uint64]bool{}
			for _, id := range tc.retired {
				retired[id] = true
			}
			cc, ok := confChangeFor(tc.cs, tc.members, retired)
			if ok != (tc.want != nil) || confMatches(tc.cs, tc.members, retired) == ok {
				t.Fatalf("change %v (%v), want %v", ok, cc.String(), tc.want)
			}
			if fmt.Sprint(cc.Changes) != fmt.Sprint(tc.want) {
				t.Fatalf("changes %v, want %v", cc.Changes, tc.want)
			}
			// More than one change at a time goes through joint consensus.
			wantTransition := raftpb.ConfChangeTransitionAuto
			if len(tc.want) > 1 {
				wantTransition = raftpb.ConfChangeTransitionJointImplicit
			}
			if cc.Transition != wantTransition {
				t.Fatalf("transition %v, want %v", cc.Transition, wantTransition)
			}
		})
	}
}

func TestCaughtUp(t *testing.T) {
	replicating := tracker.Progress{Match: 100, RecentActive: true, State: tracker.StateReplicate}
	tests := []struct {
		name   string
		pr     *tracker.Progress
		commit uint64
		want   bool
	}{
		{"replicating, close", &replicating, 100 + PromoteLagDefault, true},
		{"replicating, too far behind", &replicating, 101 + PromoteLagDefault, false},
		{"no progress", nil, 1, false},
		{"never answered", &tracker.Progress{Match: 0, RecentActive: true, State: tracker.StateReplicate}, 5, false},
		{"not recently active", &tracker.Progress{Match: 100, State: tracker.StateReplicate}, 100, false},
		{"probing", &tracker.Progress{Match: 100, RecentActive: true, State: tracker.StateProbe}, 100, false},
		{"receiving a snapshot", &tracker.Progress{Match: 100, RecentActive: true, State: tracker.StateSnapshot}, 100, false},
	}
	for _, tc := range tests {
		n := newFakeNode()
		st := raft.Status{Progress: map[uint64]tracker.Progress{}}
		st.Commit = tc.commit
		if tc.pr != nil {
			st.Progress[2] = *tc.pr
		}
		n.setStatus(st)
		p := New(Config{ID: 1, Node: n})
		if got := p.caughtUp(2); got != tc.want {
			t.Errorf("%s: caughtUp %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestReconcile: on the ready leader the loop adds an admitted learner to
// raft, promotes it once it replicates, removes a retired member, and on
// every node points the peer transport at exactly the members.
func TestReconcile(t *testing.T) {
	n := newFakeNode()
	l := &fakeLeadership{}
	peers := &fakePeers{addrs: map[uint64]string{}}
	p := New(Config{ID: 1, Node: n, Leadership: l, Peers: peers, Addresses: map[uint64]string{1: "127.0.0.1:7001", 9: "127.0.0.1:7009"},
		Logger: testkit.QuietLogger()})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	wait := func(what string, cond func() bool) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, what, cond)
	}
	apply := func(cmd core.Command) core.Result {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.m.Apply(cmd)
	}
	apply(core.Bootstrap(hashCredential("b"), "127.0.0.1:7001"))
	apply(core.MintJoin(hashCredential("j")))
	admitted := apply(core.Admit(hashCredential("j"), "127.0.0.1:7002"))

	// Every node syncs its transport, leader or not: the unknown 9 goes.
	wait("peer 2 dialed", func() bool { a, ok := peers.get(2); return ok && a == "127.0.0.1:7002" })
	if p.Address(2) != "127.0.0.1:7002" || p.Address(9) != "" || p.Address(1) != "127.0.0.1:7001" {
		t.Fatalf("addresses 1=%q 2=%q 9=%q", p.Address(1), p.Address(2), p.Address(9))
	}
	if _, changes := n.conf(); changes != 0 {
		t.Fatal("a follower proposed a conf change")
	}

	l.leader.Store(true)
	wait("learner 2 in raft", func() bool { cs, _ := n.conf(); return fmt.Sprint(cs.Learners) == "[2]" })
	time.Sleep(5 * ReconcileIntervalDefault)
	if cs, _ := n.conf(); fmt.Sprint(cs.Voters) != "[1]" {
		t.Fatalf("a learner that never replicated was promoted: %v", cs.Voters)
	}
	st := raft.Status{Progress: map[uint64]tracker.Progress{2: {Match: 10, RecentActive: true, State: tracker.StateReplicate}}}
	st.Commit = 10
	n.setStatus(st)
	wait("learner 2 promoted", func() bool {
		cs, _ := n.conf()
		return fmt.Sprint(cs.Voters) == "[1 2]" && len(cs.Learners) == 0
	})

	apply(core.Retire(2, admitted.Incarnation))
	wait("node 2 removed", func() bool {
		cs, _ := n.conf()
		_, dialed := peers.get(2)
		return fmt.Sprint(cs.Voters) == "[1]" && !dialed
	})
}

func TestCloseUnstarted(t *testing.T) {
	p := New(Config{Node: newFakeNode()})
	p.Close()
	p.Close()
	if p.Addr() != "" {
		t.Fatalf("addr %q without a listener", p.Addr())
	}
}
