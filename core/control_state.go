package core

import (
	"bytes"
	"fmt"
	"slices"
)

// The replicated control state: its public shape (ControlState and its
// parts), the machine's in-memory form and its helpers, and the read
// accessors on Machine.

// Role is a member's raft role. Values are part of the state encoding.
type Role uint8

// Roles.
const (
	RoleLearner Role = 1
	RoleVoter   Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleLearner:
		return "learner"
	case RoleVoter:
		return "voter"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Member is one current cluster member.
type Member struct {
	NodeID      uint64
	Incarnation uint64
	Address     string
	Role        Role
}

// Identity is a NodeID with the incarnation it was issued with.
type Identity struct {
	NodeID      uint64
	Incarnation uint64
}

// Replacement is the pending replacement of voter Old by learner New.
// Address is New's address.
type Replacement struct {
	Old            uint64
	New            uint64
	NewIncarnation uint64
	Address        string
}

// CredentialState is what the replicated state knows about a credential
// hash. Values are part of the state encoding.
type CredentialState uint8

// Credential states.
const (
	CredentialUnknown  CredentialState = 0
	CredentialMinted   CredentialState = 1
	CredentialConsumed CredentialState = 2
)

func (s CredentialState) String() string {
	switch s {
	case CredentialUnknown:
		return "unknown"
	case CredentialMinted:
		return "minted"
	case CredentialConsumed:
		return "consumed"
	}
	return fmt.Sprintf("credential_state(%d)", uint8(s))
}

// JoinCredential is one minted join credential, by hash.
type JoinCredential struct {
	Hash  [32]byte
	State CredentialState // CredentialMinted or CredentialConsumed
}

// ControlState is the whole replicated control state, as carried by
// snapshots and the control record. Every list is sorted: Members, Issued
// and Retired by NodeID, JoinCredentials by Hash; an empty list is nil.
//
// Invariants (checked by the decoders): before bootstrap everything but
// ClusterVersion and FenceKeys is zero; after it there is at least one
// voter; Issued is exactly Members
// plus Retired, with matching incarnations and no NodeID in both; ids and
// incarnations are non-zero, unique and not above the counters; a pending
// replacement names a current voter (Old) and a current learner (New).
type ControlState struct {
	Bootstrapped  bool
	BootstrapHash [32]byte // SHA-256 of the consumed bootstrap credential
	// LastNodeID and LastIncarnation are the highest ever issued (0 if
	// none): the next node gets LastNodeID+1 and LastIncarnation+1.
	LastNodeID      uint64
	LastIncarnation uint64
	Members         []Member
	Issued          []Identity
	Retired         []Identity
	JoinCredentials []JoinCredential
	Pending         *Replacement // nil when no replacement is pending
	// ClusterVersion is 0 until a SetClusterVersion raised it; the
	// effective version is then at least 2 (version.go).
	ClusterVersion uint64
	// FenceKeys are the seeds of the fence signing keys (fence.go), oldest
	// first, the current one last; at most MaxFenceKeys, none twice; only
	// from cluster version 3. They are secrets.
	FenceKeys []FenceSeed
}

// control is the machine's in-memory control state. The zero value is the
// state before bootstrap; maps are created on first write.
type control struct {
	bootstrapped    bool
	bootstrapHash   [32]byte
	lastNodeID      uint64
	lastIncarnation uint64
	members         map[uint64]Member
	issued          map[uint64]uint64 // NodeID -> incarnation, every identity ever issued
	retired         map[uint64]uint64 // NodeID -> incarnation it was retired with
	creds           map[[32]byte]CredentialState
	pending         *Replacement
	clusterVersion  uint64
	fenceKeys       []fenceKey // oldest first
}

// nextIdentity returns the identity the next issuance gets, or why it
// cannot be issued.
func (c *control) nextIdentity() (id, inc uint64, why ControlReason) {
	if len(c.issued) >= MaxControlNodes || c.lastNodeID == ^uint64(0) || c.lastIncarnation == ^uint64(0) {
		return 0, 0, ReasonLimitReached
	}
	id, inc = c.lastNodeID+1, c.lastIncarnation+1
	// The counters only grow, so neither can be in use; assert it anyway
	// rather than trust a loaded state.
	if _, used := c.issued[id]; used {
		return 0, 0, ReasonIdentityReused
	}
	if _, gone := c.retired[id]; gone {
		return 0, 0, ReasonIdentityReused
	}
	return id, inc, ""
}

// issue records a new identity from nextIdentity as a member.
func (c *control) issue(id, inc uint64, addr string, role Role) {
	if c.members == nil {
		c.members = make(map[uint64]Member)
	}
	if c.issued == nil {
		c.issued = make(map[uint64]uint64)
	}
	c.lastNodeID, c.lastIncarnation = id, inc
	c.issued[id] = inc
	c.members[id] = Member{NodeID: id, Incarnation: inc, Address: addr, Role: role}
}

// retire removes a current member for good.
func (c *control) retire(id uint64) {
	if c.retired == nil {
		c.retired = make(map[uint64]uint64)
	}
	c.retired[id] = c.members[id].Incarnation
	delete(c.members, id)
}

// member finds a current member; inc 0 matches any incarnation.
func (c *control) member(id, inc uint64) (Member, ControlReason) {
	mem, ok := c.members[id]
	switch {
	case ok && (inc == 0 || mem.Incarnation == inc):
		return mem, ""
	case ok:
		return Member{}, ReasonStaleIncarnation
	}
	if _, gone := c.retired[id]; gone {
		return Member{}, ReasonNodeRetired
	}
	return Member{}, ReasonUnknownNode
}

func (c *control) credential(h [32]byte) CredentialState {
	if c.bootstrapped && h == c.bootstrapHash {
		return CredentialConsumed
	}
	return c.creds[h]
}

// addressUsed reports whether a current member other than except uses addr.
func (c *control) addressUsed(addr string, except uint64) bool {
	for id, mem := range c.members {
		if id != except && mem.Address == addr {
			return true
		}
	}
	return false
}

func (c *control) inReplacement(id uint64) bool {
	return c.pending != nil && (c.pending.Old == id || c.pending.New == id)
}

func (c *control) voters() int {
	n := 0
	for _, mem := range c.members {
		if mem.Role == RoleVoter {
			n++
		}
	}
	return n
}

// state returns a sorted deep copy.
func (c *control) state() ControlState {
	cs := ControlState{
		Bootstrapped:    c.bootstrapped,
		BootstrapHash:   c.bootstrapHash,
		LastNodeID:      c.lastNodeID,
		LastIncarnation: c.lastIncarnation,
		ClusterVersion:  c.clusterVersion,
		FenceKeys:       fenceSeeds(c.fenceKeys),
	}
	cs.Members = c.sortedMembers()
	cs.Issued = sortedIdentities(c.issued)
	cs.Retired = sortedIdentities(c.retired)
	for h, s := range c.creds {
		cs.JoinCredentials = append(cs.JoinCredentials, JoinCredential{Hash: h, State: s})
	}
	slices.SortFunc(cs.JoinCredentials, func(a, b JoinCredential) int { return compareHash(a.Hash, b.Hash) })
	if c.pending != nil {
		p := *c.pending
		cs.Pending = &p
	}
	return cs
}

// newControl builds the in-memory state from a validated ControlState.
func newControl(cs ControlState) control {
	c := control{
		bootstrapped:    cs.Bootstrapped,
		bootstrapHash:   cs.BootstrapHash,
		lastNodeID:      cs.LastNodeID,
		lastIncarnation: cs.LastIncarnation,
		clusterVersion:  cs.ClusterVersion,
		fenceKeys:       fenceKeys(cs.FenceKeys),
	}
	if len(cs.Members) > 0 {
		c.members = make(map[uint64]Member, len(cs.Members))
		for _, mem := range cs.Members {
			c.members[mem.NodeID] = mem
		}
	}
	c.issued = identityMap(cs.Issued)
	c.retired = identityMap(cs.Retired)
	if len(cs.JoinCredentials) > 0 {
		c.creds = make(map[[32]byte]CredentialState, len(cs.JoinCredentials))
		for _, jc := range cs.JoinCredentials {
			c.creds[jc.Hash] = jc.State
		}
	}
	if cs.Pending != nil {
		p := *cs.Pending
		c.pending = &p
	}
	return c
}

func (c *control) sortedMembers() []Member {
	var out []Member
	for _, mem := range c.members {
		out = append(out, mem)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmpUint64(a.NodeID, b.NodeID) })
	return out
}

func sortedIdentities(m map[uint64]uint64) []Identity {
	var out []Identity
	for id, inc := range m {
		out = append(out, Identity{NodeID: id, Incarnation: inc})
	}
	slices.SortFunc(out, func(a, b Identity) int { return cmpUint64(a.NodeID, b.NodeID) })
	return out
}

func identityMap(ids []Identity) map[uint64]uint64 {
	if len(ids) == 0 {
		return nil
	}
	m := make(map[uint64]uint64, len(ids))
	for _, x := range ids {
		m[x.NodeID] = x.Incarnation
	}
	return m
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareHash(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) }

// Read accessors.

// ControlState returns a sorted deep copy of the replicated control state.
func (m *Machine) ControlState() ControlState { return m.ctl.state() }

// Bootstrapped reports whether the bootstrap credential has been consumed.
func (m *Machine) Bootstrapped() bool { return m.ctl.bootstrapped }

// Members returns every current member sorted by NodeID (nil if none).
func (m *Machine) Members() []Member { return m.ctl.sortedMembers() }

// Member returns the current member with NodeID id, if any.
func (m *Machine) Member(id uint64) (Member, bool) {
	mem, ok := m.ctl.members[id]
	return mem, ok
}

// PendingReplacement returns the pending replacement, if any.
func (m *Machine) PendingReplacement() (Replacement, bool) {
	if m.ctl.pending == nil {
		return Replacement{}, false
	}
	return *m.ctl.pending, true
}

// JoinCredentialState reports what the replicated state knows about a
// credential hash. The bootstrap credential's hash reports
// CredentialConsumed: it can never be minted or used to join.
func (m *Machine) JoinCredentialState(hash [32]byte) CredentialState {
	return m.ctl.credential(hash)
}

// CheckIdentity tells whether (nodeID, incarnation) is a current member
// with exactly that incarnation. The peer transport uses it to refuse a
// wiped, replaced or removed node that comes back with an old identity.
// Errors: ErrNodeRetired (the NodeID was retired; it never comes back),
// ErrStaleIncarnation (the NodeID is a member under another incarnation),
// ErrUnknownNode (the NodeID was never issued).
func (m *Machine) CheckIdentity(nodeID, incarnation uint64) error {
	_, why := m.ctl.member(nodeID, incarnation)
	if incarnation == 0 && why == "" {
		why = ReasonStaleIncarnation
	}
	switch why {
	case "":
		return nil
	case ReasonNodeRetired:
		return &Error{Code: CodeNodeRetired, Detail: fmt.Sprintf("node %d was retired", nodeID)}
	case ReasonStaleIncarnation:
		return &Error{Code: CodeStaleIncarnation, Detail: fmt.Sprintf("node %d is not a member with incarnation %d", nodeID, incarnation)}
	}
	return &Error{Code: CodeUnknownNode, Detail: fmt.Sprintf("node %d was never issued", nodeID)}
}
