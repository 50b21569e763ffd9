package control

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

func TestClusterVersionRaisedOnlyWhenEveryMemberReadsIt(t *testing.T) {
	errDown := errors.New("no responders")
	tests := []struct {
		name    string
		cs      raftpb.ConfState
		probe   VersionProbe // nil: no probe set
		reports map[uint64]uint64
		down    uint64
		want    uint64 // the cluster version afterwards
	}{
		{name: "alone, no probe needed", cs: raftpb.ConfState{Voters: []uint64{1}}, want: core.MaxClusterVersion},
		{name: "members but no probe", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, want: 1},
		{name: "every member reads 2", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, reports: map[uint64]uint64{2: 2, 3: 2}, want: 2},
		{name: "every member reads 3", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, reports: map[uint64]uint64{2: 3, 3: 3}, want: 3},
		{name: "a member reads only 2", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, reports: map[uint64]uint64{2: 3, 3: 2}, want: 2},
		{name: "one voter is older", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, reports: map[uint64]uint64{2: 2, 3: 1}, want: 1},
		{name: "an older learner holds it back", cs: raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{4}}, reports: map[uint64]uint64{2: 2, 4: 1}, want: 1},
		{name: "a member does not answer", cs: raftpb.ConfState{Voters: []uint64{1, 2, 3}}, reports: map[uint64]uint64{2: 2}, down: 3, want: 1},
		{name: "a newer member does not raise it past this binary", cs: raftpb.ConfState{Voters: []uint64{1, 2}}, reports: map[uint64]uint64{2: 7}, want: core.MaxClusterVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode()
			n.cs = tc.cs
			p := New(Config{ID: 1, Node: n})
			if tc.reports != nil || tc.down != 0 {
				p.SetVersionProbe(func(ctx context.Context, id uint64) (uint64, error) {
					if id == tc.down {
						return 0, errDown
					}
					v, ok := tc.reports[id]
					if !ok {
						t.Fatalf("probed %d, which is not a member", id)
					}
					return v, nil
				})
			}
			p.maybeRaiseClusterVersion(context.Background())
			var got uint64
			n.View(func(m *core.Machine) { got = m.ClusterVersion() })
			if got != tc.want {
				t.Fatalf("cluster version %d, want %d (proposed %v)", got, tc.want, n.proposed)
			}
			// Once raised, nothing more is proposed.
			before := len(n.proposed)
			p.maybeRaiseClusterVersion(context.Background())
			if got == core.MaxClusterVersion && len(n.proposed) != before {
				t.Fatalf("proposed again at the newest version: %v", n.proposed)
			}
		})
	}
}
