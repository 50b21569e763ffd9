package control

import (
	"context"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/peer"
)

// The daemon's parts satisfy the interfaces (the Node check is in
// control.go).
var (
	_ Leadership = (*lockservice.Service)(nil)
	_ Peers      = (*peer.Transport)(nil)
)

// fakeNode applies proposals to a real core.Machine at once, as a
// one-voter raft would, and applies conf changes to its ConfState.
type fakeNode struct {
	mu          sync.Mutex
	m           *core.Machine
	index       uint64
	leader      uint64
	cs          raftpb.ConfState
	status      raft.Status
	proposeErr  error // returned by Propose instead of applying
	proposed    []core.Command
	confChanges []raftpb.ConfChangeV2
}

var _ Node = (*fakeNode)(nil)

func newFakeNode() *fakeNode {
	return &fakeNode{m: core.NewMachine(), leader: 1, cs: raftpb.ConfState{Voters: []uint64{1}}}
}

func (n *fakeNode) Leader() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leader
}

func (n *fakeNode) View(f func(m *core.Machine)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n.m)
}

func (n *fakeNode) ConfState() raftpb.ConfState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cs
}

func (n *fakeNode) Status() raft.Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.status
}

func (n *fakeNode) setStatus(st raft.Status) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.status = st
}

func (n *fakeNode) Propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proposeErr != nil {
		return raftstore.Applied{}, n.proposeErr
	}
	n.proposed = append(n.proposed, cmd)
	n.index++
	return raftstore.Applied{Index: n.index, Term: 1, Command: cmd, Result: n.m.Apply(cmd)}, nil
}

func (n *fakeNode) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeV2) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.confChanges = append(n.confChanges, cc)
	remove := func(ids []uint64, id uint64) []uint64 {
		var out []uint64
		for _, x := range ids {
			if x != id {
				out = append(out, x)
			}
		}
		return out
	}
	for _, c := range cc.Changes {
		n.cs.Voters, n.cs.Learners = remove(n.cs.Voters, c.NodeID), remove(n.cs.Learners, c.NodeID)
		switch c.Type {
		case raftpb.ConfChangeAddNode:
			n.cs.Voters = append(n.cs.Voters, c.NodeID)
		case raftpb.ConfChangeAddLearnerNode:
			n.cs.Learners = append(n.cs.Learners, c.NodeID)
		}
	}
	return nil
}

func (n *fakeNode) conf() (raftpb.ConfState, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cs, len(n.confChanges)
}

type fakeLeadership struct{ leader atomic.Bool }

func (l *fakeLeadership) IsLeader() bool { return l.leader.Load() }

// fakePeers records the transport's address book.
type fakePeers struct {
	mu    sync.Mutex
	addrs map[uint64]string
}

func (p *fakePeers) AddPeer(id uint64, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.addrs[id] = addr
}

func (p *fakePeers) RemovePeer(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.addrs, id)
}

func (p *fakePeers) get(id uint64) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.addrs[id]
	return a, ok
}

func (n *fakeNode) ReadIndex(ctx context.Context) error { return ctx.Err() }

func (n *fakeNode) ViewIndexed(f func(m *core.Machine, index uint64)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n.m, n.index)
}

func (n *fakeNode) Term() uint64 { return 1 }
