package core

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ControlOp identifies one control transition (SPEC §2 Control). Values are
// part of the log encoding and must never change.
type ControlOp uint8

// Control operations.
const (
	// ControlBootstrap consumes the one-shot bootstrap credential and makes
	// the first node (NodeID 1, incarnation 1) a voter.
	ControlBootstrap ControlOp = 1
	// ControlMintJoin records a new join credential (by hash).
	ControlMintJoin ControlOp = 2
	// ControlAdmit consumes a minted join credential and admits a new
	// learner under a freshly issued NodeID and incarnation.
	ControlAdmit ControlOp = 3
	// ControlPromote makes a learner a voter.
	ControlPromote ControlOp = 4
	// ControlPrepareReplacement issues a new learner that is to replace a
	// voter, and records the pending replacement.
	ControlPrepareReplacement ControlOp = 5
	// ControlCompleteReplacement makes the replacement a voter and retires
	// the node it replaces.
	ControlCompleteReplacement ControlOp = 6
	// ControlAbortReplacement retires the replacement learner and keeps the
	// old voter.
	ControlAbortReplacement ControlOp = 7
	// ControlRetire removes a member for good.
	ControlRetire ControlOp = 8
)

func (o ControlOp) String() string {
	switch o {
	case ControlBootstrap:
		return "bootstrap"
	case ControlMintJoin:
		return "mint_join"
	case ControlAdmit:
		return "admit"
	case ControlPromote:
		return "promote"
	case ControlPrepareReplacement:
		return "prepare_replacement"
	case ControlCompleteReplacement:
		return "complete_replacement"
	case ControlAbortReplacement:
		return "abort_replacement"
	case ControlRetire:
		return "retire"
	}
	return fmt.Sprintf("control_op(%d)", uint8(o))
}

// ControlRequest is the payload of a KindControl command. Which fields are
// meaningful depends on Op; every other field must be zero:
//
//	Bootstrap:           CredentialHash, Address
//	MintJoin:            CredentialHash
//	Admit:               CredentialHash, Address
//	Promote:             NodeID, Incarnation
//	PrepareReplacement:  OldNodeID, Address (of the new node)
//	CompleteReplacement: OldNodeID, NewNodeID, NewIncarnation
//	AbortReplacement:    OldNodeID, NewNodeID, NewIncarnation
//	Retire:              NodeID, Incarnation
//
// CredentialHash is the SHA-256 of a credential; the credential itself is
// never replicated. The leader authenticates the caller before proposing;
// Apply only checks the replicated invariants.
type ControlRequest struct {
	Op             ControlOp
	CredentialHash [32]byte
	Address        string
	NodeID         uint64
	Incarnation    uint64
	OldNodeID      uint64
	NewNodeID      uint64
	NewIncarnation uint64
}

// String shows the op and the fields it carries, e.g.
// "promote{node_id:2,incarnation:2}"; the zero request (carried by every
// lock command) is "none".
func (r ControlRequest) String() string {
	if r.isZero() {
		return "none"
	}
	var b strings.Builder
	b.WriteString(r.Op.String())
	b.WriteByte('{')
	sep := ""
	field := func(name string, v any) {
		fmt.Fprintf(&b, "%s%s:%v", sep, name, v)
		sep = ","
	}
	if r.CredentialHash != ([32]byte{}) {
		field("credential_hash", hex.EncodeToString(r.CredentialHash[:]))
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{{"node_id", r.NodeID}, {"incarnation", r.Incarnation}, {"old_node_id", r.OldNodeID}, {"new_node_id", r.NewNodeID}, {"new_incarnation", r.NewIncarnation}} {
		if f.v != 0 {
			field(f.name, f.v)
		}
	}
	if r.Address != "" {
		field("address", strconv.Quote(r.Address))
	}
	b.WriteByte('}')
	return b.String()
}

// isZero is r == ControlRequest{}, field by field: every lock command
// checks it, and this is cheaper than comparing the whole struct.
func (r *ControlRequest) isZero() bool {
	h := r.CredentialHash[:]
	return r.Op == 0 && r.NodeID|r.Incarnation|r.OldNodeID|r.NewNodeID|r.NewIncarnation == 0 && len(r.Address) == 0 &&
		binary.LittleEndian.Uint64(h)|binary.LittleEndian.Uint64(h[8:])|binary.LittleEndian.Uint64(h[16:])|binary.LittleEndian.Uint64(h[24:]) == 0
}

// Control field bits: which fields an op carries. The encoding writes the
// present fields in this bit order.
const (
	cfHash uint8 = 1 << iota
	cfNodeID
	cfIncarnation
	cfOldNodeID
	cfNewNodeID
	cfNewIncarnation
	cfAddress
)

// controlFieldNames names the field bits, in bit order, for errors.
var controlFieldNames = [...]string{"a credential hash", "a node id", "an incarnation", "an old node id", "a new node id", "a new incarnation", "an address"}

// controlFields[op] is the set of fields op carries; 0 for unknown ops.
var controlFields = [...]uint8{
	ControlBootstrap:           cfHash | cfAddress,
	ControlMintJoin:            cfHash,
	ControlAdmit:               cfHash | cfAddress,
	ControlPromote:             cfNodeID | cfIncarnation,
	ControlPrepareReplacement:  cfOldNodeID | cfAddress,
	ControlCompleteReplacement: cfOldNodeID | cfNewNodeID | cfNewIncarnation,
	ControlAbortReplacement:    cfOldNodeID | cfNewNodeID | cfNewIncarnation,
	ControlRetire:              cfNodeID | cfIncarnation,
}

func (o ControlOp) fields() uint8 {
	if int(o) < len(controlFields) {
		return controlFields[o]
	}
	return 0
}

// Validate checks a control request's shape: a known op, every field the op
// needs present and valid (non-zero hash and ids, a valid address), every
// other field zero. It does not look at any state.
func (r ControlRequest) Validate() error {
	f := r.Op.fields()
	if f == 0 {
		return invalidf("unknown control op %d", uint8(r.Op))
	}
	var present uint8
	for _, x := range [...]struct {
		bit uint8
		set bool
	}{
		{cfHash, r.CredentialHash != [32]byte{}},
		{cfNodeID, r.NodeID != 0},
		{cfIncarnation, r.Incarnation != 0},
		{cfOldNodeID, r.OldNodeID != 0},
		{cfNewNodeID, r.NewNodeID != 0},
		{cfNewIncarnation, r.NewIncarnation != 0},
		{cfAddress, r.Address != ""},
	} {
		if x.set {
			present |= x.bit
		}
	}
	if present != f {
		for bit, name := range controlFieldNames {
			switch b := uint8(1) << bit; {
			case f&b != 0 && present&b == 0:
				return invalidf("%s needs %s", r.Op, name)
			case f&b == 0 && present&b != 0:
				return invalidf("%s must not carry %s", r.Op, name)
			}
		}
	}
	if f&cfAddress != 0 {
		if err := ValidateAddress(r.Address); err != nil {
			return err
		}
	}
	if f&cfNewNodeID != 0 && r.NewNodeID == r.OldNodeID {
		return invalidf("%s: old and new node are both %d", r.Op, r.OldNodeID)
	}
	return nil
}

// ValidateAddress checks a member address without any lookup: 1 to
// MaxAddressLen bytes of printable ASCII (no space), "host:port" split at
// the last ':', a non-empty host (an IPv6 host in brackets), and a decimal
// port 1..65535 without leading zeros.
func ValidateAddress(addr string) error {
	switch {
	case addr == "":
		return invalidf("address is empty")
	case len(addr) > MaxAddressLen:
		return invalidf("address is %d bytes, the limit is %d", len(addr), MaxAddressLen)
	}
	for i := 0; i < len(addr); i++ {
		if c := addr[i]; c <= ' ' || c > '~' {
			return invalidf("address has byte 0x%02x at %d; only printable ASCII without spaces is allowed", c, i)
		}
	}
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return invalidf("address %q has no port", addr)
	}
	host, port := addr[:i], addr[i+1:]
	if host == "" {
		return invalidf("address %q has no host", addr)
	}
	if strings.IndexByte(host, ':') >= 0 && (host[0] != '[' || host[len(host)-1] != ']') {
		return invalidf("address %q: an IPv6 host must be in brackets", addr)
	}
	if port == "" || len(port) > 5 || port[0] == '0' {
		return invalidf("address %q has an invalid port", addr)
	}
	n := 0
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return invalidf("address %q has an invalid port", addr)
		}
		n = n*10 + int(port[i]-'0')
	}
	if n > 65535 {
		return invalidf("address %q has an invalid port", addr)
	}
	return nil
}

// Control command constructors.

// Bootstrap builds a Bootstrap control command.
func Bootstrap(credentialHash [32]byte, address string) Command {
	return controlCommand(ControlRequest{Op: ControlBootstrap, CredentialHash: credentialHash, Address: address})
}

// MintJoin builds a MintJoin control command.
func MintJoin(credentialHash [32]byte) Command {
	return controlCommand(ControlRequest{Op: ControlMintJoin, CredentialHash: credentialHash})
}

// Admit builds an Admit control command.
func Admit(credentialHash [32]byte, address string) Command {
	return controlCommand(ControlRequest{Op: ControlAdmit, CredentialHash: credentialHash, Address: address})
}

// Promote builds a Promote control command.
func Promote(nodeID, incarnation uint64) Command {
	return controlCommand(ControlRequest{Op: ControlPromote, NodeID: nodeID, Incarnation: incarnation})
}

// PrepareReplacement builds a PrepareReplacement control command: old is
// the voter to replace, address the new node's address.
func PrepareReplacement(old uint64, address string) Command {
	return controlCommand(ControlRequest{Op: ControlPrepareReplacement, OldNodeID: old, Address: address})
}

// CompleteReplacement builds a CompleteReplacement control command.
func CompleteReplacement(old, newNodeID, newIncarnation uint64) Command {
	return controlCommand(ControlRequest{Op: ControlCompleteReplacement, OldNodeID: old, NewNodeID: newNodeID, NewIncarnation: newIncarnation})
}

// AbortReplacement builds an AbortReplacement control command.
func AbortReplacement(old, newNodeID, newIncarnation uint64) Command {
	return controlCommand(ControlRequest{Op: ControlAbortReplacement, OldNodeID: old, NewNodeID: newNodeID, NewIncarnation: newIncarnation})
}

// Retire builds a Retire control command.
func Retire(nodeID, incarnation uint64) Command {
	return controlCommand(ControlRequest{Op: ControlRetire, NodeID: nodeID, Incarnation: incarnation})
}

func controlCommand(r ControlRequest) Command { return Command{Kind: KindControl, Control: r} }

// ControlReason is the stable code of a ControlRejected result. Reasons
// travel to operators and must never be renamed.
type ControlReason string

// Rejection reasons.
const (
	// Bootstrap after the cluster was bootstrapped (with any credential).
	ReasonAlreadyBootstrapped ControlReason = "already_bootstrapped"
	// MintJoin before Bootstrap.
	ReasonNotBootstrapped ControlReason = "not_bootstrapped"
	// MintJoin of a hash already minted (or the bootstrap credential's);
	// Admit with a consumed credential (or the bootstrap credential).
	ReasonCredentialReused ControlReason = "credential_reused"
	// Admit with a credential that was never minted.
	ReasonCredentialUnknown ControlReason = "credential_unknown"
	// Admit or PrepareReplacement with an address a current member uses
	// (a replacement may reuse the address of the node it replaces).
	ReasonAddressInUse ControlReason = "address_in_use"
	// Promote of a voter.
	ReasonNotALearner ControlReason = "not_a_learner"
	// PrepareReplacement of a learner.
	ReasonNotAVoter ControlReason = "not_a_voter"
	// Promote or Retire naming a member with a different incarnation.
	ReasonStaleIncarnation ControlReason = "stale_incarnation"
	// The node was never issued.
	ReasonUnknownNode ControlReason = "unknown_node"
	// The node was retired; it can never be a member again.
	ReasonNodeRetired ControlReason = "node_retired"
	// Promote or Retire of a node that is part of the pending replacement.
	ReasonInReplacement ControlReason = "in_replacement"
	// PrepareReplacement while another replacement is pending.
	ReasonReplacementPending ControlReason = "replacement_pending"
	// CompleteReplacement or AbortReplacement with none pending.
	ReasonNoReplacement ControlReason = "no_replacement"
	// CompleteReplacement or AbortReplacement that does not name the
	// pending replacement exactly.
	ReasonReplacementMismatch ControlReason = "replacement_mismatch"
	// Retire of the last voter.
	ReasonLastVoter ControlReason = "last_voter"
	// A bound in limits.go (or a counter's range) would be exceeded.
	ReasonLimitReached ControlReason = "limit_reached"
	// An identity about to be issued is already in the issued set. It
	// cannot happen while the counters only grow; it is checked anyway.
	ReasonIdentityReused ControlReason = "identity_reused"
)

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
// Invariants (checked by the decoders): before bootstrap everything is
// zero; after it there is at least one voter; Issued is exactly Members
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
}

func rejected(reason ControlReason) Result {
	return Result{Kind: ResultControlRejected, Reason: reason}
}

// applyControl applies a validated control request. Every branch checks all
// its conditions before it changes anything, so a rejection changes
// nothing.
func (m *Machine) applyControl(r ControlRequest) Result {
	c := &m.ctl
	switch r.Op {
	case ControlBootstrap:
		if c.bootstrapped {
			return rejected(ReasonAlreadyBootstrapped)
		}
		id, inc, why := c.nextIdentity()
		if why != "" {
			return rejected(why)
		}
		c.bootstrapped = true
		c.bootstrapHash = r.CredentialHash
		c.issue(id, inc, r.Address, RoleVoter)
		return Result{Kind: ResultBootstrapRecorded, NodeID: id, Incarnation: inc}

	case ControlMintJoin:
		if !c.bootstrapped {
			return rejected(ReasonNotBootstrapped)
		}
		if c.credential(r.CredentialHash) != CredentialUnknown {
			return rejected(ReasonCredentialReused)
		}
		if len(c.creds) >= MaxJoinCredentials {
			return rejected(ReasonLimitReached)
		}
		if c.creds == nil {
			c.creds = make(map[[32]byte]CredentialState)
		}
		c.creds[r.CredentialHash] = CredentialMinted
		return Result{Kind: ResultControlApplied}

	case ControlAdmit:
		switch c.credential(r.CredentialHash) {
		case CredentialUnknown:
			return rejected(ReasonCredentialUnknown)
		case CredentialConsumed:
			return rejected(ReasonCredentialReused)
		}
		if c.addressUsed(r.Address, 0) {
			return rejected(ReasonAddressInUse)
		}
		id, inc, why := c.nextIdentity()
		if why != "" {
			return rejected(why)
		}
		c.creds[r.CredentialHash] = CredentialConsumed
		c.issue(id, inc, r.Address, RoleLearner)
		return Result{Kind: ResultAdmissionAccepted, NodeID: id, Incarnation: inc}

	case ControlPromote:
		mem, why := c.member(r.NodeID, r.Incarnation)
		switch {
		case why != "":
			return rejected(why)
		case mem.Role != RoleLearner:
			return rejected(ReasonNotALearner)
		case c.inReplacement(mem.NodeID):
			return rejected(ReasonInReplacement)
		}
		mem.Role = RoleVoter
		c.members[mem.NodeID] = mem
		return Result{Kind: ResultControlApplied, NodeID: mem.NodeID, Incarnation: mem.Incarnation}

	case ControlPrepareReplacement:
		if c.pending != nil {
			return rejected(ReasonReplacementPending)
		}
		old, why := c.member(r.OldNodeID, 0)
		switch {
		case why != "":
			return rejected(why)
		case old.Role != RoleVoter:
			return rejected(ReasonNotAVoter)
		case c.addressUsed(r.Address, old.NodeID):
			return rejected(ReasonAddressInUse)
		}
		id, inc, why := c.nextIdentity()
		if why != "" {
			return rejected(why)
		}
		c.issue(id, inc, r.Address, RoleLearner)
		c.pending = &Replacement{Old: old.NodeID, New: id, NewIncarnation: inc, Address: r.Address}
		return Result{Kind: ResultReplacementPrepared, NodeID: id, Incarnation: inc}

	case ControlCompleteReplacement, ControlAbortReplacement:
		p := c.pending
		switch {
		case p == nil:
			return rejected(ReasonNoReplacement)
		case p.Old != r.OldNodeID || p.New != r.NewNodeID || p.NewIncarnation != r.NewIncarnation:
			return rejected(ReasonReplacementMismatch)
		}
		c.pending = nil
		if r.Op == ControlAbortReplacement {
			c.retire(p.New)
			return Result{Kind: ResultControlApplied, NodeID: p.New, Incarnation: p.NewIncarnation}
		}
		nm := c.members[p.New]
		nm.Role = RoleVoter
		c.members[p.New] = nm
		c.retire(p.Old)
		return Result{Kind: ResultControlApplied, NodeID: p.New, Incarnation: p.NewIncarnation}

	case ControlRetire:
		mem, why := c.member(r.NodeID, r.Incarnation)
		switch {
		case why != "":
			return rejected(why)
		case c.inReplacement(mem.NodeID):
			return rejected(ReasonInReplacement)
		case mem.Role == RoleVoter && c.voters() == 1:
			return rejected(ReasonLastVoter)
		}
		c.retire(mem.NodeID)
		return Result{Kind: ResultControlApplied, NodeID: mem.NodeID, Incarnation: mem.Incarnation}
	}
	return Result{Kind: ResultNoop} // unreachable: Validate rejects unknown ops
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
