package core

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strconv"
)

// Format versions. A decoder accepts exactly the versions it knows.
const (
	EntryVersion byte = 1
	// SnapshotVersion is the version EncodeSnapshot writes: version 1's
	// lock table followed by the control state. DecodeSnapshot also reads
	// SnapshotVersion1 (no control section: the control state is empty).
	SnapshotVersion     byte = 2
	SnapshotVersion1    byte = 1
	LockRecVersion      byte = 1
	ControlStateVersion byte = 1
)

// snapshotMagic starts every snapshot and controlMagic every control
// record, so that a stray blob is not mistaken for one.
var (
	snapshotMagic = [3]byte{'T', 'K', 'S'}
	controlMagic  = [3]byte{'T', 'K', 'C'}
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Entry is the payload of one raft log entry: a command plus the proposer's
// request id. RequestID only lets the proposing node match the applied
// result to its waiting caller; Apply never looks at it.
type Entry struct {
	RequestID uint64
	Command   Command
}

// EncodeEntry encodes a log entry in format EntryVersion:
//
//	version:1 | request_id:uvarint | kind:1 | fields
//	  grant:          key:str | lease_ms:uvarint | owner:str | granted_at_ms:uvarint
//	  release/expire: key:str | token:uvarint
//	  control:        op:1 | the op's fields, in this order, each only if the op has it:
//	                  credential_hash:32 | node_id:uvarint | incarnation:uvarint |
//	                  old_node_id:uvarint | new_node_id:uvarint | new_incarnation:uvarint |
//	                  address:str (at most MaxAddressLen)
//	    bootstrap, admit:            credential_hash | address
//	    mint_join:                   credential_hash
//	    promote, retire:             node_id | incarnation
//	    prepare_replacement:         old_node_id | address
//	    complete/abort_replacement:  old_node_id | new_node_id | new_incarnation
//	str = length:uvarint | bytes
//
// Only the fields the kind (and op) carries are written.
func EncodeEntry(e Entry) []byte {
	c := e.Command
	b := make([]byte, 0, 24+len(c.Key)+len(c.Owner)+len(c.Control.Address))
	b = append(b, EntryVersion)
	b = binary.AppendUvarint(b, e.RequestID)
	b = append(b, byte(c.Kind))
	switch c.Kind {
	case KindGrant:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.LeaseMS)
		b = appendString(b, c.Owner)
		b = binary.AppendUvarint(b, c.GrantedAtMS)
	case KindControl:
		b = appendControlRequest(b, c.Control)
	default:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
	}
	return b
}

func appendControlRequest(b []byte, r ControlRequest) []byte {
	b = append(b, byte(r.Op))
	f := r.Op.fields()
	if f&cfHash != 0 {
		b = append(b, r.CredentialHash[:]...)
	}
	for _, x := range []struct {
		bit uint8
		v   uint64
	}{{cfNodeID, r.NodeID}, {cfIncarnation, r.Incarnation}, {cfOldNodeID, r.OldNodeID}, {cfNewNodeID, r.NewNodeID}, {cfNewIncarnation, r.NewIncarnation}} {
		if f&x.bit != 0 {
			b = binary.AppendUvarint(b, x.v)
		}
	}
	if f&cfAddress != 0 {
		b = appendString(b, r.Address)
	}
	return b
}

func (d *decoder) controlRequest() ControlRequest {
	r := ControlRequest{Op: ControlOp(d.byte())}
	if d.err != nil {
		return ControlRequest{}
	}
	f := r.Op.fields()
	if f == 0 {
		d.err = malformedf("unknown control op %d", uint8(r.Op))
		return ControlRequest{}
	}
	if f&cfHash != 0 {
		r.CredentialHash = d.hash()
	}
	for _, x := range []struct {
		bit uint8
		v   *uint64
	}{{cfNodeID, &r.NodeID}, {cfIncarnation, &r.Incarnation}, {cfOldNodeID, &r.OldNodeID}, {cfNewNodeID, &r.NewNodeID}, {cfNewIncarnation, &r.NewIncarnation}} {
		if f&x.bit != 0 {
			*x.v = d.uvarint()
		}
	}
	if f&cfAddress != 0 {
		r.Address = d.str(MaxAddressLen)
	}
	return r
}

// DecodeEntry decodes and validates a log entry. It rejects unknown
// versions, unknown kinds and control ops, non-canonical integers, trailing
// bytes and anything outside the limits.
func DecodeEntry(b []byte) (Entry, error) {
	if len(b) > MaxEntrySize {
		return Entry{}, malformedf("entry is %d bytes, the limit is %d", len(b), MaxEntrySize)
	}
	d := decoder{b: b}
	v := d.byte()
	if d.err == nil && v != EntryVersion {
		return Entry{}, &Error{Code: CodeUnknownVersion, Detail: "entry version " + strconv.Itoa(int(v))}
	}
	var e Entry
	e.RequestID = d.uvarint()
	e.Command.Kind = Kind(d.byte())
	if d.err != nil {
		return Entry{}, d.err
	}
	switch e.Command.Kind {
	case KindGrant:
		e.Command.Key = d.str(MaxKeyLen)
		e.Command.LeaseMS = d.uvarint()
		e.Command.Owner = d.str(MaxOwnerLen)
		e.Command.GrantedAtMS = d.uvarint()
	case KindRelease, KindExpire:
		e.Command.Key = d.str(MaxKeyLen)
		e.Command.Token = d.uvarint()
	case KindControl:
		e.Command.Control = d.controlRequest()
	default:
		return Entry{}, malformedf("unknown command kind %d", uint8(e.Command.Kind))
	}
	if err := d.finish(); err != nil {
		return Entry{}, err
	}
	if err := e.Command.Validate(); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// EncodeLockRecord encodes one lock as stored in a per-key storage row.
func EncodeLockRecord(l Lock) []byte {
	b := make([]byte, 0, 16+len(l.Key)+len(l.Owner))
	b = append(b, LockRecVersion)
	return appendLock(b, l)
}

// DecodeLockRecord decodes one stored lock row.
func DecodeLockRecord(b []byte) (Lock, error) {
	d := decoder{b: b}
	v := d.byte()
	if d.err == nil && v != LockRecVersion {
		return Lock{}, &Error{Code: CodeUnknownVersion, Detail: "lock record version " + strconv.Itoa(int(v))}
	}
	l := d.lock()
	if err := d.finish(); err != nil {
		return Lock{}, err
	}
	if err := validateLock(l); err != nil {
		return Lock{}, err
	}
	return l, nil
}

// SnapshotState is the whole content of a snapshot: the lock table with
// its token counter, and the control state.
type SnapshotState struct {
	LastToken uint64
	Locks     []Lock // sorted by key
	Control   ControlState
}

// EncodeSnapshot encodes a lock table with an empty control state in
// format SnapshotVersion; see EncodeSnapshotState. locks must be sorted by
// key (Machine.Locks does that).
func EncodeSnapshot(lastToken uint64, locks []Lock) []byte {
	return EncodeSnapshotState(SnapshotState{LastToken: lastToken, Locks: locks})
}

// EncodeSnapshotState encodes a snapshot in format SnapshotVersion (2):
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | control | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	control: see EncodeControlState
//
// Version 1, which DecodeSnapshot still reads, is the same without the
// control section. s.Locks must be sorted by key; the control lists are
// sorted here. Equal states give equal bytes.
func EncodeSnapshotState(s SnapshotState) []byte {
	b := make([]byte, 0, 32+len(s.Locks)*48+controlSizeHint(s.Control))
	b = append(b, snapshotMagic[:]...)
	b = append(b, SnapshotVersion)
	b = binary.AppendUvarint(b, s.LastToken)
	b = binary.AppendUvarint(b, uint64(len(s.Locks)))
	for _, l := range s.Locks {
		b = appendLock(b, l)
	}
	b = appendControl(b, s.Control)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeSnapshot decodes and validates a snapshot of version 1 or 2 and
// returns its lock table. It drops the control state: use
// DecodeSnapshotState (or Machine.Restore) wherever that must survive.
func DecodeSnapshot(b []byte) (lastToken uint64, locks []Lock, err error) {
	s, err := DecodeSnapshotState(b)
	if err != nil {
		return 0, nil, err
	}
	return s.LastToken, s.Locks, nil
}

// DecodeSnapshotState decodes and validates a snapshot: checksum, version
// (1 or 2), keys strictly ascending, tokens non-zero, unique and not above
// last_token, and (version 2) a valid control state. A version 1 snapshot
// has an empty control state.
func DecodeSnapshotState(b []byte) (SnapshotState, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version != SnapshotVersion && version != SnapshotVersion1 {
		return SnapshotState{}, &Error{Code: CodeUnknownVersion, Detail: "snapshot version " + strconv.Itoa(int(version))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return SnapshotState{}, malformedf("snapshot checksum mismatch")
	}
	d := decoder{b: body[4:]}
	var s SnapshotState
	s.LastToken = d.uvarint()
	n := d.uvarint()
	if d.err != nil {
		return SnapshotState{}, d.err
	}
	// Each lock takes at least 5 bytes, which bounds an honest count by the
	// input length; a larger count is a lie and must not drive allocation.
	if n > MaxSnapshotLocks || n > uint64(len(body))/5 {
		return SnapshotState{}, malformedf("snapshot declares %d locks in %d bytes", n, len(body))
	}
	locks := make([]Lock, 0, n)
	seen := make(map[uint64]struct{}, n)
	for i := uint64(0); i < n; i++ {
		l := d.lock()
		if d.err != nil {
			return SnapshotState{}, d.err
		}
		if err := validateLock(l); err != nil {
			return SnapshotState{}, err
		}
		if i > 0 && l.Key <= locks[i-1].Key {
			return SnapshotState{}, malformedf("snapshot keys not strictly ascending at lock %d", i)
		}
		if l.Token > s.LastToken {
			return SnapshotState{}, malformedf("lock %q has token %d above last token %d", l.Key, l.Token, s.LastToken)
		}
		if _, dup := seen[l.Token]; dup {
			return SnapshotState{}, malformedf("token %d appears twice", l.Token)
		}
		seen[l.Token] = struct{}{}
		locks = append(locks, l)
	}
	s.Locks = locks
	if version == SnapshotVersion {
		cs, err := d.control()
		if err != nil {
			return SnapshotState{}, err
		}
		s.Control = cs
	}
	if err := d.finish(); err != nil {
		return SnapshotState{}, err
	}
	return s, nil
}

// EncodeControlState encodes the control state as the control record
// (format ControlStateVersion), which raftstore keeps in its own row:
//
//	"TKC" | version:1 | control | crc32c:4 (big endian, of all before)
//
// control, shared with snapshot version 2:
//
//	flags:1 (bit 0 bootstrapped, bit 1 replacement pending; no other bits)
//	| bootstrap_hash:32 (only if bootstrapped)
//	| last_node_id:uvarint | last_incarnation:uvarint
//	| count:uvarint | member*       member = node_id:uvarint | incarnation:uvarint | role:1 | address:str
//	| count:uvarint | identity*     issued, identity = node_id:uvarint | incarnation:uvarint
//	| count:uvarint | identity*     retired
//	| count:uvarint | credential*   credential = hash:32 | state:1 (1 minted, 2 consumed)
//	| old:uvarint | new:uvarint | new_incarnation:uvarint | address:str (only if pending)
//
// Members, issued and retired are strictly ascending by node id,
// credentials strictly ascending by hash (bytewise). The lists are sorted
// here, so equal states give equal bytes. cs must satisfy the invariants
// on ControlState (Machine.ControlState and DecodeControlState give such
// states); the decoder rejects the encoding of any other.
func EncodeControlState(cs ControlState) []byte {
	b := make([]byte, 0, 8+controlSizeHint(cs))
	b = append(b, controlMagic[:]...)
	b = append(b, ControlStateVersion)
	b = appendControl(b, cs)
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
	if b[3] != ControlStateVersion {
		return ControlState{}, &Error{Code: CodeUnknownVersion, Detail: "control record version " + strconv.Itoa(int(b[3]))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return ControlState{}, malformedf("control record checksum mismatch")
	}
	d := decoder{b: body[4:]}
	cs, err := d.control()
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
	n := 64 + len(cs.Issued)*8 + len(cs.Retired)*8 + len(cs.JoinCredentials)*credentialSize
	for _, mem := range cs.Members {
		n += 16 + len(mem.Address)
	}
	return n
}

func appendControl(b []byte, cs ControlState) []byte {
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

// control reads a control section and validates it.
func (d *decoder) control() (ControlState, error) {
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

func (d *decoder) hash() [32]byte {
	var h [32]byte
	if d.err != nil {
		return h
	}
	if len(d.b) < len(h) {
		d.err = malformedf("unexpected end of input")
		return h
	}
	copy(h[:], d.b)
	d.b = d.b[len(h):]
	return h
}

// validateControlState checks the invariants listed on ControlState.
func validateControlState(cs ControlState) error {
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
	identity := func(what string, x Identity) error {
		switch {
		case x.NodeID == 0 || x.Incarnation == 0:
			return malformedf("%s node %d incarnation %d: zero id", what, x.NodeID, x.Incarnation)
		case x.NodeID > cs.LastNodeID || x.Incarnation > cs.LastIncarnation:
			return malformedf("%s node %d incarnation %d above the counters %d/%d", what, x.NodeID, x.Incarnation, cs.LastNodeID, cs.LastIncarnation)
		}
		return nil
	}
	// NodeID -> incarnation of every member and retired node: together they
	// must be exactly the issued set.
	known := make(map[uint64]uint64, len(cs.Members)+len(cs.Retired))
	members := make(map[uint64]Member, len(cs.Members))
	voters := 0
	for i, mem := range cs.Members {
		if i > 0 && mem.NodeID <= cs.Members[i-1].NodeID {
			return malformedf("members not strictly ascending at %d", i)
		}
		if err := identity("member", Identity{mem.NodeID, mem.Incarnation}); err != nil {
			return err
		}
		switch mem.Role {
		case RoleVoter:
			voters++
		case RoleLearner:
		default:
			return malformedf("member %d has role %d", mem.NodeID, uint8(mem.Role))
		}
		if err := ValidateAddress(mem.Address); err != nil {
			return err
		}
		known[mem.NodeID] = mem.Incarnation
		members[mem.NodeID] = mem
	}
	if voters == 0 {
		return malformedf("bootstrapped control state has no voter")
	}
	for i, x := range cs.Retired {
		if i > 0 && x.NodeID <= cs.Retired[i-1].NodeID {
			return malformedf("retired not strictly ascending at %d", i)
		}
		if err := identity("retired", x); err != nil {
			return err
		}
		if _, dup := known[x.NodeID]; dup {
			return malformedf("node %d is both a member and retired", x.NodeID)
		}
		known[x.NodeID] = x.Incarnation
	}
	if len(cs.Issued) != len(known) {
		return malformedf("%d issued identities, %d members and retired", len(cs.Issued), len(known))
	}
	incs := make(map[uint64]struct{}, len(cs.Issued))
	for i, x := range cs.Issued {
		if i > 0 && x.NodeID <= cs.Issued[i-1].NodeID {
			return malformedf("issued not strictly ascending at %d", i)
		}
		if err := identity("issued", x); err != nil {
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
	p := cs.Pending
	if p != nil {
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
	}
	// Addresses are unique, except that a replacement may take the address
	// of the node it replaces.
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

func validateLock(l Lock) error {
	if err := ValidateKey(l.Key); err != nil {
		return err
	}
	if err := ValidateOwner(l.Owner); err != nil {
		return err
	}
	if err := ValidateLeaseMS(l.LeaseMS); err != nil {
		return err
	}
	if l.Token == 0 {
		return malformedf("lock %q has token 0", l.Key)
	}
	return nil
}

func appendLock(b []byte, l Lock) []byte {
	b = appendString(b, l.Key)
	b = binary.AppendUvarint(b, l.Token)
	b = appendString(b, l.Owner)
	b = binary.AppendUvarint(b, l.LeaseMS)
	return binary.AppendUvarint(b, l.GrantedAtMS)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads canonical fields and remembers the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = malformedf("unexpected end of input")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = malformedf("bad varint")
		return 0
	}
	// Reject non-minimal encodings so that every value has exactly one
	// encoding and decode∘encode is the identity.
	if n != uvarintLen(v) {
		d.err = malformedf("non-canonical varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) {
		d.err = malformedf("string of %d bytes exceeds limit %d", n, limit)
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = malformedf("unexpected end of input")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) lock() Lock {
	var l Lock
	l.Key = d.str(MaxKeyLen)
	l.Token = d.uvarint()
	l.Owner = d.str(MaxOwnerLen)
	l.LeaseMS = d.uvarint()
	l.GrantedAtMS = d.uvarint()
	return l
}

func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return malformedf("%d trailing bytes", len(d.b))
	}
	return nil
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
