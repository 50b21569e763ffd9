package core

import (
	"encoding/binary"
	"hash/crc32"
	"strconv"
)

// Encodings: the format versions, log entries, lock records, and the
// canonical field primitives every encoding shares. Snapshots are
// encoding_snapshot.go; the control state is encoding_control.go.

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
