package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// ErrRemoved: this member was removed from the cluster for good (retired,
// or replaced by another node), as etcd's removed member says. It never
// comes back under this identity; `ticketd serve` exits with its own
// status on it, so a supervisor can tell it from a crash.
var ErrRemoved = errors.New("daemon: the member has been permanently removed from the cluster")

// How a running member notices it was removed.
const (
	// removedCheckInterval spaces the checks of the node's own applied
	// state (retired, or no longer in the raft membership it was in).
	removedCheckInterval = 250 * time.Millisecond
	// removedProbeElections: after this many election timeouts without a
	// leader, the node asks the cluster over NATS whether the leader still
	// counts it as a member (the case of a node that was down while it
	// was removed, and never applied its removal: its peers just refuse
	// it). removedProbeInterval spaces those questions.
	removedProbeElections = 10
	removedProbeInterval  = 2 * time.Second
	// removedProbeTimeout bounds one status request of the probe.
	removedProbeTimeout = time.Second
	// removedStartWait bounds Start's wait for the entries committed
	// before the last stop to apply, so their removal is seen at once.
	removedStartWait = 5 * time.Second
)

// removal is the daemon's record of its removal: set once, read by Err.
type removal struct {
	mu     sync.Mutex
	err    error         // nil until removed
	done   chan struct{} // closed by markRemoved
	stop   chan struct{} // closed by Close: ends the watcher
	exited chan struct{} // closed when the watcher returns
}

func newRemoval() *removal {
	return &removal{done: make(chan struct{}), stop: make(chan struct{}), exited: make(chan struct{})}
}

// markRemoved records the removal (the first reason wins) and logs it.
func (d *Daemon) markRemoved(reason string) {
	d.removal.mu.Lock()
	defer d.removal.mu.Unlock()
	if d.removal.err != nil {
		return
	}
	d.removal.err = fmt.Errorf("%w: %s", ErrRemoved, reason)
	d.log.Error("the member has been permanently removed from the cluster; stopping (replace it with a new node, never restart it under this identity)", "reason", reason)
	close(d.removal.done)
}

// removedErr is the removal, nil if none.
func (d *Daemon) removedErr() error {
	d.removal.mu.Lock()
	defer d.removal.mu.Unlock()
	return d.removal.err
}

// ownIncarnation is the incarnation this node was issued (0 on a static
// member, which has none).
func (d *Daemon) ownIncarnation() uint64 {
	id, ok, err := control.ReadIdentity(d.cfg.Data)
	if err != nil || !ok || id.NodeID != d.cfg.ID {
		return 0
	}
	return id.Incarnation
}

// retiredLocally tells why the applied control state says this node is no
// longer a member ("" if it does not): its NodeID retired, or, for a node
// with an issued incarnation, the NodeID a member under another one.
func (d *Daemon) retiredLocally(inc uint64) string {
	var err error
	var bootstrapped bool
	d.node.View(func(m *core.Machine) {
		if bootstrapped = m.Bootstrapped(); bootstrapped {
			err = m.CheckIdentity(d.cfg.ID, inc)
		}
	})
	switch {
	case !bootstrapped || err == nil:
		return ""
	case errors.Is(err, core.ErrNodeRetired):
		return fmt.Sprintf("the replicated control state retired node %d", d.cfg.ID)
	case inc != 0 && errors.Is(err, core.ErrStaleIncarnation):
		return fmt.Sprintf("the replicated control state has node %d under another incarnation than %d", d.cfg.ID, inc)
	}
	return ""
}

// inConf reports whether id is in cs, in any role.
func inConf(cs raftpb.ConfState, id uint64) bool {
	for _, ids := range [][]uint64{cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext} {
		if slices.Contains(ids, id) {
			return true
		}
	}
	return false
}

// checkNotRemoved refuses to start a node whose own applied state says it
// was removed. It first lets the node apply what its log had committed
// before it stopped (for at most removedStartWait): the removal may be
// among those entries. Past that, the watcher still finds it.
func (d *Daemon) checkNotRemoved(ctx context.Context) error {
	if hs, _, err := d.store.InitialState(); err == nil && hs.Commit > 0 {
		ctx, cancel := context.WithTimeout(ctx, removedStartWait)
		defer cancel()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for d.node.AppliedIndex() < hs.Commit {
			select {
			case <-ctx.Done():
			case <-d.node.Done():
			case <-t.C:
				continue
			}
			break
		}
	}
	if why := d.retiredLocally(d.ownIncarnation()); why != "" {
		return fmt.Errorf("%w: %s", ErrRemoved, why)
	}
	return nil
}

// watchRemoval runs until Close, and marks the node removed when it
// learns so: from its own applied state (retired; or out of the raft
// membership it was in), or, after a long time without a leader, from the
// leader's status over NATS (a member that was down while it was removed
// never applies its removal, and its peers just refuse it).
func (d *Daemon) watchRemoval() {
	defer close(d.removal.exited)
	inc := d.ownIncarnation()
	election := time.Duration(d.cfg.TickMS*d.cfg.ElectionTicks) * time.Millisecond
	probeAfter := removedProbeElections * election
	t := time.NewTicker(removedCheckInterval)
	defer t.Stop()
	var wasMember bool
	leaderSeen, lastProbe := time.Now(), time.Time{}
	for {
		select {
		case <-d.removal.stop:
			return
		case <-d.node.Done():
			return
		case <-t.C:
		}
		if why := d.retiredLocally(inc); why != "" {
			d.markRemoved(why)
			return
		}
		cs := d.node.ConfState()
		switch member := inConf(cs, d.cfg.ID); {
		case member:
			wasMember = true
		case wasMember && len(cs.Voters) > 0:
			d.markRemoved(fmt.Sprintf("the raft membership no longer includes node %d (voters %v, learners %v)", d.cfg.ID, cs.Voters, cs.Learners))
			return
		}
		if d.node.Leader() != 0 {
			leaderSeen = time.Now()
			continue
		}
		// Only a node that counts itself a member can have been removed
		// (a joining node does not, until it applies its admission).
		if !wasMember || time.Since(leaderSeen) < probeAfter || time.Since(lastProbe) < removedProbeInterval {
			continue
		}
		lastProbe = time.Now()
		if why := d.removedByLeader(); why != "" {
			d.markRemoved(why)
			return
		}
	}
}

// removedByLeader asks the cluster, over NATS, for the leader's view, and
// tells why it shows this node removed ("" if it does not, or if there is
// no clear answer): a ready leader of this cluster, ahead of this node,
// whose membership does not include it. Removal is the only way a member
// leaves a cluster's membership, and it is permanent.
func (d *Daemon) removedByLeader() string {
	if d.nc == nil {
		return ""
	}
	ask := func(subject string) *protocol.StatusReply {
		ctx, cancel := context.WithTimeout(context.Background(), removedProbeTimeout)
		defer cancel()
		msg, err := d.nc.RequestWithContext(ctx, subject, []byte("{}"))
		if err != nil {
			return nil
		}
		var st protocol.StatusReply
		if protocol.ParseReply(msg.Data, &st) != nil {
			return nil
		}
		return &st
	}
	first := ask(d.statusSubject())
	if first == nil || first.Leader == 0 || first.Leader == d.cfg.ID {
		return ""
	}
	l := ask(d.cfg.Partition().NodeStatusSubject(first.Leader))
	switch {
	case l == nil || l.ID != first.Leader || l.Leader != l.ID || l.State != "StateLeader":
		return ""
	case d.clusterID != 0 && l.ClusterID != fmt.Sprintf("%016x", d.clusterID):
		return "" // another cluster on the same NATS
	case l.AppliedIndex <= d.node.AppliedIndex():
		return ""
	}
	for _, m := range l.Members {
		if m.ID == d.cfg.ID {
			return ""
		}
	}
	return fmt.Sprintf("the leader, node %d, no longer lists node %d among the members (term %d, applied index %d)", l.ID, d.cfg.ID, l.Term, l.AppliedIndex)
}

// statusSubject is where any node of this node's cluster answers status:
// in a partitioned deployment, its group's (raft ids and member lists
// repeat across groups).
func (d *Daemon) statusSubject() string {
	if p := d.cfg.Partition(); p.Partitioned() {
		return protocol.GroupStatusSubject(p.Group)
	}
	return protocol.SubjectStatus
}
