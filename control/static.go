package control

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// Static clusters under the control plane.
//
// A static cluster (--initial-cluster) starts with raft voters and an
// empty control state. The first admin request that needs members on
// such a cluster (members, mint-join, a replacement, a retirement) first
// records its voters in the control state with the very commands a
// control-plane cluster is built from, so nothing in core changes:
//
//	Bootstrap(adoption marker, address of 1)       node 1, a voter
//	for each next id up to the highest static id:
//	  MintJoin(h) + Admit(h, its address)          issued as a learner...
//	  Promote                                      ...a voter again, as raft has it
//	  (or, for an id the static list skips: Admit at placeholderAddress, then Retire)
//
// From then on the cluster is managed exactly like a control-plane one.
// Every step is a committed command, so a leader that dies half way leaves
// a state the next admin request resumes from (adoptionStep reads where it
// stands). The partial states are harmless: reconcile removes a raft
// member only once it is retired (an unadopted static voter stays), and
// syncPeers keeps dialing raft members it has an address for.

// placeholderAddress is the address of an id a static member list skips
// while it is issued and retired during adoption. ".invalid" never
// resolves (RFC 2606); reconcile never adds such a member to raft nor
// dials it.
const placeholderAddress = "skipped-node-id.invalid:1"

// adoptionMarker is the bootstrap credential hash of an adopted static
// cluster. It names no credential anyone holds: once bootstrapped the
// replicated state refuses every bootstrap, and it treats the hash as
// consumed for joins.
func adoptionMarker() [32]byte {
	return sha256.Sum256([]byte("ticketd: static member list adopted by the control plane"))
}

// adoptionAction is what adoption does next.
type adoptionAction uint8

const (
	adoptDone      adoptionAction = iota // every static voter is a member
	adoptBootstrap                       // Bootstrap node 1 at addr
	adoptAdmit                           // MintJoin + Admit the next id at addr
	adoptPromote                         // Promote node/inc (a static voter admitted as a learner)
	adoptRetire                          // Retire node/inc (a skipped id's placeholder)
)

// adoptionStep is one step of adoption: the action and its arguments.
type adoptionStep struct {
	action    adoptionAction
	node, inc uint64
	addr      string
}

// nextAdoptionStep says what adoption does next, given the applied control
// state, the raft membership and the known peer addresses. It is pure, so
// every partial state can be tested. An error says why this cluster
// cannot be adopted (nothing has been proposed then).
func nextAdoptionStep(st core.ControlState, cs raftpb.ConfState, addrs map[uint64]string) (adoptionStep, error) {
	if !st.Bootstrapped {
		switch {
		case len(cs.Voters) < 2 && len(cs.VotersOutgoing) == 0:
			// A single node is not a static cluster: it is bootstrapped
			// (ticketd admin bootstrap), and until then the control state
			// itself answers not_bootstrapped.
			return adoptionStep{action: adoptDone}, nil
		case len(cs.VotersOutgoing) > 0 || len(cs.Learners) > 0 || len(cs.LearnersNext) > 0:
			return adoptionStep{}, fmt.Errorf("the raft membership is changing (voters %v, learners %v); retry", cs.Voters, cs.Learners)
		case !slices.Contains(cs.Voters, 1):
			return adoptionStep{}, fmt.Errorf("static member ids %v do not include 1: the control plane's first member is always node 1, so this cluster cannot be managed by it (restore a backup into a control-plane cluster instead)", cs.Voters)
		case slices.Max(cs.Voters) > core.MaxControlNodes:
			return adoptionStep{}, fmt.Errorf("static member id %d is above %d, the most ids the control state issues", slices.Max(cs.Voters), core.MaxControlNodes)
		}
		for _, id := range cs.Voters {
			if err := core.ValidateAddress(addrs[id]); err != nil {
				return adoptionStep{}, fmt.Errorf("static member %d has no usable peer address here (%v): start this node with the full --initial-cluster", id, err)
			}
		}
		return adoptionStep{action: adoptBootstrap, node: 1, addr: addrs[1]}, nil
	}
	if st.BootstrapHash != adoptionMarker() {
		return adoptionStep{action: adoptDone}, nil // a control-plane cluster
	}
	pendingNew := uint64(0)
	if st.Pending != nil {
		pendingNew = st.Pending.New
	}
	for _, m := range st.Members {
		if m.Address == placeholderAddress {
			return adoptionStep{action: adoptRetire, node: m.NodeID, inc: m.Incarnation}, nil
		}
	}
	for _, m := range st.Members {
		if m.Role == core.RoleLearner && m.NodeID != pendingNew && slices.Contains(cs.Voters, m.NodeID) {
			return adoptionStep{action: adoptPromote, node: m.NodeID, inc: m.Incarnation}, nil
		}
	}
	issued := make(map[uint64]bool, len(st.Issued))
	for _, x := range st.Issued {
		issued[x.NodeID] = true
	}
	var unissued []uint64
	for _, id := range cs.Voters {
		if !issued[id] {
			unissued = append(unissued, id)
		}
	}
	if len(unissued) == 0 {
		return adoptionStep{action: adoptDone}, nil
	}
	next := st.LastNodeID + 1
	if lowest := slices.Min(unissued); lowest < next {
		return adoptionStep{}, fmt.Errorf("static member %d cannot be adopted: the control state has issued ids up to %d", lowest, st.LastNodeID)
	}
	if !slices.Contains(unissued, next) {
		return adoptionStep{action: adoptAdmit, node: next, addr: placeholderAddress}, nil
	}
	if err := core.ValidateAddress(addrs[next]); err != nil {
		return adoptionStep{}, fmt.Errorf("static member %d has no usable peer address here (%v)", next, err)
	}
	return adoptionStep{action: adoptAdmit, node: next, addr: addrs[next]}, nil
}

// maxAdoptionSteps bounds one adoption: per id, at most a mint, an admit
// and a promote or retire, plus the bootstrap.
const maxAdoptionSteps = 3*core.MaxControlNodes + 1

// adoptStatic records a static cluster's voters in the control state
// (see the top of this file); it returns at once on a control-plane
// cluster or one already adopted. It runs on the ready leader, holding
// the membership lock so this node's reconcile loop does not act on a
// partial state in between.
func (p *Plane) adoptStatic(ctx context.Context) *Error {
	p.membership.Lock()
	defer p.membership.Unlock()
	for i := 0; i < maxAdoptionSteps; i++ {
		var st core.ControlState
		p.cfg.Node.View(func(m *core.Machine) { st = m.ControlState() })
		step, err := nextAdoptionStep(st, p.cfg.Node.ConfState(), p.addresses())
		if err != nil {
			return &Error{Code: CodeInvalid, Message: err.Error()}
		}
		var cmds []core.Command
		switch step.action {
		case adoptDone:
			if i > 0 {
				p.log.Info("static members recorded in the control state; the control plane now manages them", "members", len(st.Members))
			}
			return nil
		case adoptBootstrap:
			cmds = []core.Command{core.Bootstrap(adoptionMarker(), step.addr)}
		case adoptPromote:
			cmds = []core.Command{core.Promote(step.node, step.inc)}
		case adoptRetire:
			cmds = []core.Command{core.Retire(step.node, step.inc)}
		case adoptAdmit:
			// A random hash nobody holds the credential of: admitted at
			// once, and useless to anyone if the admit never comes.
			var raw [32]byte
			if _, err := rand.Read(raw[:]); err != nil {
				return &Error{Code: CodeUnavailable, Message: err.Error()}
			}
			h := sha256.Sum256(raw[:])
			cmds = []core.Command{core.MintJoin(h), core.Admit(h, step.addr)}
		}
		for _, cmd := range cmds {
			res, cerr := p.proposeCtx(ctx, cmd)
			if cerr != nil {
				cerr.Message = "recording the static members in the control state: " + cerr.Message
				return cerr
			}
			if cmd.Control.Op == core.ControlAdmit && res.NodeID != step.node {
				return &Error{Code: CodeUnavailable, Message: fmt.Sprintf("recording the static members: node %d was issued where %d was expected", res.NodeID, step.node)}
			}
		}
	}
	return &Error{Code: CodeUnavailable, Message: "recording the static members did not finish"}
}

// adopting runs h after adoptStatic: the admin endpoints that work on
// members work on a static cluster as on a control-plane one.
func (p *Plane) adopting(h handlerFunc) handlerFunc {
	return func(r *http.Request, req Request) (Reply, *Error) {
		if e := p.adoptStatic(r.Context()); e != nil {
			return Reply{}, e
		}
		return h(r, req)
	}
}

// addresses is a copy of the peer addresses this node knows.
func (p *Plane) addresses() map[uint64]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[uint64]string, len(p.addrs))
	for id, a := range p.addrs {
		out[id] = a
	}
	return out
}
