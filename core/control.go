package core

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Control requests: the operations, their fields and validation, and the
// command constructors. Applying them is control_apply.go; the state they
// change is control_state.go.

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
	// ControlSetClusterVersion raises the cluster version (version.go). The
	// leader proposes it; it needs no bootstrap (static clusters have none).
	ControlSetClusterVersion ControlOp = 9
	// ControlSetFenceKey makes a new fence signing key current (fence.go):
	// the leader generates its seed, Apply records it. Cluster version 3;
	// it needs no bootstrap either.
	ControlSetFenceKey ControlOp = 10
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
	case ControlSetClusterVersion:
		return "set_cluster_version"
	case ControlSetFenceKey:
		return "set_fence_key"
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
//	SetClusterVersion:   Version
//	SetFenceKey:         FenceSeed
//
// CredentialHash is the SHA-256 of a credential; the credential itself is
// never replicated. FenceSeed is a secret that is replicated (fence.go);
// String shows only its key ID. The leader authenticates the caller before
// proposing; Apply only checks the replicated invariants.
type ControlRequest struct {
	Op             ControlOp
	CredentialHash [32]byte
	Address        string
	NodeID         uint64
	Incarnation    uint64
	OldNodeID      uint64
	NewNodeID      uint64
	NewIncarnation uint64
	Version        uint64
	FenceSeed      FenceSeed
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
	}{{"node_id", r.NodeID}, {"incarnation", r.Incarnation}, {"old_node_id", r.OldNodeID}, {"new_node_id", r.NewNodeID}, {"new_incarnation", r.NewIncarnation}, {"version", r.Version}} {
		if f.v != 0 {
			field(f.name, f.v)
		}
	}
	if r.Address != "" {
		field("address", strconv.Quote(r.Address))
	}
	if r.FenceSeed != (FenceSeed{}) {
		field("key_id", newFenceKey(r.FenceSeed).id)
	}
	b.WriteByte('}')
	return b.String()
}

// isZero is r == ControlRequest{}, field by field: every lock command
// checks it, and this is cheaper than comparing the whole struct.
func (r *ControlRequest) isZero() bool {
	return r.Op == 0 && r.NodeID|r.Incarnation|r.OldNodeID|r.NewNodeID|r.NewIncarnation|r.Version == 0 && len(r.Address) == 0 &&
		zero32(&r.CredentialHash) && zero32((*[32]byte)(&r.FenceSeed))
}

func zero32(h *[32]byte) bool {
	return binary.LittleEndian.Uint64(h[:])|binary.LittleEndian.Uint64(h[8:])|binary.LittleEndian.Uint64(h[16:])|binary.LittleEndian.Uint64(h[24:]) == 0
}

// Control field bits: which fields an op carries. The encoding writes the
// present fields in this bit order.
const (
	cfHash uint16 = 1 << iota
	cfNodeID
	cfIncarnation
	cfOldNodeID
	cfNewNodeID
	cfNewIncarnation
	cfAddress
	cfVersion
	cfSeed
)

// controlFieldNames names the field bits, in bit order, for errors.
var controlFieldNames = [...]string{"a credential hash", "a node id", "an incarnation", "an old node id", "a new node id", "a new incarnation", "an address", "a version", "a fence seed"}

// controlFields[op] is the set of fields op carries; 0 for unknown ops.
var controlFields = [...]uint16{
	ControlBootstrap:           cfHash | cfAddress,
	ControlMintJoin:            cfHash,
	ControlAdmit:               cfHash | cfAddress,
	ControlPromote:             cfNodeID | cfIncarnation,
	ControlPrepareReplacement:  cfOldNodeID | cfAddress,
	ControlCompleteReplacement: cfOldNodeID | cfNewNodeID | cfNewIncarnation,
	ControlAbortReplacement:    cfOldNodeID | cfNewNodeID | cfNewIncarnation,
	ControlRetire:              cfNodeID | cfIncarnation,
	ControlSetClusterVersion:   cfVersion,
	ControlSetFenceKey:         cfSeed,
}

func (o ControlOp) fields() uint16 {
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
	var present uint16
	for _, x := range [...]struct {
		bit uint16
		set bool
	}{
		{cfHash, r.CredentialHash != [32]byte{}},
		{cfNodeID, r.NodeID != 0},
		{cfIncarnation, r.Incarnation != 0},
		{cfOldNodeID, r.OldNodeID != 0},
		{cfNewNodeID, r.NewNodeID != 0},
		{cfNewIncarnation, r.NewIncarnation != 0},
		{cfAddress, r.Address != ""},
		{cfVersion, r.Version != 0},
		{cfSeed, r.FenceSeed != FenceSeed{}},
	} {
		if x.set {
			present |= x.bit
		}
	}
	if present != f {
		for bit, name := range controlFieldNames {
			switch b := uint16(1) << bit; {
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
	// A version this binary does not know is as unreadable as an unknown
	// op: the decoder rejects it, so no replica applies it differently.
	if f&cfVersion != 0 && (r.Version < 2 || r.Version > MaxClusterVersion) {
		return invalidf("%s: version %d is outside [2, %d]", r.Op, r.Version, MaxClusterVersion)
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

// SetClusterVersion builds a SetClusterVersion control command.
func SetClusterVersion(version uint64) Command {
	return controlCommand(ControlRequest{Op: ControlSetClusterVersion, Version: version})
}

// SetFenceKey builds a SetFenceKey control command. seed must come from a
// cryptographic random source (crypto/rand) on the leader.
func SetFenceKey(seed FenceSeed) Command {
	return controlCommand(ControlRequest{Op: ControlSetFenceKey, FenceSeed: seed})
}

func controlCommand(r ControlRequest) Command { return Command{Kind: KindControl, Control: r} }
