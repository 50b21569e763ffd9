package core

import (
	"encoding/binary"
	"hash/crc32"
	"strconv"
)

// Format versions. A decoder accepts exactly the versions it knows.
const (
	EntryVersion    byte = 1
	SnapshotVersion byte = 1
	LockRecVersion  byte = 1
)

// snapshotMagic starts every snapshot so that a stray blob is not mistaken
// for one.
var snapshotMagic = [3]byte{'T', 'K', 'S'}

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
//	str = length:uvarint | bytes
func EncodeEntry(e Entry) []byte {
	c := e.Command
	b := make([]byte, 0, 24+len(c.Key)+len(c.Owner))
	b = append(b, EntryVersion)
	b = binary.AppendUvarint(b, e.RequestID)
	b = append(b, byte(c.Kind))
	switch c.Kind {
	case KindGrant:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.LeaseMS)
		b = appendString(b, c.Owner)
		b = binary.AppendUvarint(b, c.GrantedAtMS)
	default:
		b = appendString(b, c.Key)
		b = binary.AppendUvarint(b, c.Token)
	}
	return b
}

// DecodeEntry decodes and validates a log entry. It rejects unknown
// versions, unknown or reserved kinds, non-canonical integers, trailing
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
		return Entry{}, &Error{Code: CodeUnsupported, Detail: "control entries are not implemented yet"}
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

// EncodeSnapshot encodes a lock table in format SnapshotVersion:
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//
// locks must be sorted by key (Machine.Locks does that).
func EncodeSnapshot(lastToken uint64, locks []Lock) []byte {
	b := make([]byte, 0, 16+len(locks)*48)
	b = append(b, snapshotMagic[:]...)
	b = append(b, SnapshotVersion)
	b = binary.AppendUvarint(b, lastToken)
	b = binary.AppendUvarint(b, uint64(len(locks)))
	for _, l := range locks {
		b = appendLock(b, l)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeSnapshot decodes and validates a snapshot: checksum, version, keys
// strictly ascending, tokens non-zero, unique and not above last_token.
func DecodeSnapshot(b []byte) (lastToken uint64, locks []Lock, err error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return 0, nil, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return 0, nil, malformedf("snapshot magic missing")
	}
	if b[3] != SnapshotVersion {
		return 0, nil, &Error{Code: CodeUnknownVersion, Detail: "snapshot version " + strconv.Itoa(int(b[3]))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return 0, nil, malformedf("snapshot checksum mismatch")
	}
	d := decoder{b: body[4:]}
	lastToken = d.uvarint()
	n := d.uvarint()
	if d.err != nil {
		return 0, nil, d.err
	}
	// Each lock takes at least 5 bytes, which bounds an honest count by the
	// input length; a larger count is a lie and must not drive allocation.
	if n > MaxSnapshotLocks || n > uint64(len(body))/5 {
		return 0, nil, malformedf("snapshot declares %d locks in %d bytes", n, len(body))
	}
	locks = make([]Lock, 0, n)
	seen := make(map[uint64]struct{}, n)
	for i := uint64(0); i < n; i++ {
		l := d.lock()
		if d.err != nil {
			return 0, nil, d.err
		}
		if err := validateLock(l); err != nil {
			return 0, nil, err
		}
		if i > 0 && l.Key <= locks[i-1].Key {
			return 0, nil, malformedf("snapshot keys not strictly ascending at lock %d", i)
		}
		if l.Token > lastToken {
			return 0, nil, malformedf("lock %q has token %d above last token %d", l.Key, l.Token, lastToken)
		}
		if _, dup := seen[l.Token]; dup {
			return 0, nil, malformedf("token %d appears twice", l.Token)
		}
		seen[l.Token] = struct{}{}
		locks = append(locks, l)
	}
	if err := d.finish(); err != nil {
		return 0, nil, err
	}
	return lastToken, locks, nil
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
