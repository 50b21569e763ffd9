package control

import (
	"context"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"

	"github.com/ticketd/ticketd/core"
)

// versionCheckInterval spaces the leader's probes of its members'
// versions while the cluster version is below this binary's.
const versionCheckInterval = time.Second

// reconcileLoop runs on every node; while this node is the ready leader it
// raises the cluster version when every member can read a newer one
// (version.go), and in a bootstrapped cluster it makes the raft membership follow the
// replicated control state (the source of truth) and promotes learners
// that have caught up. Doing it from replicated state means a leader
// crash between a control command and its conf change loses nothing: the
// next leader finishes the job.
func (p *Plane) reconcileLoop() {
	defer p.wg.Done()
	t := time.NewTicker(ReconcileIntervalDefault)
	defer t.Stop()
	lastPromote := map[uint64]time.Time{}
	var lastChange, lastVersionCheck time.Time
	// Proposals end when the plane closes, not after their own timeout.
	bgCtx, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()
	go func() {
		<-p.stop
		cancelBG()
	}()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.syncPeers()
		if !p.cfg.Leadership.IsLeader() {
			continue
		}
		if time.Since(lastVersionCheck) >= versionCheckInterval {
			lastVersionCheck = time.Now()
			p.maybeRaiseClusterVersion(bgCtx)
		}
		p.maybeSetFenceKey(bgCtx)
		p.membership.Lock()
		lastChange = p.reconcileMembers(bgCtx, lastChange, lastPromote)
		p.membership.Unlock()
	}
}

// reconcileMembers is one round of the leader's membership work: at most
// one conf change, or else at most one promotion. It returns when the
// last conf change was proposed (lastChange as given if none).
func (p *Plane) reconcileMembers(ctx context.Context, lastChange time.Time, lastPromote map[uint64]time.Time) time.Time {
	var (
		bootstrapped bool
		members      []core.Member
		repl         core.Replacement
		pending      bool
		retired      map[uint64]bool
	)
	p.cfg.Node.View(func(m *core.Machine) {
		bootstrapped = m.Bootstrapped()
		members = m.Members()
		repl, pending = m.PendingReplacement()
		retired = retiredSet(m)
	})
	if !bootstrapped {
		return lastChange
	}
	cs := p.cfg.Node.ConfState()
	if len(cs.VotersOutgoing) > 0 || time.Since(lastChange) < time.Second && lastChange != (time.Time{}) {
		// In a joint configuration (raft leaves it by itself), or a
		// change was just proposed: wait for it to apply.
		if len(cs.VotersOutgoing) == 0 && confMatches(cs, members, retired) {
			lastChange = time.Time{}
		}
		return lastChange
	}
	if cc, ok := confChangeFor(cs, members, retired); ok {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := p.cfg.Node.ProposeConfChange(cctx, cc); err != nil {
			p.log.Warn("propose membership change", "err", err)
			return lastChange
		}
		p.log.Info("membership change proposed", "changes", cc.String())
		return time.Now()
	}
	for _, m := range members {
		if m.Role != core.RoleLearner || (pending && repl.New == m.NodeID) || m.Address == placeholderAddress {
			continue
		}
		if !p.caughtUp(m.NodeID) || time.Since(lastPromote[m.NodeID]) < time.Second {
			continue
		}
		lastPromote[m.NodeID] = time.Now()
		pctx, cancel := context.WithTimeout(ctx, TimeoutDefault)
		a, err := p.cfg.Node.Propose(pctx, core.Promote(m.NodeID, m.Incarnation))
		cancel()
		if err != nil {
			p.log.Warn("promote learner", "node", m.NodeID, "err", err)
		} else {
			p.log.Info("learner caught up; promoted", "node", m.NodeID, "result", a.Result.String())
		}
		break // one promotion per round: the next one waits for its conf change
	}
	return lastChange
}

// retiredSet is the set of retired NodeIDs of m's control state.
func retiredSet(m *core.Machine) map[uint64]bool {
	cs := m.ControlState()
	out := make(map[uint64]bool, len(cs.Retired))
	for _, x := range cs.Retired {
		out[x.NodeID] = true
	}
	return out
}

func confMatches(cs raftpb.ConfState, members []core.Member, retired map[uint64]bool) bool {
	_, ok := confChangeFor(cs, members, retired)
	return !ok
}

// confChangeFor returns the one ConfChangeV2 that moves cs to the
// membership of the control state (joint consensus when it changes more
// than one voter at a time), and false when they already agree. It
// removes a raft member only once the control state retired it: a raft
// member the control state never issued is a static voter that adoption
// (static.go) has not recorded yet, and removing it would cost the
// cluster a voter it still counts on. A placeholder of an id a static
// list skipped is never added.
func confChangeFor(cs raftpb.ConfState, members []core.Member, retired map[uint64]bool) (raftpb.ConfChangeV2, bool) {
	in := func(ids []uint64, id uint64) bool {
		for _, x := range ids {
			if x == id {
				return true
			}
		}
		return false
	}
	var cc raftpb.ConfChangeV2
	want := map[uint64]bool{}
	for _, m := range members {
		want[m.NodeID] = true
		switch {
		case m.Address == placeholderAddress:
		case m.Role == core.RoleVoter && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: m.NodeID})
		case m.Role == core.RoleLearner && !in(cs.Learners, m.NodeID) && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: m.NodeID})
		}
	}
	for _, id := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if !want[id] && retired[id] {
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: id})
		}
	}
	if len(cc.Changes) == 0 {
		return cc, false
	}
	if len(cc.Changes) > 1 {
		cc.Transition = raftpb.ConfChangeTransitionJointImplicit
	}
	return cc, true
}

// caughtUp reports whether a learner is alive and replicating, with its
// log within PromoteLagDefault of the leader's commit index. Match > 0 and
// the replicate state matter: a learner that never answered has Match 0,
// which a young log's small commit index would otherwise count as caught
// up, and promoting a dead learner can cost the quorum.
func (p *Plane) caughtUp(id uint64) bool {
	st := p.cfg.Node.Status()
	pr, ok := st.Progress[id]
	return ok && pr.Match > 0 && pr.RecentActive && pr.State == tracker.StateReplicate &&
		pr.Match+PromoteLagDefault >= st.Commit
}

// syncPeers makes the peer transport dial exactly the current members
// (control mode), and the raft members not yet recorded in the control
// state (a static cluster being adopted): retired or removed ids are
// dropped, so their connections are refused from then on.
func (p *Plane) syncPeers() {
	if p.cfg.Peers == nil {
		return
	}
	var members []core.Member
	var bootstrapped bool
	var retired map[uint64]bool
	p.cfg.Node.View(func(m *core.Machine) {
		members, bootstrapped = m.Members(), m.Bootstrapped()
		if bootstrapped {
			retired = retiredSet(m)
		}
	})
	if !bootstrapped {
		return
	}
	inRaft := map[uint64]bool{}
	cs := p.cfg.Node.ConfState()
	for _, ids := range [][]uint64{cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext} {
		for _, id := range ids {
			inRaft[id] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	want := map[uint64]string{}
	for _, m := range members {
		if m.NodeID != p.cfg.ID && m.Address != placeholderAddress {
			want[m.NodeID] = m.Address
		}
	}
	for id := range p.addrs {
		// A static voter adoption has not recorded yet is still dialed.
		keep := inRaft[id] && !retired[id]
		if _, ok := want[id]; !ok && id != p.cfg.ID && !keep {
			p.cfg.Peers.RemovePeer(id)
			delete(p.addrs, id)
		}
	}
	for id, addr := range want {
		if p.addrs[id] != addr {
			p.cfg.Peers.AddPeer(id, addr)
			p.addrs[id] = addr
		}
	}
}
