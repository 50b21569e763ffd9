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
		var (
			bootstrapped bool
			members      []core.Member
			repl         core.Replacement
			pending      bool
		)
		p.cfg.Node.View(func(m *core.Machine) {
			bootstrapped = m.Bootstrapped()
			members = m.Members()
			repl, pending = m.PendingReplacement()
		})
		if !bootstrapped {
			continue
		}
		cs := p.cfg.Node.ConfState()
		if len(cs.VotersOutgoing) > 0 || time.Since(lastChange) < time.Second && lastChange != (time.Time{}) {
			// In a joint configuration (raft leaves it by itself), or a
			// change was just proposed: wait for it to apply.
			if len(cs.VotersOutgoing) == 0 && confMatches(cs, members) {
				lastChange = time.Time{}
			}
			continue
		}
		if cc, ok := confChangeFor(cs, members); ok {
			ctx, cancel := context.WithTimeout(bgCtx, time.Second)
			if err := p.cfg.Node.ProposeConfChange(ctx, cc); err != nil {
				p.log.Warn("propose membership change", "err", err)
			} else {
				p.log.Info("membership change proposed", "changes", cc.String())
				lastChange = time.Now()
			}
			cancel()
			continue
		}
		for _, m := range members {
			if m.Role != core.RoleLearner || (pending && repl.New == m.NodeID) {
				continue
			}
			if !p.caughtUp(m.NodeID) || time.Since(lastPromote[m.NodeID]) < time.Second {
				continue
			}
			lastPromote[m.NodeID] = time.Now()
			ctx, cancel := context.WithTimeout(bgCtx, TimeoutDefault)
			a, err := p.cfg.Node.Propose(ctx, core.Promote(m.NodeID, m.Incarnation))
			cancel()
			if err != nil {
				p.log.Warn("promote learner", "node", m.NodeID, "err", err)
			} else {
				p.log.Info("learner caught up; promoted", "node", m.NodeID, "result", a.Result.String())
			}
			break // one promotion per round: the next one waits for its conf change
		}
	}
}

func confMatches(cs raftpb.ConfState, members []core.Member) bool {
	_, ok := confChangeFor(cs, members)
	return !ok
}

// confChangeFor returns the one ConfChangeV2 that moves cs to the
// membership of the control state (joint consensus when it changes more
// than one voter at a time), and false when they already agree.
func confChangeFor(cs raftpb.ConfState, members []core.Member) (raftpb.ConfChangeV2, bool) {
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
		case m.Role == core.RoleVoter && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: m.NodeID})
		case m.Role == core.RoleLearner && !in(cs.Learners, m.NodeID) && !in(cs.Voters, m.NodeID):
			cc.Changes = append(cc.Changes, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: m.NodeID})
		}
	}
	for _, id := range append(append([]uint64(nil), cs.Voters...), cs.Learners...) {
		if !want[id] {
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
// (control mode): retired or removed ids are dropped, so their
// connections are refused from then on.
func (p *Plane) syncPeers() {
	if p.cfg.Peers == nil {
		return
	}
	var members []core.Member
	var bootstrapped bool
	p.cfg.Node.View(func(m *core.Machine) { members, bootstrapped = m.Members(), m.Bootstrapped() })
	if !bootstrapped {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	want := map[uint64]string{}
	for _, m := range members {
		if m.NodeID != p.cfg.ID {
			want[m.NodeID] = m.Address
		}
	}
	for id := range p.addrs {
		if _, ok := want[id]; !ok && id != p.cfg.ID {
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
