package control

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

func staticAddrs(ids ...uint64) map[uint64]string {
	out := map[uint64]string{}
	for _, id := range ids {
		out[id] = fmt.Sprintf("127.0.0.1:%d", 7000+id)
	}
	return out
}

// A single node is not adopted: it waits for its bootstrap.
func TestSingleNodeIsNotAdopted(t *testing.T) {
	step, err := nextAdoptionStep(core.ControlState{}, raftpb.ConfState{Voters: []uint64{1}}, staticAddrs(1))
	if err != nil || step.action != adoptDone {
		t.Fatalf("step %+v, err %v", step, err)
	}
}

// A static cluster that adoption cannot record is refused before anything
// is proposed, with the reason.
func TestAdoptionRefusals(t *testing.T) {
	tests := []struct {
		name  string
		cs    raftpb.ConfState
		addrs map[uint64]string
		want  string
	}{
		{"no node 1", raftpb.ConfState{Voters: []uint64{2, 3, 4}}, staticAddrs(2, 3, 4), "do not include 1"},
		{"learner", raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}, staticAddrs(1, 2, 3), "changing"},
		{"joint", raftpb.ConfState{Voters: []uint64{1, 2}, VotersOutgoing: []uint64{1, 3}}, staticAddrs(1, 2, 3), "changing"},
		{"unknown address", raftpb.ConfState{Voters: []uint64{1, 2, 3}}, staticAddrs(1, 2), "no usable peer address"},
		{"id too large", raftpb.ConfState{Voters: []uint64{1, core.MaxControlNodes + 1}}, staticAddrs(1, core.MaxControlNodes+1), "above"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nextAdoptionStep(core.ControlState{}, tc.cs, tc.addrs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// adoptOn runs adoption steps on m until done (or stopAfter steps),
// checking after every command that reconcile would change nothing in
// raft: no partial state may cost a static voter.
func adoptOn(t *testing.T, m *core.Machine, cs raftpb.ConfState, addrs map[uint64]string, stopAfter int) (steps int) {
	t.Helper()
	apply := func(cmd core.Command) core.Result {
		res := m.Apply(cmd)
		if res.Kind == core.ResultControlRejected {
			t.Fatalf("%v rejected: %s", cmd.Control, res.Reason)
		}
		if cc, ok := confChangeFor(cs, m.Members(), retiredSet(m)); ok {
			t.Fatalf("after %v reconcile would propose %v", cmd.Control, cc.String())
		}
		return res
	}
	for ; steps != stopAfter; steps++ {
		step, err := nextAdoptionStep(m.ControlState(), cs, addrs)
		if err != nil {
			t.Fatal(err)
		}
		switch step.action {
		case adoptDone:
			return steps
		case adoptBootstrap:
			apply(core.Bootstrap(adoptionMarker(), step.addr))
		case adoptPromote:
			apply(core.Promote(step.node, step.inc))
		case adoptRetire:
			apply(core.Retire(step.node, step.inc))
		case adoptAdmit:
			h := hashCredential(fmt.Sprint("test-", step.node))
			apply(core.MintJoin(h))
			if res := apply(core.Admit(h, step.addr)); res.NodeID != step.node {
				t.Fatalf("admitted %d, want %d", res.NodeID, step.node)
			}
		}
		if steps > 100 {
			t.Fatal("adoption does not end")
		}
	}
	return steps
}

// Adoption records every static voter under its own id and address, skips
// the ids the list does not use (issued and retired at once), and resumes
// from any partial state a leader change may leave.
func TestAdoptionRecordsStaticVoters(t *testing.T) {
	for _, voters := range [][]uint64{{1, 2, 3}, {1, 2, 5}, {1, 4}, {1, 2, 3, 4, 5}} {
		cs := raftpb.ConfState{Voters: voters}
		addrs := staticAddrs(voters...)
		full := adoptOn(t, core.NewMachine(), cs, addrs, -1)
		for stop := 0; stop <= full; stop++ {
			t.Run(fmt.Sprintf("%v/stopped after %d", voters, stop), func(t *testing.T) {
				m := core.NewMachine()
				adoptOn(t, m, cs, addrs, stop)
				adoptOn(t, m, cs, addrs, -1) // the next leader resumes
				var got []string
				for _, mb := range m.Members() {
					got = append(got, fmt.Sprintf("%d=%s/%s", mb.NodeID, mb.Address, mb.Role))
				}
				var want []string
				for _, id := range voters {
					want = append(want, fmt.Sprintf("%d=%s/voter", id, addrs[id]))
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("members %v, want %v", got, want)
				}
				st := m.ControlState()
				if st.LastNodeID != voters[len(voters)-1] || len(st.Issued) != int(st.LastNodeID) || len(st.Retired) != int(st.LastNodeID)-len(voters) {
					t.Fatalf("issued %v retired %v last %d", st.Issued, st.Retired, st.LastNodeID)
				}
			})
		}
	}
}

// Through the Plane: adoption runs on the first admin request, once; a
// control-plane cluster is left alone; after it a replacement can be
// prepared as in any control-plane cluster.
func TestAdoptStatic(t *testing.T) {
	n := newFakeNode()
	n.cs = raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	p := New(Config{ID: 1, Node: n, Leadership: &fakeLeadership{}, Addresses: staticAddrs(1, 2, 3), Logger: testkit.QuietLogger()})
	ctx := context.Background()
	if e := p.adoptStatic(ctx); e != nil {
		t.Fatal(e)
	}
	proposed := len(n.proposed)
	if got := fmt.Sprint(p.Members()); got != "[{1 1 127.0.0.1:7001 voter} {2 2 127.0.0.1:7002 voter} {3 3 127.0.0.1:7003 voter}]" {
		t.Fatalf("members %s", got)
	}
	if e := p.adoptStatic(ctx); e != nil || len(n.proposed) != proposed {
		t.Fatalf("second adoption: %v, %d more proposals", e, len(n.proposed)-proposed)
	}
	var res core.Result
	n.View(func(m *core.Machine) { res = m.Apply(core.PrepareReplacement(2, "127.0.0.1:7004")) })
	if res.Kind != core.ResultReplacementPrepared || res.NodeID != 4 {
		t.Fatalf("replacement after adoption: %+v", res)
	}

	cp := newFakeNode()
	cp.m.Apply(core.Bootstrap(hashCredential("boot"), "127.0.0.1:7001"))
	p2 := New(Config{ID: 1, Node: cp, Leadership: &fakeLeadership{}, Addresses: staticAddrs(1), Logger: testkit.QuietLogger()})
	if e := p2.adoptStatic(ctx); e != nil || len(cp.proposed) != 0 {
		t.Fatalf("adoption on a control-plane cluster: %v, %d proposals", e, len(cp.proposed))
	}
}
