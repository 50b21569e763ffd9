package natsapi

import (
	"context"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// StatusNode is what the status endpoints read from the raft node.
type StatusNode interface {
	Status() raft.Status
	ConfState() raftpb.ConfState
	Summary() raftstore.Summary
}

var _ StatusNode = (*raftstore.Node)(nil)

// DiskStatus is what status reports about the store's disk.
type DiskStatus interface {
	Err() error
	FreeBytes() uint64
}

var _ DiskStatus = (*raftstore.DiskGuard)(nil)

// AlarmNoSpace is the status alarm of a node whose disk is low.
const AlarmNoSpace = "nospace"

// status is this node's view of the cluster, assembled from the raft node,
// the peer addresses and the loaded plugins.
func (s *Service) status() protocol.StatusReply {
	node := s.cfg.Node
	st := node.Status()
	cs := node.ConfState()
	out := protocol.StatusReply{
		ID:          s.cfg.Locks.ID(),
		Leader:      st.Lead,
		Term:        st.Term,
		State:       st.RaftState.String(),
		Role:        roleOf(st.RaftState, s.cfg.Locks.ID(), cs),
		Version:     binaryVersion(),
		CommitIndex: st.Commit,
	}
	if s.cfg.ClusterID != 0 {
		out.ClusterID = fmt.Sprintf("%016x", s.cfg.ClusterID)
	}
	out.MaxClusterVersion = s.cfg.MaxClusterVersion
	out.Group, out.Groups = s.group(), s.cfg.Partition.Groups
	// The summary is published by the raft loop once per applied index:
	// status takes no lock the apply path waits on and does no work
	// proportional to the table, so callers cannot slow lock traffic.
	sum := node.Summary()
	out.AppliedIndex = sum.Applied
	out.Locks = sum.Locks
	out.LastToken = sum.LastToken
	out.ClusterVersion = sum.ClusterVersion
	out.Digest = hex.EncodeToString(sum.Digest[:])
	if d := s.cfg.Disk; d != nil {
		out.DiskFreeBytes = d.FreeBytes()
		if d.Err() != nil {
			out.Alarms = append(out.Alarms, AlarmNoSpace)
		}
	}
	if s.cfg.Plugins != nil {
		for _, p := range s.cfg.Plugins.Plugins() {
			out.Plugins = append(out.Plugins, protocol.PluginInfo{Name: p.Name(), SHA256: p.SHA256()})
		}
	}
	add := func(id uint64, voter bool) {
		m := protocol.Member{ID: id, Voter: voter}
		if s.cfg.MemberAddr != nil {
			m.Address = s.cfg.MemberAddr(id)
		}
		if pr, ok := st.Progress[id]; ok {
			m.Match, m.Next = pr.Match, pr.Next
		}
		out.Members = append(out.Members, m)
	}
	for _, id := range cs.Voters {
		add(id, true)
	}
	for _, id := range cs.Learners {
		add(id, false)
	}
	return out
}

// Roles in status replies (StatusReply.Role).
const (
	RoleLeader       = "leader"
	RoleFollower     = "follower"
	RoleLearner      = "learner"
	RoleCandidate    = "candidate"
	RolePreCandidate = "pre-candidate"
)

// roleOf names a node's part: raft calls a learner a follower, but a
// learner does not vote, which is what an operator checks.
func roleOf(state raft.StateType, id uint64, cs raftpb.ConfState) string {
	switch state {
	case raft.StateLeader:
		return RoleLeader
	case raft.StateCandidate:
		return RoleCandidate
	case raft.StatePreCandidate:
		return RolePreCandidate
	}
	if slices.Contains(cs.Learners, id) || slices.Contains(cs.LearnersNext, id) {
		return RoleLearner
	}
	return RoleFollower
}

// binaryVersion is this binary's release and VCS revision, as `ticketd
// version` prints them: what an operator compares across members during
// an upgrade. "(devel)" is a build from a source tree, "unknown" a build
// without module information.
func binaryVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && st.Value != "" {
			v += " " + st.Value[:min(12, len(st.Value))]
		}
		if st.Key == "vcs.modified" && st.Value == "true" {
			v += "+dirty"
		}
	}
	return v
}

// MemberVersion asks member id, over its own status subject, for the
// newest cluster version its binary reads; a member whose status does not
// say predates version reporting and reads version 1 only. It serves as
// the control plane's control.VersionProbe.
func (s *Service) MemberVersion(ctx context.Context, id uint64) (uint64, error) {
	m, err := s.cfg.Conn.RequestWithContext(ctx, s.cfg.Partition.NodeStatusSubject(id), []byte("{}"))
	if err != nil {
		return 0, fmt.Errorf("natsapi: status of member %d: %w", id, err)
	}
	var st protocol.StatusReply
	if err := protocol.ParseReply(m.Data, &st); err != nil {
		return 0, fmt.Errorf("natsapi: status of member %d: %w", id, err)
	}
	if st.ID != id {
		return 0, fmt.Errorf("natsapi: member %d's status subject answered as node %d", id, st.ID)
	}
	return max(1, st.MaxClusterVersion), nil
}
