package core

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strconv"
	"unicode/utf8"
)

// Snapshot encoding: the lock table with its token counter, (version 2)
// the control state of encoding_control.go and (version 4) the request
// section of encoding_requests.go.

// SnapshotState is the whole content of a snapshot: the lock table with
// its token counter, the control state and the request records.
type SnapshotState struct {
	LastToken uint64
	Locks     []Lock // sorted by key
	Control   ControlState
	Requests  RequestState // empty before snapshot version 4
}

// EncodeSnapshot encodes a lock table with an empty control state in
// format SnapshotVersion; see EncodeSnapshotState. locks must be sorted by
// key (Machine.Locks does that).
func EncodeSnapshot(lastToken uint64, locks []Lock) []byte {
	return EncodeSnapshotState(SnapshotState{LastToken: lastToken, Locks: locks})
}

// EncodeSnapshotState encodes a snapshot in format SnapshotVersion2 while
// the cluster version is 1, SnapshotVersion3 at cluster version 2,
// SnapshotVersion4 from cluster version 3 on:
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | control
//	      | requests (version 4 only) | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	       | identity:str (version 3 and 4) | request_id:str (version 4 only)
//	control: see EncodeControlState (its version 1 form in snapshot
//	         version 2, 2 in 3, 3 in 4)
//	requests: see encoding_requests.go
//
// Version 1, which DecodeSnapshot still reads, is version 2 without the
// control section. s.Locks must be sorted by key; the control lists are
// sorted here. Equal states give equal bytes. A lock with an identity
// exists only from cluster version 2 on, one with a request id and request
// records only from 3 on (Apply refuses them before).
func EncodeSnapshotState(s SnapshotState) []byte {
	e := NewSnapshotEncoder(s.LastToken, len(s.Locks), s.Control, 48*len(s.Locks)+80*len(s.Requests.Ended))
	for _, l := range s.Locks {
		e.b = e.appendLock(e.b, l)
	}
	e.added = uint64(len(s.Locks))
	if rs := &s.Requests; e.version >= SnapshotVersion4 {
		e.begin(rs.DataClockMS, rs.EndedHead, len(rs.Ended))
		for i := range rs.Ended {
			e.b = appendEndedRequest(e.b, &rs.Ended[i])
		}
		e.endedAdded = e.endedCount
	}
	return e.finish()
}

// SnapshotEncoder writes a snapshot one lock at a time, in exactly the
// bytes EncodeSnapshotState gives for the same state, so that a snapshot
// can be built from a stream of locks (raftstore reads them from a
// storage snapshot, off the raft loop) without first building the table.
// Locks come first (Add or AddRecord), then, from snapshot version 4 on,
// the request section (BeginRequests and AddEnded), then Finish.
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

	// The request section: begun once the locks are done.
	begun      bool
	clockMS    uint64
	endedCount uint64 // declared
	endedAdded uint64
	lastEnded  uint64 // EndedAtMS of the last record added
}

// NewSnapshotEncoder starts a snapshot that will hold count locks; sizeHint
// is the expected size of the locks' encoding (0 if unknown).
func NewSnapshotEncoder(lastToken uint64, count int, control ControlState, sizeHint int) *SnapshotEncoder {
	e := &SnapshotEncoder{ctl: control, ctlVersion: controlVersion(control), count: uint64(count), lastToken: lastToken}
	e.version = SnapshotVersion2 + e.ctlVersion - ControlStateVersion1
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
	if e.version >= SnapshotVersion4 {
		b = appendString(b, l.RequestID)
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
	case e.begun:
		e.err = invalidf("lock %q after the request section began", l.Key)
	case e.added >= e.count:
		e.err = invalidf("snapshot declared %d locks, got more", e.count)
	case e.added > 0 && l.Key <= e.lastKey:
		e.err = invalidf("snapshot keys not strictly ascending at %q", l.Key)
	case l.Token > e.lastToken:
		e.err = invalidf("lock %q has token %d above last token %d", l.Key, l.Token, e.lastToken)
	case l.Identity != "" && e.version < SnapshotVersion3:
		e.err = invalidf("lock %q has an identity before cluster version 2", l.Key)
	case l.RequestID != "" && e.version < SnapshotVersion4:
		e.err = invalidf("lock %q has a request id before cluster version 3", l.Key)
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
	if d.err == nil && (v < LockRecVersion1 || v > LockRecVersion3) {
		e.err = &Error{Code: CodeUnknownVersion, Detail: "lock record version " + strconv.Itoa(int(v))}
		return e.err
	}
	key := d.rawStr(MaxKeyLen)
	token := d.uvarint()
	owner := d.rawStr(MaxOwnerLen)
	lease := d.uvarint()
	_ = d.uvarint() // granted_at_ms: any value
	var identity, requestID []byte
	if v >= LockRecVersion2 {
		identity = d.rawStr(MaxIdentityLen)
	}
	if v >= LockRecVersion3 {
		requestID = d.rawStr(MaxRequestIDLen)
	}
	switch {
	case d.err != nil:
	case v == LockRecVersion2 && len(identity) == 0:
		d.err = malformedf("lock record version 2 with an empty identity")
	case v == LockRecVersion3 && len(requestID) == 0:
		d.err = malformedf("lock record version 3 with an empty request id")
	}
	switch err := d.finish(); {
	case err != nil:
		e.err = err
	case e.begun:
		e.err = invalidf("lock %q after the request section began", key)
	case !validKeyBytes(key):
		e.err = invalidf("lock record with an invalid key %q", key)
	case !utf8.Valid(owner), !validIdentityBytes(identity), !validRequestIDBytes(requestID):
		e.err = invalidf("lock %q: owner, identity or request id is not valid", key)
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
	case v == LockRecVersion3 && e.version < SnapshotVersion4:
		e.err = invalidf("lock %q has a request id before cluster version 3", key)
	}
	if e.err != nil {
		return e.err
	}
	// The record after its version byte is the snapshot's lock encoding
	// with the fields of its own version; the snapshot's version adds
	// those the record lacks, empty (identity from 3, request id from 4).
	e.b = append(e.b, record[1:]...)
	if e.version >= SnapshotVersion3 && v < LockRecVersion2 {
		e.b = append(e.b, 0) // identity
	}
	if e.version >= SnapshotVersion4 && v < LockRecVersion3 {
		e.b = append(e.b, 0) // request id
	}
	e.lastKeyBytes = append(e.lastKeyBytes[:0], key...)
	e.added++
	return nil
}

// BeginRequests ends the locks and starts the request section: the data
// clock, the sequence number of the first ended record and how many will
// follow (AddEnded). Before snapshot version 4 (cluster version 3) the
// section must be empty. Without it, Finish writes an empty one.
func (e *SnapshotEncoder) BeginRequests(dataClockMS, endedHead uint64, endedCount int) error {
	switch {
	case e.err != nil:
		return e.err
	case e.begun:
		e.err = invalidf("the request section began twice")
	case e.added != e.count:
		e.err = invalidf("snapshot declared %d locks, got %d", e.count, e.added)
	case e.version < SnapshotVersion4 && (dataClockMS != 0 || endedHead != 0 || endedCount != 0):
		e.err = invalidf("request records before cluster version 3")
	case endedCount < 0 || endedCount > MaxRequestRecords:
		e.err = invalidf("%d ended requests, the limit is %d", endedCount, MaxRequestRecords)
	}
	if e.err != nil {
		return e.err
	}
	e.begin(dataClockMS, endedHead, endedCount)
	return nil
}

// begin appends the control section and the request section's header.
func (e *SnapshotEncoder) begin(dataClockMS, endedHead uint64, endedCount int) {
	e.begun, e.clockMS, e.endedCount = true, dataClockMS, uint64(endedCount)
	e.b = appendControl(e.b, e.ctl, e.ctlVersion)
	if e.version >= SnapshotVersion4 {
		e.b = appendRequestsHeader(e.b, dataClockMS, endedHead, endedCount)
	}
}

// AddEnded appends the next ended request record, oldest first: its token
// not zero nor above the last token, ended in order and not after the
// data clock, no more than declared.
func (e *SnapshotEncoder) AddEnded(r EndedRequest) error {
	switch {
	case e.err != nil:
		return e.err
	case !e.begun:
		e.err = invalidf("ended request before BeginRequests")
	case e.endedAdded >= e.endedCount:
		e.err = invalidf("snapshot declared %d ended requests, got more", e.endedCount)
	case r.Token == 0 || r.Token > e.lastToken:
		e.err = invalidf("ended request has token %d, last token %d", r.Token, e.lastToken)
	case r.EndedAtMS < e.lastEnded || r.EndedAtMS > e.clockMS:
		e.err = invalidf("ended request at %d after one at %d, data clock %d", r.EndedAtMS, e.lastEnded, e.clockMS)
	}
	if e.err != nil {
		return e.err
	}
	e.b = appendEndedRequest(e.b, &r)
	e.lastEnded = r.EndedAtMS
	e.endedAdded++
	return nil
}

// Finish appends the control section (and an empty request section) if
// BeginRequests did not, and the checksum, and returns the snapshot, or
// the first error (also when fewer locks or ended records were added than
// declared).
func (e *SnapshotEncoder) Finish() ([]byte, error) {
	switch {
	case e.err != nil:
	case e.added != e.count:
		e.err = invalidf("snapshot declared %d locks, got %d", e.count, e.added)
	case e.endedAdded != e.endedCount:
		e.err = invalidf("snapshot declared %d ended requests, got %d", e.endedCount, e.endedAdded)
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.finish(), nil
}

func (e *SnapshotEncoder) finish() []byte {
	if !e.begun {
		e.begin(0, 0, 0)
	}
	b := e.b
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
	if version < SnapshotVersion1 || version > SnapshotVersion4 {
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

// DecodeSnapshot decodes and validates a snapshot of version 1 to 4 and
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
// (1 to 4), keys strictly ascending, tokens non-zero, unique and not
// above last_token, (from version 2) a valid control state, and (version
// 4) request ids unique per identity and a request section that agrees
// with the locks (validateRequests). A version 1 snapshot has an empty
// control state; only versions 3 and 4 carry lock identities and a
// cluster version, only version 4 request ids, request records and fence
// keys.
func DecodeSnapshotState(b []byte) (SnapshotState, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version < SnapshotVersion1 || version > SnapshotVersion4 {
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
	var withID map[[32]byte]struct{}
	for i := uint64(0); i < n; i++ {
		l := d.lock()
		if version >= SnapshotVersion3 {
			l.Identity = d.str(MaxIdentityLen)
		}
		if version >= SnapshotVersion4 {
			l.RequestID = d.str(MaxRequestIDLen)
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
		if l.RequestID != "" {
			if withID == nil {
				withID = make(map[[32]byte]struct{})
			}
			h := RequestKey(l.Identity, l.RequestID)
			if _, dup := withID[h]; dup {
				return SnapshotState{}, malformedf("lock %q repeats the request of another lock", l.Key)
			}
			withID[h] = struct{}{}
		}
		locks = append(locks, l)
	}
	s.Locks = locks
	if version >= SnapshotVersion2 {
		cs, err := d.control(ControlStateVersion1 + version - SnapshotVersion2)
		if err != nil {
			return SnapshotState{}, err
		}
		s.Control = cs
	}
	if version >= SnapshotVersion4 {
		s.Requests = d.requests()
		if d.err != nil {
			return SnapshotState{}, d.err
		}
		if err := validateRequests(&s.Requests, s.LastToken, len(withID), seen, s.Control.ClusterVersion); err != nil {
			return SnapshotState{}, err
		}
	}
	if err := d.finish(); err != nil {
		return SnapshotState{}, err
	}
	return s, nil
}

// LastKey is the key of the last lock AddRecord appended (it aliases the
// encoder's buffer until the next call).
func (e *SnapshotEncoder) LastKey() []byte { return e.lastKeyBytes }
