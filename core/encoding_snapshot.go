package core

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strconv"
	"unicode/utf8"
)

// Snapshot encoding: the lock table with its token counter, and (version
// 2) the control state of encoding_control.go.

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

// EncodeSnapshotState encodes a snapshot in format SnapshotVersion2 while
// the cluster version is 1, SnapshotVersion3 from cluster version 2 on:
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | control | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	       | identity:str (version 3 only)
//	control: see EncodeControlState (its version 1 form in snapshot
//	         version 2, its version 2 form in snapshot version 3)
//
// Version 1, which DecodeSnapshot still reads, is version 2 without the
// control section. s.Locks must be sorted by key; the control lists are
// sorted here. Equal states give equal bytes. A lock with an identity
// exists only from cluster version 2 on (Apply refuses it before).
func EncodeSnapshotState(s SnapshotState) []byte {
	e := NewSnapshotEncoder(s.LastToken, len(s.Locks), s.Control, 48*len(s.Locks))
	for _, l := range s.Locks {
		e.b = e.appendLock(e.b, l)
	}
	e.added = uint64(len(s.Locks))
	return e.finish()
}

// SnapshotEncoder writes a snapshot one lock at a time, in exactly the
// bytes EncodeSnapshotState gives for the same state, so that a snapshot
// can be built from a stream of locks (raftstore reads them from a
// storage snapshot, off the raft loop) without first building the table.
type SnapshotEncoder struct {
	b          []byte
	version    byte
	ctl        ControlState
	ctlVersion byte
	count      uint64 // declared
	added      uint64
	lastKey    string
	// lastKeyBytes is lastKey for AddRecord (the two are not mixed).
	lastKeyBytes []byte
	lastToken    uint64
	err          error
}

// NewSnapshotEncoder starts a snapshot that will hold count locks; sizeHint
// is the expected size of the locks' encoding (0 if unknown).
func NewSnapshotEncoder(lastToken uint64, count int, control ControlState, sizeHint int) *SnapshotEncoder {
	e := &SnapshotEncoder{ctl: control, ctlVersion: controlVersion(control), count: uint64(count), lastToken: lastToken}
	e.version = SnapshotVersion2
	if e.ctlVersion >= ControlStateVersion2 {
		e.version = SnapshotVersion3
	}
	e.b = make([]byte, 0, 32+max(0, sizeHint)+controlSizeHint(control))
	e.b = append(e.b, snapshotMagic[:]...)
	e.b = append(e.b, e.version)
	e.b = binary.AppendUvarint(e.b, lastToken)
	e.b = binary.AppendUvarint(e.b, e.count)
	return e
}

func (e *SnapshotEncoder) appendLock(b []byte, l Lock) []byte {
	b = appendLock(b, l)
	if e.version >= SnapshotVersion3 {
		b = appendString(b, l.Identity)
	}
	return b
}

// Add appends the next lock. Locks must come in strictly ascending key
// order, valid, with tokens not above the last token, and no more than
// the declared count; the first violation is returned by Finish too.
func (e *SnapshotEncoder) Add(l Lock) error {
	if e.err != nil {
		return e.err
	}
	switch err := validateLock(l); {
	case err != nil:
		e.err = err
	case e.added >= e.count:
		e.err = invalidf("snapshot declared %d locks, got more", e.count)
	case e.added > 0 && l.Key <= e.lastKey:
		e.err = invalidf("snapshot keys not strictly ascending at %q", l.Key)
	case l.Token > e.lastToken:
		e.err = invalidf("lock %q has token %d above last token %d", l.Key, l.Token, e.lastToken)
	case l.Identity != "" && e.version < SnapshotVersion3:
		e.err = invalidf("lock %q has an identity before cluster version 2", l.Key)
	}
	if e.err != nil {
		return e.err
	}
	e.b = e.appendLock(e.b, l)
	e.lastKey = l.Key
	e.added++
	return nil
}

// AddRecord appends the next lock given as its stored lock record
// (EncodeLockRecord bytes), without decoding it into a Lock: the fields
// are checked in place, with the same rules as Add, and copied. It
// allocates nothing, so that encoding a large table in the background
// does not load the garbage collector (and with it the raft loop).
func (e *SnapshotEncoder) AddRecord(record []byte) error {
	if e.err != nil {
		return e.err
	}
	d := decoder{b: record}
	v := d.byte()
	if d.err == nil && v != LockRecVersion1 && v != LockRecVersion2 {
		e.err = &Error{Code: CodeUnknownVersion, Detail: "lock record version " + strconv.Itoa(int(v))}
		return e.err
	}
	key := d.rawStr(MaxKeyLen)
	token := d.uvarint()
	owner := d.rawStr(MaxOwnerLen)
	lease := d.uvarint()
	_ = d.uvarint() // granted_at_ms: any value
	var identity []byte
	if v == LockRecVersion2 {
		identity = d.rawStr(MaxIdentityLen)
		if d.err == nil && len(identity) == 0 {
			d.err = malformedf("lock record version 2 with an empty identity")
		}
	}
	switch err := d.finish(); {
	case err != nil:
		e.err = err
	case !validKeyBytes(key):
		e.err = invalidf("lock record with an invalid key %q", key)
	case !utf8.Valid(owner), !validIdentityBytes(identity):
		e.err = invalidf("lock %q: owner or identity is not valid", key)
	case ValidateLeaseMS(lease) != nil:
		e.err = ValidateLeaseMS(lease)
	case token == 0 || token > e.lastToken:
		e.err = invalidf("lock %q has token %d, last token %d", key, token, e.lastToken)
	case e.added >= e.count:
		e.err = invalidf("snapshot declared %d locks, got more", e.count)
	case e.added > 0 && bytes.Compare(key, e.lastKeyBytes) <= 0:
		e.err = invalidf("snapshot keys not strictly ascending at %q", key)
	case v == LockRecVersion2 && e.version < SnapshotVersion3:
		e.err = invalidf("lock %q has an identity before cluster version 2", key)
	}
	if e.err != nil {
		return e.err
	}
	// The record after its version byte is the snapshot's lock encoding;
	// a version 3 snapshot adds the identity, empty for a version 1 record.
	e.b = append(e.b, record[1:]...)
	if e.version >= SnapshotVersion3 && v == LockRecVersion1 {
		e.b = append(e.b, 0)
	}
	e.lastKeyBytes = append(e.lastKeyBytes[:0], key...)
	e.added++
	return nil
}

// Finish appends the control section and the checksum and returns the
// snapshot, or the first error (also when fewer locks were added than
// declared).
func (e *SnapshotEncoder) Finish() ([]byte, error) {
	if e.err == nil && e.added != e.count {
		e.err = invalidf("snapshot declared %d locks, got %d", e.count, e.added)
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func (e *SnapshotEncoder) finish() []byte {
	b := appendControl(e.b, e.ctl, e.ctlVersion)
	e.b = nil
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// SnapshotInfo is what CheckSnapshot reads from a snapshot without
// decoding its locks.
type SnapshotInfo struct {
	Version   byte
	LastToken uint64
	Locks     uint64
}

// CheckSnapshot verifies a snapshot's magic, version and checksum and
// reads its header, in one pass over the bytes at checksum speed, without
// decoding the locks: for code that needs to know a blob is the snapshot
// it wrote, not to validate it (DecodeSnapshotState does that).
func CheckSnapshot(b []byte) (SnapshotInfo, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotInfo{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotInfo{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version < SnapshotVersion1 || version > SnapshotVersion3 {
		return SnapshotInfo{}, &Error{Code: CodeUnknownVersion, Detail: "snapshot version " + strconv.Itoa(int(version))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return SnapshotInfo{}, malformedf("snapshot checksum mismatch")
	}
	d := decoder{b: body[4:]}
	info := SnapshotInfo{Version: version, LastToken: d.uvarint(), Locks: d.uvarint()}
	if d.err != nil {
		return SnapshotInfo{}, d.err
	}
	return info, nil
}

// DecodeSnapshot decodes and validates a snapshot of version 1, 2 or 3 and
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
// (1, 2 or 3), keys strictly ascending, tokens non-zero, unique and not
// above last_token, and (version 2 and 3) a valid control state. A version
// 1 snapshot has an empty control state; only version 3 carries lock
// identities and a cluster version.
func DecodeSnapshotState(b []byte) (SnapshotState, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version < SnapshotVersion1 || version > SnapshotVersion3 {
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
		if version >= SnapshotVersion3 {
			l.Identity = d.str(MaxIdentityLen)
		}
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
	if version >= SnapshotVersion2 {
		ctlVersion := ControlStateVersion1
		if version >= SnapshotVersion3 {
			ctlVersion = ControlStateVersion2
		}
		cs, err := d.control(ctlVersion)
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

// LastKey is the key of the last lock AddRecord appended (it aliases the
// encoder's buffer until the next call).
func (e *SnapshotEncoder) LastKey() []byte { return e.lastKeyBytes }
