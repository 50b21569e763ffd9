package natsapi

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// statusNode is a StatusNode with a fixed view.
type statusNode struct {
	state raft.StateType
	cs    raftpb.ConfState
}

func (n statusNode) Status() raft.Status {
	var st raft.Status
	st.RaftState, st.Term, st.Lead = n.state, 3, 2
	return st
}
func (n statusNode) ConfState() raftpb.ConfState { return n.cs }
func (n statusNode) Summary() raftstore.Summary  { return raftstore.Summary{Applied: 7} }

type lowDisk struct{}

func (lowDisk) Err() error        { return errors.New("low") }
func (lowDisk) FreeBytes() uint64 { return 1 << 20 }

// TestStatusRole: status names a learner a learner (raft calls it a
// follower), and says which binary answers, in which cluster, with which
// alarms.
func TestStatusRole(t *testing.T) {
	srv := singleNode(t) // raft id 1
	tests := []struct {
		name  string
		state raft.StateType
		cs    raftpb.ConfState
		want  string
	}{
		{"voter", raft.StateFollower, raftpb.ConfState{Voters: []uint64{1, 2}}, RoleFollower},
		{"learner", raft.StateFollower, raftpb.ConfState{Voters: []uint64{2}, Learners: []uint64{1}}, RoleLearner},
		{"learner being promoted", raft.StateFollower, raftpb.ConfState{Voters: []uint64{2}, VotersOutgoing: []uint64{2}, LearnersNext: []uint64{1}}, RoleLearner},
		{"leader", raft.StateLeader, raftpb.ConfState{Voters: []uint64{1}}, RoleLeader},
		{"pre-candidate", raft.StatePreCandidate, raftpb.ConfState{Voters: []uint64{1, 2}}, RolePreCandidate},
		{"candidate", raft.StateCandidate, raftpb.ConfState{Voters: []uint64{1, 2}}, RoleCandidate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{cfg: Config{Locks: srv, Node: statusNode{tc.state, tc.cs}, ClusterID: 0xabc, Disk: lowDisk{}}, log: testkit.QuietLogger()}
			st := s.status()
			if st.Role != tc.want {
				t.Fatalf("role %q, want %q", st.Role, tc.want)
			}
			if st.Version == "" || st.ClusterID != "0000000000000abc" || len(st.Alarms) != 1 || st.Alarms[0] != AlarmNoSpace {
				t.Fatalf("version %q, cluster_id %q, alarms %v", st.Version, st.ClusterID, st.Alarms)
			}
		})
	}
}
