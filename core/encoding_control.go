package core

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strconv"
)

// Control state encoding: the control record, the control section it
// shares with snapshot version 2, and the validation of a decoded control
// state against the invariants on ControlState.

// EncodeControlState encodes the control state as the control record,
// which raftstore keeps in its own row: version 1 while the cluster
// version is 1, version 2 (which adds the cluster version) at cluster
// version 2, version 3 (which adds the fence keys) from 3 on.
//
//	"TKC" | version:1 | control | crc32c:4 (big endian, of all before)
//
// control, shared with snapshots (version 1 in snapshot version 2, version
// 2 in snapshot version 3, version 3 in snapshot version 4):
//
//	flags:1 (bit 0 bootstrapped, bit 1 replacement pending; no other bits)
//	| bootstrap_hash:32 (only if bootstrapped)
//	| last_node_id:uvarint | last_incarnation:uvarint
//	| count:uvarint | member*       member = node_id:uvarint | incarnation:uvarint | role:1 | address:str
//	| count:uvarint | identity*     issued, identity = node_id:uvarint | incarnation:uvarint
//	| count:uvarint | identity*     retired
//	| count:uvarint | credential*   credential = hash:32 | state:1 (1 minted, 2 consumed)
//	| old:uvarint | new:uvarint | new_incarnation:uvarint | address:str (only if pending)
//	| cluster_version:uvarint (version 2 and 3; 2 in version 2, 3..MaxClusterVersion in 3)
//	| count:uvarint | seed:32*     fence keys, oldest first (version 3 only; at most MaxFenceKeys)
//
// Members, issued and retired are strictly ascending by node id,
// credentials strictly ascending by hash (bytewise). The lists are sorted
// here, so equal states give equal bytes. cs must satisfy the invariants
// on ControlState (Machine.ControlState and DecodeControlState give such
// states); the decoder rejects the encoding of any other.
func EncodeControlState(cs ControlState) []byte {
	b := make([]byte, 0, 8+controlSizeHint(cs))
	b = append(b, controlMagic[:]...)
	version := controlVersion(cs)
	b = append(b, version)
	b = appendControl(b, cs, version)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeControlState decodes and validates a control record. It checks the
// checksum and version, canonical integers, sort order, the bounds in
// limits.go and every invariant listed on ControlState.
func DecodeControlState(b []byte) (ControlState, error) {
	if len(b) < len(controlMagic)+1+4 {
		return ControlState{}, malformedf("control record is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != controlMagic {
		return ControlState{}, malformedf("control record magic missing")
	}
	version := b[3]
	if version < ControlStateVersion1 || version > ControlStateVersion3 {
		return ControlState{}, &Error{Code: CodeUnknownVersion, Detail: "control record version " + strconv.Itoa(int(version))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return ControlState{}, malformedf("control record checksum mismatch")
	}
	d := decoder{b: body[4:]}
	cs, err := d.control(version)
	if err != nil {
		return ControlState{}, err
	}
	if err := d.finish(); err != nil {
		return ControlState{}, err
	}
	return cs, nil
}

const (
	ctlFlagBootstrapped byte = 1 << 0
	ctlFlagPending      byte = 1 << 1
)

// Smallest encodings, which bound an honest count by the input length.
const (
	minMemberSize   = 1 + 1 + 1 + 1 + 3 // ids, role, address "h:1"
	minIdentitySize = 2
	credentialSize  = 32 + 1
)

func controlSizeHint(cs ControlState) int {
	n := 64 + len(cs.Issued)*8 + len(cs.Retired)*8 + len(cs.JoinCredentials)*credentialSize + len(cs.FenceKeys)*FenceSeedSize
	for _, mem := range cs.Members {
		n += 16 + len(mem.Address)
	}
	return n
}

// controlVersion is the control section format for cs: the one of its
// cluster version (1 before any was set).
func controlVersion(cs ControlState) byte {
	switch {
	case cs.ClusterVersion >= 3:
		return ControlStateVersion3
	case cs.ClusterVersion == 2:
		return ControlStateVersion2
	}
	return ControlStateVersion1
}

func appendControl(b []byte, cs ControlState, version byte) []byte {
	var flags byte
	if cs.Bootstrapped {
		flags |= ctlFlagBootstrapped
	}
	if cs.Pending != nil {
		flags |= ctlFlagPending
	}
	b = append(b, flags)
	if cs.Bootstrapped {
		b = append(b, cs.BootstrapHash[:]...)
	}
	b = binary.AppendUvarint(b, cs.LastNodeID)
	b = binary.AppendUvarint(b, cs.LastIncarnation)

	members := sortedCopy(cs.Members, func(a, b Member) int { return cmpUint64(a.NodeID, b.NodeID) })
	b = binary.AppendUvarint(b, uint64(len(members)))
	for _, mem := range members {
		b = binary.AppendUvarint(b, mem.NodeID)
		b = binary.AppendUvarint(b, mem.Incarnation)
		b = append(b, byte(mem.Role))
		b = appendString(b, mem.Address)
	}
	byID := func(a, b Identity) int { return cmpUint64(a.NodeID, b.NodeID) }
	for _, ids := range [][]Identity{sortedCopy(cs.Issued, byID), sortedCopy(cs.Retired, byID)} {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, x := range ids {
			b = binary.AppendUvarint(b, x.NodeID)
			b = binary.AppendUvarint(b, x.Incarnation)
		}
	}
	creds := sortedCopy(cs.JoinCredentials, func(a, b JoinCredential) int { return compareHash(a.Hash, b.Hash) })
	b = binary.AppendUvarint(b, uint64(len(creds)))
	for _, jc := range creds {
		b = append(b, jc.Hash[:]...)
		b = append(b, byte(jc.State))
	}
	if p := cs.Pending; p != nil {
		b = binary.AppendUvarint(b, p.Old)
		b = binary.AppendUvarint(b, p.New)
		b = binary.AppendUvarint(b, p.NewIncarnation)
		b = appendString(b, p.Address)
	}
	if version >= ControlStateVersion2 {
		b = binary.AppendUvarint(b, cs.ClusterVersion)
	}
	if version >= ControlStateVersion3 {
		b = binary.AppendUvarint(b, uint64(len(cs.FenceKeys)))
		for _, seed := range cs.FenceKeys {
			b = append(b, seed[:]...)
		}
	}
	return b
}

// sortedCopy returns s itself when it is already sorted, else a sorted copy.
func sortedCopy[T any](s []T, cmp func(a, b T) int) []T {
	if slices.IsSortedFunc(s, cmp) {
		return s
	}
	s = slices.Clone(s)
	slices.SortStableFunc(s, cmp)
	return s
}

// control reads a control section of the given version and validates it.
func (d *decoder) control(version byte) (ControlState, error) {
	var cs ControlState
	flags := d.byte()
	if d.err == nil && flags&^(ctlFlagBootstrapped|ctlFlagPending) != 0 {
		return ControlState{}, malformedf("control flags 0x%02x", flags)
	}
	cs.Bootstrapped = flags&ctlFlagBootstrapped != 0
	if cs.Bootstrapped {
		cs.BootstrapHash = d.hash()
	}
	cs.LastNodeID = d.uvarint()
	cs.LastIncarnation = d.uvarint()

	n := d.count(MaxControlNodes, minMemberSize, "members")
	for i := uint64(0); i < n && d.err == nil; i++ {
		var mem Member
		mem.NodeID = d.uvarint()
		mem.Incarnation = d.uvarint()
		mem.Role = Role(d.byte())
		mem.Address = d.str(MaxAddressLen)
		cs.Members = append(cs.Members, mem)
	}
	cs.Issued = d.identities("issued")
	cs.Retired = d.identities("retired")
	n = d.count(MaxJoinCredentials, credentialSize, "join credentials")
	for i := uint64(0); i < n && d.err == nil; i++ {
		jc := JoinCredential{Hash: d.hash()}
		jc.State = CredentialState(d.byte())
		cs.JoinCredentials = append(cs.JoinCredentials, jc)
	}
	if flags&ctlFlagPending != 0 {
		p := &Replacement{}
		p.Old = d.uvarint()
		p.New = d.uvarint()
		p.NewIncarnation = d.uvarint()
		p.Address = d.str(MaxAddressLen)
		cs.Pending = p
	}
	if version >= ControlStateVersion2 {
		cs.ClusterVersion = d.uvarint()
		// Version 2 is written exactly at cluster version 2 and version 3
		// from 3 on, and a version this binary does not know is
		// unreadable.
		if d.err == nil && (cs.ClusterVersion < 2 || cs.ClusterVersion > MaxClusterVersion) {
			return ControlState{}, &Error{Code: CodeUnknownVersion, Detail: "cluster version " + strconv.FormatUint(cs.ClusterVersion, 10)}
		}
		if d.err == nil && controlVersion(cs) != version {
			return ControlState{}, malformedf("control version %d with cluster version %d", version, cs.ClusterVersion)
		}
	}
	if version >= ControlStateVersion3 {
		n := d.count(MaxFenceKeys, FenceSeedSize, "fence keys")
		for i := uint64(0); i < n && d.err == nil; i++ {
			cs.FenceKeys = append(cs.FenceKeys, FenceSeed(d.hash()))
		}
	}
	if d.err != nil {
		return ControlState{}, d.err
	}
	if err := validateControlState(cs); err != nil {
		return ControlState{}, err
	}
	return cs, nil
}

// count reads a list length and rejects one above limit or above what the
// rest of the input could hold.
func (d *decoder) count(limit, minSize int, what string) uint64 {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(limit) || n > uint64(len(d.b)/minSize) {
		d.err = malformedf("%d %s declared in %d bytes (limit %d)", n, what, len(d.b), limit)
		return 0
	}
	return n
}

func (d *decoder) identities(what string) []Identity {
	n := d.count(MaxControlNodes, minIdentitySize, what)
	var ids []Identity
	for i := uint64(0); i < n && d.err == nil; i++ {
		x := Identity{NodeID: d.uvarint()}
		x.Incarnation = d.uvarint()
		ids = append(ids, x)
	}
	return ids
}

// validateControlState checks the invariants listed on ControlState, in
// the order of the steps below; the first failure is the error. The
// cluster version was checked by the decoder of the section that carries
// it (and so fence keys appear only from cluster version 3 on).
func validateControlState(cs ControlState) error {
	if err := validateFenceKeys(cs.FenceKeys); err != nil {
		return err
	}
	if !cs.Bootstrapped {
		if cs.BootstrapHash != ([32]byte{}) || cs.LastNodeID != 0 || cs.LastIncarnation != 0 ||
			len(cs.Members) != 0 || len(cs.Issued) != 0 || len(cs.Retired) != 0 || len(cs.JoinCredentials) != 0 || cs.Pending != nil {
			return malformedf("control state before bootstrap is not empty")
		}
		return nil
	}
	if cs.BootstrapHash == ([32]byte{}) {
		return malformedf("bootstrap credential hash is zero")
	}
	if len(cs.Members) > MaxControlNodes || len(cs.Issued) > MaxControlNodes || len(cs.Retired) > MaxControlNodes ||
		len(cs.JoinCredentials) > MaxJoinCredentials {
		return malformedf("control state above its limits")
	}
	// NodeID -> incarnation of every member and retired node: together they
	// must be exactly the issued set.
	known := make(map[uint64]uint64, len(cs.Members)+len(cs.Retired))
	members, err := validateMembers(&cs, known)
	if err != nil {
		return err
	}
	if err := validateRetired(&cs, known); err != nil {
		return err
	}
	if err := validateIssued(&cs, known); err != nil {
		return err
	}
	if err := validateJoinCredentials(&cs); err != nil {
		return err
	}
	if err := validatePending(cs.Pending, members); err != nil {
		return err
	}
	return validateAddresses(&cs)
}

// validateIdentity checks that x has non-zero ids that are not above the
// counters of cs.
func validateIdentity(cs *ControlState, what string, x Identity) error {
	switch {
	case x.NodeID == 0 || x.Incarnation == 0:
		return malformedf("%s node %d incarnation %d: zero id", what, x.NodeID, x.Incarnation)
	case x.NodeID > cs.LastNodeID || x.Incarnation > cs.LastIncarnation:
		return malformedf("%s node %d incarnation %d above the counters %d/%d", what, x.NodeID, x.Incarnation, cs.LastNodeID, cs.LastIncarnation)
	}
	return nil
}

// validateMembers checks the members' order, identities, roles and
// addresses, and that at least one is a voter. It records each member's
// incarnation in known and returns the members by NodeID.
func validateMembers(cs *ControlState, known map[uint64]uint64) (map[uint64]Member, error) {
	members := make(map[uint64]Member, len(cs.Members))
	voters := 0
	for i, mem := range cs.Members {
		if i > 0 && mem.NodeID <= cs.Members[i-1].NodeID {
			return nil, malformedf("members not strictly ascending at %d", i)
		}
		if err := validateIdentity(cs, "member", Identity{mem.NodeID, mem.Incarnation}); err != nil {
			return nil, err
		}
		switch mem.Role {
		case RoleVoter:
			voters++
		case RoleLearner:
		default:
			return nil, malformedf("member %d has role %d", mem.NodeID, uint8(mem.Role))
		}
		if err := ValidateAddress(mem.Address); err != nil {
			return nil, err
		}
		known[mem.NodeID] = mem.Incarnation
		members[mem.NodeID] = mem
	}
	if voters == 0 {
		return nil, malformedf("bootstrapped control state has no voter")
	}
	return members, nil
}

// validateRetired checks the retired nodes' order and identities and that
// none is a member, and records each one's incarnation in known.
func validateRetired(cs *ControlState, known map[uint64]uint64) error {
	for i, x := range cs.Retired {
		if i > 0 && x.NodeID <= cs.Retired[i-1].NodeID {
			return malformedf("retired not strictly ascending at %d", i)
		}
		if err := validateIdentity(cs, "retired", x); err != nil {
			return err
		}
		if _, dup := known[x.NodeID]; dup {
			return malformedf("node %d is both a member and retired", x.NodeID)
		}
		known[x.NodeID] = x.Incarnation
	}
	return nil
}

// validateIssued checks that the issued set is exactly known, the members
// and retired nodes with their incarnations, and that no incarnation was
// issued twice.
func validateIssued(cs *ControlState, known map[uint64]uint64) error {
	if len(cs.Issued) != len(known) {
		return malformedf("%d issued identities, %d members and retired", len(cs.Issued), len(known))
	}
	incs := make(map[uint64]struct{}, len(cs.Issued))
	for i, x := range cs.Issued {
		if i > 0 && x.NodeID <= cs.Issued[i-1].NodeID {
			return malformedf("issued not strictly ascending at %d", i)
		}
		if err := validateIdentity(cs, "issued", x); err != nil {
			return err
		}
		if inc, ok := known[x.NodeID]; !ok || inc != x.Incarnation {
			return malformedf("issued node %d incarnation %d is not a member or retired with it", x.NodeID, x.Incarnation)
		}
		if _, dup := incs[x.Incarnation]; dup {
			return malformedf("incarnation %d issued twice", x.Incarnation)
		}
		incs[x.Incarnation] = struct{}{}
	}
	return nil
}

// validateJoinCredentials checks the credentials' order, hashes and states.
func validateJoinCredentials(cs *ControlState) error {
	for i, jc := range cs.JoinCredentials {
		switch {
		case i > 0 && compareHash(jc.Hash, cs.JoinCredentials[i-1].Hash) <= 0:
			return malformedf("join credentials not strictly ascending at %d", i)
		case jc.Hash == [32]byte{} || jc.Hash == cs.BootstrapHash:
			return malformedf("join credential %d has the zero or the bootstrap hash", i)
		case jc.State != CredentialMinted && jc.State != CredentialConsumed:
			return malformedf("join credential %d has state %d", i, uint8(jc.State))
		}
	}
	return nil
}

// validatePending checks that a pending replacement (nil: none) names a
// current voter and a distinct current learner that matches it.
func validatePending(p *Replacement, members map[uint64]Member) error {
	if p == nil {
		return nil
	}
	old, oldOK := members[p.Old]
	nw, newOK := members[p.New]
	switch {
	case !oldOK || old.Role != RoleVoter:
		return malformedf("pending replacement of %d, which is not a voter", p.Old)
	case !newOK || nw.Role != RoleLearner || p.Old == p.New:
		return malformedf("pending replacement by %d, which is not a learner", p.New)
	case nw.Incarnation != p.NewIncarnation || nw.Address != p.Address:
		return malformedf("pending replacement by %d does not match the member", p.New)
	}
	return nil
}

// validateAddresses checks that addresses are unique, except that a
// replacement may take the address of the node it replaces.
func validateAddresses(cs *ControlState) error {
	p := cs.Pending
	byAddr := make(map[string]uint64, len(cs.Members))
	for _, mem := range cs.Members {
		// Members ascend and a replacement is issued after the node it
		// replaces, so Old comes first.
		if other, dup := byAddr[mem.Address]; dup && (p == nil || other != p.Old || mem.NodeID != p.New) {
			return malformedf("members %d and %d share address %q", other, mem.NodeID, mem.Address)
		}
		byAddr[mem.Address] = mem.NodeID
	}
	return nil
}
