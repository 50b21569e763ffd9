package core

import (
	"encoding/binary"
	"hash/crc32"
	"strconv"
)

// Encodings: the format versions, log entries, lock records, and the
// canonical field primitives every encoding shares. Snapshots are
// encoding_snapshot.go; the control state is encoding_control.go.

// Format versions. A decoder accepts exactly the versions it knows; which
// one an encoder writes follows the cluster version (version.go).
const (
	// EntryVersion1 carries Grant (without identity), Release, Expire and
	// the control ops up to Retire; EntryVersion2 adds Grant.Identity,
	// Renew and SetClusterVersion; EntryVersion3 adds Grant.RequestID and
	// SetFenceKey; EntryVersion4 adds Grant.SessionID and
	// Grant.LockDelayMS and the session and lock-delay commands.
	EntryVersion1 byte = 1
	EntryVersion2 byte = 2
	EntryVersion3 byte = 3
	EntryVersion4 byte = 4
	// EntryVersion5 adds Grant.Limit and Grant.Mode (kinds.go).
	EntryVersion5 byte = 5
	// EntryVersion6 adds Settle (requests.go).
	EntryVersion6 byte = 6
	// SnapshotVersion1 is a lock table; SnapshotVersion2 adds the control
	// state; SnapshotVersion3 adds each lock's identity and writes the
	// control section in its version 2 form (with the cluster version);
	// SnapshotVersion4 adds each lock's request id, writes the control
	// section in its version 3 form (with the fence keys) and adds the
	// request section (data clock and ended request records);
	// SnapshotVersion5 adds each lock's session and lock-delay and the
	// session section (sessions and delayed keys), with the control
	// section still in its version 3 form.
	SnapshotVersion1 byte = 1
	SnapshotVersion2 byte = 2
	SnapshotVersion3 byte = 3
	SnapshotVersion4 byte = 4
	SnapshotVersion5 byte = 5
	// SnapshotVersion6 adds the kinds section (encoding_kinds.go): every
	// multi-holder key with its holders and delayed slots.
	SnapshotVersion6 byte = 6
	// LockRecVersion2 adds the identity to LockRecVersion1; LockRecVersion3
	// adds the request id; LockRecVersion4 the session and lock-delay.
	LockRecVersion1 byte = 1
	LockRecVersion2 byte = 2
	LockRecVersion3 byte = 3
	LockRecVersion4 byte = 4
	// ControlStateVersion2 adds the cluster version to
	// ControlStateVersion1; ControlStateVersion3 adds the fence keys.
	ControlStateVersion1 byte = 1
	ControlStateVersion2 byte = 2
	ControlStateVersion3 byte = 3
	// EndedRequestVersion1 is the one format of a stored ended request
	// record (EncodeEndedRequest).
	EndedRequestVersion1 byte = 1
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
// result to its waiting caller; Apply never looks at it. (The client's
// request id of a Grant is Command.RequestID, which Apply does use.)
type Entry struct {
	RequestID uint64
	Command   Command
}

// EncodeEntry encodes a log entry in the oldest format that can carry it
// (entryVersion), version 1 to 6:
//
//	version:1 | request_id:uvarint | kind:1 | fields
//	  grant:          key:str | lease_ms:uvarint | owner:str | granted_at_ms:uvarint
//	                  | identity:str (version 2 to 4) | client_request_id:str (version 3 and 4)
//	                  | session_id:uvarint | lock_delay_ms:uvarint (version 4 and 5)
//	                  | limit:uvarint | mode:1 (version 5 only)
//	  release/expire: key:str | token:uvarint
//	  renew:          key:str | token:uvarint | lease_ms:uvarint (version 2 only)
//	  open_session:   identity:str | ttl_ms:uvarint | lock_delay_ms:uvarint (version 4 only,
//	                  as are the four below)
//	  close_session:  session_id:uvarint | identity:str
//	  expire_session: session_id:uvarint | epoch:uvarint
//	  refresh_session: session_id:uvarint
//	  clear_delay:    key:str | delay_seq:uvarint
//	  settle:         key:str | identity:str | client_request_id:str | now_ms:uvarint
//	                  (version 6 only)
//	  control:        op:1 | the op's fields, in this order, each only if the op has it:
//	                  credential_hash:32 | node_id:uvarint | incarnation:uvarint |
//	                  old_node_id:uvarint | new_node_id:uvarint | new_incarnation:uvarint |
//	                  address:str (at most MaxAddressLen)
//	    bootstrap, admit:            credential_hash | address
//	    mint_join:                   credential_hash
//	    promote, retire:             node_id | incarnation
//	    prepare_replacement:         old_node_id | address
//	    complete/abort_replacement:  old_node_id | new_node_id | new_incarnation
//	    set_cluster_version:         version:uvarint (version 2 and 3; after address in field order)
//	    set_fence_key:               seed:32 (version 3 only; after version in field order)
//	str = length:uvarint | bytes
//
// Only the fields the kind (and op) carries are written.
func EncodeEntry(e Entry) []byte {
	c := e.Command
	b := make([]byte, 0, 24+len(c.Key)+len(c.Owner)+len(c.Identity)+len(c.RequestID)+len(c.Control.Address))
	version := entryVersion(c)
	b = append(b, version)
	b = binary.AppendUvarint(b, e.RequestID)
	b = append(b, byte(c.Kind))
	switch c.Kind {
	case KindGrant:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.LeaseMS)
		b = appendString(b, c.Owner)
		b = binary.AppendUvarint(b, c.GrantedAtMS)
		if version >= EntryVersion2 {
			b = appendString(b, c.Identity)
		}
		if version >= EntryVersion3 {
			b = appendString(b, c.RequestID)
		}
		if version >= EntryVersion4 {
			b = binary.AppendUvarint(b, c.SessionID)
			b = binary.AppendUvarint(b, c.LockDelayMS)
		}
		if version >= EntryVersion5 {
			b = binary.AppendUvarint(b, uint64(c.Limit))
			b = append(b, byte(c.Mode))
		}
	case KindOpenSession:
		b = appendString(b, c.Identity)
		b = binary.AppendUvarint(b, c.TTLMS)
		b = binary.AppendUvarint(b, c.LockDelayMS)
	case KindCloseSession:
		b = binary.AppendUvarint(b, c.SessionID)
		b = appendString(b, c.Identity)
	case KindExpireSession:
		b = binary.AppendUvarint(b, c.SessionID)
		b = binary.AppendUvarint(b, c.Epoch)
	case KindRefreshSession:
		b = binary.AppendUvarint(b, c.SessionID)
	case KindClearDelay:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.DelaySeq)
	case KindRenew:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
		b = binary.AppendUvarint(b, c.LeaseMS)
	case KindSettle:
		b = appendString(b, c.Key)
		b = appendString(b, c.Identity)
		b = appendString(b, c.RequestID)
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
		bit uint16
		v   uint64
	}{{cfNodeID, r.NodeID}, {cfIncarnation, r.Incarnation}, {cfOldNodeID, r.OldNodeID}, {cfNewNodeID, r.NewNodeID}, {cfNewIncarnation, r.NewIncarnation}} {
		if f&x.bit != 0 {
			b = binary.AppendUvarint(b, x.v)
		}
	}
	if f&cfAddress != 0 {
		b = appendString(b, r.Address)
	}
	if f&cfVersion != 0 {
		b = binary.AppendUvarint(b, r.Version)
	}
	if f&cfSeed != 0 {
		b = append(b, r.FenceSeed[:]...)
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
		bit uint16
		v   *uint64
	}{{cfNodeID, &r.NodeID}, {cfIncarnation, &r.Incarnation}, {cfOldNodeID, &r.OldNodeID}, {cfNewNodeID, &r.NewNodeID}, {cfNewIncarnation, &r.NewIncarnation}} {
		if f&x.bit != 0 {
			*x.v = d.uvarint()
		}
	}
	if f&cfAddress != 0 {
		r.Address = d.str(MaxAddressLen)
	}
	if f&cfVersion != 0 {
		r.Version = d.uvarint()
	}
	if f&cfSeed != 0 {
		r.FenceSeed = d.hash()
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
	if d.err == nil && (v < EntryVersion1 || v > EntryVersion6) {
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
		if v >= EntryVersion2 {
			e.Command.Identity = d.str(MaxIdentityLen)
		}
		if v >= EntryVersion3 {
			e.Command.RequestID = d.str(MaxRequestIDLen)
		}
		if v >= EntryVersion4 {
			e.Command.SessionID = d.uvarint()
			e.Command.LockDelayMS = d.uvarint()
		}
		if v >= EntryVersion5 {
			limit := d.uvarint()
			if limit > MaxSemaphoreLimit {
				return Entry{}, malformedf("limit %d above %d", limit, MaxSemaphoreLimit)
			}
			e.Command.Limit = uint32(limit)
			e.Command.Mode = Mode(d.byte())
		}
	case KindOpenSession, KindCloseSession, KindExpireSession, KindRefreshSession, KindClearDelay:
		if v < EntryVersion4 {
			return Entry{}, malformedf("%s in entry version %d", e.Command.Kind, v)
		}
		d.sessionCommand(&e.Command)
	case KindRelease, KindExpire:
		e.Command.Key = d.str(MaxKeyLen)
		e.Command.Token = d.uvarint()
	case KindRenew:
		e.Command.Key = d.str(MaxKeyLen)
		e.Command.Token = d.uvarint()
		e.Command.LeaseMS = d.uvarint()
	case KindSettle:
		if v < EntryVersion6 {
			return Entry{}, malformedf("%s in entry version %d", e.Command.Kind, v)
		}
		e.Command.Key = d.str(MaxKeyLen)
		e.Command.Identity = d.str(MaxIdentityLen)
		e.Command.RequestID = d.str(MaxRequestIDLen)
		e.Command.GrantedAtMS = d.uvarint()
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
	// Each command has exactly one encoding: the oldest format that can
	// carry it (a version 2 grant without identity would also decode to a
	// version 1 command, a version 3 grant without request id to a version
	// 2 or 1 one, a version 4 grant without session or lock-delay to an
	// older one).
	if entryVersion(e.Command) != v {
		return Entry{}, malformedf("%s in entry version %d, want %d", e.Command.Kind, v, entryVersion(e.Command))
	}
	return e, nil
}

// EncodeLockRecord encodes one lock as stored in a per-key storage row, in
// the oldest version that carries it: version 1 (version:1 | lock) when it
// has neither identity nor request id, version 2 (version:1 | lock |
// identity:str) when it has only an identity, version 3 (version:1 | lock
// | identity:str | request_id:str) when it has a request id, and version 4
// (version:1 | lock | identity:str | request_id:str | session_id:uvarint
// | lock_delay_ms:uvarint) when it has a session or a lock-delay.
func EncodeLockRecord(l Lock) []byte {
	b := make([]byte, 0, 40+len(l.Key)+len(l.Owner)+len(l.Identity)+len(l.RequestID))
	switch {
	case l.SessionID != 0 || l.LockDelayMS != 0:
		b = append(b, LockRecVersion4)
		b = appendString(appendString(appendLock(b, l), l.Identity), l.RequestID)
		return binary.AppendUvarint(binary.AppendUvarint(b, l.SessionID), l.LockDelayMS)
	case l.RequestID != "":
		b = append(b, LockRecVersion3)
		return appendString(appendString(appendLock(b, l), l.Identity), l.RequestID)
	case l.Identity != "":
		b = append(b, LockRecVersion2)
		return appendString(appendLock(b, l), l.Identity)
	}
	b = append(b, LockRecVersion1)
	return appendLock(b, l)
}

// DecodeLockRecord decodes one stored lock row.
func DecodeLockRecord(b []byte) (Lock, error) {
	d := decoder{b: b}
	v := d.byte()
	if d.err == nil && (v < LockRecVersion1 || v > LockRecVersion4) {
		return Lock{}, &Error{Code: CodeUnknownVersion, Detail: "lock record version " + strconv.Itoa(int(v))}
	}
	l := d.lock()
	if v >= LockRecVersion2 {
		l.Identity = d.str(MaxIdentityLen)
	}
	if v >= LockRecVersion3 {
		l.RequestID = d.str(MaxRequestIDLen)
	}
	if v >= LockRecVersion4 {
		l.SessionID = d.uvarint()
		l.LockDelayMS = d.uvarint()
	}
	// Canonical: each lock has one record, the oldest version that carries it.
	switch {
	case d.err != nil:
	case v == LockRecVersion2 && l.Identity == "":
		return Lock{}, malformedf("lock record version 2 with an empty identity")
	case v == LockRecVersion3 && l.RequestID == "":
		return Lock{}, malformedf("lock record version 3 with an empty request id")
	case v == LockRecVersion4 && l.SessionID == 0 && l.LockDelayMS == 0:
		return Lock{}, malformedf("lock record version 4 without a session or a lock-delay")
	}
	if err := d.finish(); err != nil {
		return Lock{}, err
	}
	if err := validateLock(l); err != nil {
		return Lock{}, err
	}
	return l, nil
}

func validateLock(l Lock) error {
	if err := ValidateKey(l.Key); err != nil {
		return err
	}
	if err := ValidateOwner(l.Owner); err != nil {
		return err
	}
	if err := ValidateIdentity(l.Identity); err != nil {
		return err
	}
	if err := ValidateRequestID(l.RequestID); err != nil {
		return err
	}
	if err := validateHold(l.LeaseMS, l.SessionID, l.LockDelayMS); err != nil {
		return err
	}
	if l.Token == 0 {
		return malformedf("lock %q has token 0", l.Key)
	}
	return nil
}

// ValidateLock checks every field of a lock as a lock record or snapshot
// carries it (storage checks a row before writing it).
func ValidateLock(l Lock) error { return validateLock(l) }

// sessionCommand reads the fields of a session or lock-delay command.
func (d *decoder) sessionCommand(c *Command) {
	switch c.Kind {
	case KindOpenSession:
		c.Identity = d.str(MaxIdentityLen)
		c.TTLMS = d.uvarint()
		c.LockDelayMS = d.uvarint()
	case KindCloseSession:
		c.SessionID = d.uvarint()
		c.Identity = d.str(MaxIdentityLen)
	case KindExpireSession:
		c.SessionID = d.uvarint()
		c.Epoch = d.uvarint()
	case KindRefreshSession:
		c.SessionID = d.uvarint()
	case KindClearDelay:
		c.Key = d.str(MaxKeyLen)
		c.DelaySeq = d.uvarint()
	}
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

// rawStr is str without the copy: the bytes alias the input.
func (d *decoder) rawStr(limit int) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) {
		d.err = malformedf("string of %d bytes exceeds limit %d", n, limit)
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = malformedf("unexpected end of input")
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
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
