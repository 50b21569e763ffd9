package core

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Snapshot encoding: the lock table with its token counter, (version 2)
// the control state of encoding_control.go, (version 4) the request
// section of encoding_requests.go and (version 5) the session section of
// encoding_sessions.go.

// SnapshotState is the whole content of a snapshot: the lock table with
// its token counter, the control state, the request records and the
// sessions and lock-delays.
type SnapshotState struct {
	LastToken uint64
	Locks     []Lock // sorted by key
	Control   ControlState
	Requests  RequestState // empty before snapshot version 4
	Sessions  SessionState // empty before snapshot version 5
	Holders   []KeyHolders // multi-holder keys, by key; empty before snapshot version 6
}

// snapshotVersion is the snapshot format of a state with control state
// cs: the one of its cluster version.
func snapshotVersion(cs ControlState) byte {
	if cs.ClusterVersion >= 5 {
		return SnapshotVersion6
	}
	if cs.ClusterVersion >= 4 {
		return SnapshotVersion5
	}
	return SnapshotVersion2 + controlVersion(cs) - ControlStateVersion1
}

// snapshotControlVersion is the control section format of snapshot
// version v (2 or later).
func snapshotControlVersion(v byte) byte {
	return min(ControlStateVersion1+v-SnapshotVersion2, ControlStateVersion3)
}

// EncodeSnapshot encodes a lock table with an empty control state in
// format SnapshotVersion; see EncodeSnapshotState. locks must be sorted by
// key (Machine.Locks does that).
func EncodeSnapshot(lastToken uint64, locks []Lock) []byte {
	return EncodeSnapshotState(SnapshotState{LastToken: lastToken, Locks: locks})
}

// EncodeSnapshotState encodes a snapshot in format SnapshotVersion2 while
// the cluster version is 1, SnapshotVersion3 at cluster version 2,
// SnapshotVersion4 at 3, SnapshotVersion5 at 4, SnapshotVersion6 from 5 on:
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | control
//	      | requests (version 4 to 6) | sessions (version 5 and 6)
//	      | kinds (version 6 only)
//	      | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	       | identity:str (version 3 to 5) | request_id:str (version 4 and 5)
//	       | session_id:uvarint | lock_delay_ms:uvarint (version 5 and 6)
//	control: see EncodeControlState (its version 1 form in snapshot
//	         version 2, 2 in 3, 3 in 4 and 5)
//	requests: see encoding_requests.go
//	sessions: see encoding_sessions.go
//	kinds: see encoding_kinds.go (s.Holders, sorted by key)
//
// Version 1, which DecodeSnapshot still reads, is version 2 without the
// control section. s.Locks must be sorted by key, s.Sessions by ID and
// key; the control lists are sorted here. Equal states give equal bytes. A
// lock with an identity exists only from cluster version 2 on, one with a
// request id and request records only from 3 on, sessions, lock-delays and
// locks with either only from 4 on (Apply refuses them before).
func EncodeSnapshotState(s SnapshotState) []byte {
	ss := &s.Sessions
	e := NewSnapshotEncoder(s.LastToken, len(s.Locks), s.Control,
		48*len(s.Locks)+80*len(s.Requests.Ended)+32*len(ss.Sessions)+32*len(ss.Delays))
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
	if e.version >= SnapshotVersion5 {
		e.beginSessions(ss.LastSessionID, ss.LastDelaySeq, len(ss.Sessions), len(ss.Delays))
		for i := range ss.Sessions {
			e.b = appendSession(e.b, &ss.Sessions[i])
		}
		e.sessionsAdded = e.sessionCount
		e.beginDelays()
		for i := range ss.Delays {
			e.b = appendDelay(e.b, &ss.Delays[i])
		}
		e.delaysAdded = e.delayCount
	}
	if e.version >= SnapshotVersion6 {
		for i := range s.Holders {
			e.kinds = appendKeyHolders(e.kinds, &s.Holders[i])
		}
		e.kindsCount = uint64(len(s.Holders))
	}
	return e.finish()
}

// SnapshotEncoder writes a snapshot one lock at a time, in exactly the
// bytes EncodeSnapshotState gives for the same state, so that a snapshot
// can be built from a stream of locks (raftstore reads them from a
// storage snapshot, off the raft loop) without first building the table.
// Locks come first (Add or AddRecord), then, from snapshot version 4 on,
// the request section (BeginRequests and AddEnded), then, from version 5
// on, the session section (BeginSessions, AddSession, AddDelay), then
// Finish.
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

	// The session section: begun once the request section is done.
	sessionsBegun               bool
	lastSessionID, lastDelaySeq uint64
	sessionCount, delayCount    uint64 // declared
	sessionsAdded, delaysAdded  uint64
	delaysBegun                 bool   // the delays' count is written
	prevSession                 uint64 // ID of the last session added
	prevDelayKey                string // key of the last delay added

	// The kinds section (version 6), written at Finish.
	kinds       []byte
	kindsCount  uint64
	prevKindKey string

	// A streaming encoder (NewSnapshotEncoderTo) writes b to w whenever it
	// holds snapshotChunk bytes; crc is the checksum of what went out.
	w       io.Writer
	crc     uint32
	written int64
}

// NewSnapshotEncoder starts a snapshot that will hold count locks; sizeHint
// is the expected size of the locks' encoding (0 if unknown).
func NewSnapshotEncoder(lastToken uint64, count int, control ControlState, sizeHint int) *SnapshotEncoder {
	e := &SnapshotEncoder{ctl: control, ctlVersion: controlVersion(control), count: uint64(count), lastToken: lastToken}
	e.version = snapshotVersion(control)
	e.b = make([]byte, 0, 32+max(0, sizeHint)+controlSizeHint(control))
	e.b = append(e.b, snapshotMagic[:]...)
	e.b = append(e.b, e.version)
	e.b = binary.AppendUvarint(e.b, lastToken)
	e.b = binary.AppendUvarint(e.b, e.count)
	return e
}

// snapshotChunk is how many bytes a streaming SnapshotEncoder holds before
// it writes them out.
const snapshotChunk = 1 << 20

// NewSnapshotEncoderTo is NewSnapshotEncoder writing to w as it goes, a
// chunk of about snapshotChunk bytes at a time, instead of holding the
// whole snapshot; FinishTo writes the rest and the checksum. What reaches w
// is exactly what Finish would return. A snapshot of a million locks is
// about 36 MB: held whole, its fresh pages' faults are a third of the
// encoding's CPU, and the node's memory carries it while the file is
// written.
func NewSnapshotEncoderTo(w io.Writer, lastToken uint64, count int, control ControlState) *SnapshotEncoder {
	e := NewSnapshotEncoder(lastToken, count, control, snapshotChunk+snapshotChunk/8)
	e.w = w
	return e
}

// Info is the header CheckSnapshot will read from the snapshot.
func (e *SnapshotEncoder) Info() SnapshotInfo {
	return SnapshotInfo{Version: e.version, LastToken: e.lastToken, Locks: e.count}
}

// maybeFlush writes the buffer out once it holds a chunk (streaming only).
func (e *SnapshotEncoder) maybeFlush() {
	if e.w != nil && len(e.b) >= snapshotChunk {
		e.flush()
	}
}

func (e *SnapshotEncoder) flush() {
	if e.err != nil || len(e.b) == 0 {
		return
	}
	e.crc = crc32.Update(e.crc, castagnoli, e.b)
	e.emit()
}

// emit writes the buffer to w and empties it; a failed write is the
// encoder's error.
func (e *SnapshotEncoder) emit() {
	n, err := e.w.Write(e.b)
	e.written += int64(n)
	if err != nil {
		e.err = fmt.Errorf("write snapshot: %w", err)
		return
	}
	e.b = e.b[:0]
}

func (e *SnapshotEncoder) appendLock(b []byte, l Lock) []byte {
	b = appendLock(b, l)
	if e.version >= SnapshotVersion3 {
		b = appendString(b, l.Identity)
	}
	if e.version >= SnapshotVersion4 {
		b = appendString(b, l.RequestID)
	}
	if e.version >= SnapshotVersion5 {
		b = binary.AppendUvarint(b, l.SessionID)
		b = binary.AppendUvarint(b, l.LockDelayMS)
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
	case (l.SessionID != 0 || l.LockDelayMS != 0) && e.version < SnapshotVersion5:
		e.err = invalidf("lock %q has a session or a lock-delay before cluster version 4", l.Key)
	}
	if e.err != nil {
		return e.err
	}
	e.b = e.appendLock(e.b, l)
	e.lastKey = l.Key
	e.added++
	e.maybeFlush()
	return e.err
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
	if d.err == nil && (v < LockRecVersion1 || v > LockRecVersion4) {
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
	var sessionID, lockDelay uint64
	if v >= LockRecVersion4 {
		sessionID = d.uvarint()
		lockDelay = d.uvarint()
	}
	switch {
	case d.err != nil:
	case v == LockRecVersion2 && len(identity) == 0:
		d.err = malformedf("lock record version 2 with an empty identity")
	case v == LockRecVersion3 && len(requestID) == 0:
		d.err = malformedf("lock record version 3 with an empty request id")
	case v == LockRecVersion4 && sessionID == 0 && lockDelay == 0:
		d.err = malformedf("lock record version 4 without a session or a lock-delay")
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
	case validateHold(lease, sessionID, lockDelay) != nil:
		e.err = validateHold(lease, sessionID, lockDelay)
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
	case v == LockRecVersion4 && e.version < SnapshotVersion5:
		e.err = invalidf("lock %q has a session or a lock-delay before cluster version 4", key)
	}
	if e.err != nil {
		return e.err
	}
	// The record after its version byte is the snapshot's lock encoding
	// with the fields of its own version; the snapshot's version adds
	// those the record lacks, empty (identity from 3, request id from 4,
	// session and lock-delay from 5).
	e.b = append(e.b, record[1:]...)
	if e.version >= SnapshotVersion3 && v < LockRecVersion2 {
		e.b = append(e.b, 0) // identity
	}
	if e.version >= SnapshotVersion4 && v < LockRecVersion3 {
		e.b = append(e.b, 0) // request id
	}
	if e.version >= SnapshotVersion5 && v < LockRecVersion4 {
		e.b = append(e.b, 0, 0) // session id, lock-delay
	}
	e.lastKeyBytes = append(e.lastKeyBytes[:0], key...)
	e.added++
	e.maybeFlush()
	return e.err
}

// BeginRequests ends the locks and starts the request section: the data
// clock, the sequence number of the first ended record and how many will
// follow (AddEnded). Before snapshot version 4 (cluster version 3) the
// section must be empty. Without it, Finish writes an empty one.
func (e *SnapshotEncoder) BeginRequests(dataClockMS, endedHead uint64, endedCount int) error {
	switch {
	case e.err != nil:
		return e.err
	case e.begun || e.sessionsBegun:
		e.err = invalidf("the request section began twice, or after the session section")
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
// not above the last token (0 is a tombstone, from cluster version 6), ended in order and not after the
// data clock, no more than declared.
func (e *SnapshotEncoder) AddEnded(r EndedRequest) error {
	switch {
	case e.err != nil:
		return e.err
	case !e.begun || e.sessionsBegun:
		e.err = invalidf("ended request before BeginRequests or after BeginSessions")
	case e.endedAdded >= e.endedCount:
		e.err = invalidf("snapshot declared %d ended requests, got more", e.endedCount)
	case r.Token > e.lastToken || r.Token == 0 && e.ctl.ClusterVersion < 6:
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
	e.maybeFlush()
	return e.err
}

// Finish appends the control section (and empty request and session
// sections) if BeginRequests and BeginSessions did not, and the checksum,
// and returns the snapshot, or the first error (also when fewer locks,
// ended records, sessions or delays were added than declared).
func (e *SnapshotEncoder) Finish() ([]byte, error) {
	if e.w != nil {
		return nil, fmt.Errorf("core: Finish on a streaming snapshot encoder (FinishTo)")
	}
	if err := e.complete(); err != nil {
		return nil, err
	}
	return e.finish(), nil
}

// FinishTo is Finish for a streaming encoder (NewSnapshotEncoderTo): it
// writes the rest of the snapshot and its checksum, and returns how many
// bytes it wrote in all.
func (e *SnapshotEncoder) FinishTo() (int64, error) {
	if e.w == nil {
		return 0, fmt.Errorf("core: FinishTo on a snapshot encoder without a writer (Finish)")
	}
	if err := e.complete(); err != nil {
		return e.written, err
	}
	e.sections()
	e.crc = crc32.Update(e.crc, castagnoli, e.b)
	e.b = binary.BigEndian.AppendUint32(e.b, e.crc)
	e.emit()
	e.b = nil
	return e.written, e.err
}

// complete returns the first error, or the one of a section that got fewer
// records than it declared.
func (e *SnapshotEncoder) complete() error {
	switch {
	case e.err != nil:
	case e.added != e.count:
		e.err = invalidf("snapshot declared %d locks, got %d", e.count, e.added)
	case e.endedAdded != e.endedCount:
		e.err = invalidf("snapshot declared %d ended requests, got %d", e.endedCount, e.endedAdded)
	case e.sessionsAdded != e.sessionCount || e.delaysAdded != e.delayCount:
		e.err = invalidf("snapshot declared %d sessions and %d delays, got %d and %d", e.sessionCount, e.delayCount, e.sessionsAdded, e.delaysAdded)
	}
	return e.err
}

func (e *SnapshotEncoder) finish() []byte {
	e.sections()
	b := e.b
	e.b = nil
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// sections appends what the caller did not: the control section and empty
// request and session sections, and the kinds section.
func (e *SnapshotEncoder) sections() {
	if !e.begun {
		e.begin(0, 0, 0)
	}
	if e.version >= SnapshotVersion5 {
		if !e.sessionsBegun {
			e.beginSessions(0, 0, 0, 0)
		}
		e.beginDelays()
	}
	if e.version >= SnapshotVersion6 {
		e.b = e.appendKinds(e.b)
	}
}

// SnapshotInfo is what CheckSnapshot reads from a snapshot without
// decoding its locks.
type SnapshotInfo struct {
	Version   byte
	LastToken uint64
	Locks     uint64 // the lock section's: mutex and exclusive locks, not holders of multi-holder keys
}

// BeginSessions ends the request section (beginning an empty one if
// BeginRequests was not called) and starts the session section (snapshot
// version 5, cluster version 4): the two counters and how many sessions
// and delayed keys will follow (AddSession, then AddDelay). Before
// snapshot version 5 it must be empty.
func (e *SnapshotEncoder) BeginSessions(lastSessionID, lastDelaySeq uint64, sessions, delays int) error {
	switch {
	case e.err != nil:
		return e.err
	case e.sessionsBegun:
		e.err = invalidf("the session section began twice")
	case !e.begun && e.added != e.count:
		e.err = invalidf("snapshot declared %d locks, got %d", e.count, e.added)
	case e.endedAdded != e.endedCount:
		e.err = invalidf("snapshot declared %d ended requests, got %d", e.endedCount, e.endedAdded)
	case e.version < SnapshotVersion5 && (lastSessionID != 0 || lastDelaySeq != 0 || sessions != 0 || delays != 0):
		e.err = invalidf("sessions or lock-delays before cluster version 4")
	case sessions < 0 || sessions > MaxSessions || delays < 0 || delays > MaxDelayedKeys:
		e.err = invalidf("%d sessions and %d delayed keys, the limits are %d and %d", sessions, delays, MaxSessions, MaxDelayedKeys)
	}
	if e.err != nil {
		return e.err
	}
	if !e.begun {
		e.begin(0, 0, 0)
	}
	if e.version >= SnapshotVersion5 {
		e.beginSessions(lastSessionID, lastDelaySeq, sessions, delays)
	} else {
		e.sessionsBegun = true
	}
	return nil
}

func (e *SnapshotEncoder) beginSessions(lastSessionID, lastDelaySeq uint64, sessions, delays int) {
	e.sessionsBegun = true
	e.lastSessionID, e.lastDelaySeq = lastSessionID, lastDelaySeq
	e.sessionCount, e.delayCount = uint64(sessions), uint64(delays)
	e.b = appendSessionsHeader(e.b, lastSessionID, lastDelaySeq)
	e.b = binary.AppendUvarint(e.b, e.sessionCount)
}

// beginDelays writes the delayed keys' count, once, after the sessions.
func (e *SnapshotEncoder) beginDelays() {
	if !e.delaysBegun {
		e.delaysBegun = true
		e.b = binary.AppendUvarint(e.b, e.delayCount)
	}
}

// AddSession appends the next session: valid, IDs strictly ascending and
// not above the last session ID, no more than declared.
func (e *SnapshotEncoder) AddSession(x Session) error {
	switch err := validateSession(&x); {
	case e.err != nil:
		return e.err
	case err != nil:
		e.err = err
	case !e.sessionsBegun || e.version < SnapshotVersion5:
		e.err = invalidf("session before BeginSessions, or before cluster version 4")
	case e.delaysBegun:
		e.err = invalidf("session %d after a delayed key", x.ID)
	case e.sessionsAdded >= e.sessionCount:
		e.err = invalidf("snapshot declared %d sessions, got more", e.sessionCount)
	case x.ID > e.lastSessionID || e.sessionsAdded > 0 && x.ID <= e.prevSession:
		e.err = invalidf("session %d after %d, last session id %d", x.ID, e.prevSession, e.lastSessionID)
	}
	if e.err != nil {
		return e.err
	}
	e.b = appendSession(e.b, &x)
	e.prevSession = x.ID
	e.sessionsAdded++
	e.maybeFlush()
	return e.err
}

// AddDelay appends the next delayed key, once every session is added:
// valid, keys strictly ascending, sequence number not above the last, no
// more than declared.
func (e *SnapshotEncoder) AddDelay(d Delay) error {
	switch err := validateDelay(&d); {
	case e.err != nil:
		return e.err
	case err != nil:
		e.err = err
	case !e.sessionsBegun || e.version < SnapshotVersion5:
		e.err = invalidf("delayed key before BeginSessions, or before cluster version 4")
	case e.sessionsAdded != e.sessionCount:
		e.err = invalidf("snapshot declared %d sessions, got %d before the first delayed key", e.sessionCount, e.sessionsAdded)
	case e.delaysAdded >= e.delayCount:
		e.err = invalidf("snapshot declared %d delayed keys, got more", e.delayCount)
	case d.Seq > e.lastDelaySeq || e.delaysAdded > 0 && d.Key <= e.prevDelayKey:
		e.err = invalidf("delayed key %q after %q, sequence number %d, last %d", d.Key, e.prevDelayKey, d.Seq, e.lastDelaySeq)
	}
	if e.err != nil {
		return e.err
	}
	e.beginDelays()
	e.b = appendDelay(e.b, &d)
	e.prevDelayKey = d.Key
	e.delaysAdded++
	e.maybeFlush()
	return e.err
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
	if version < SnapshotVersion1 || version > SnapshotVersion6 {
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

// DecodeSnapshot decodes and validates a snapshot of version 1 to 6 and
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
// (1 to 5, the one of its cluster version), keys strictly ascending,
// tokens non-zero, unique and not above last_token, (from version 2) a
// valid control state, (from version 4) request ids unique per identity
// and a request section that agrees with the locks (validateRequests),
// and (version 5) a session section that agrees with them
// (validateSessions). A version 1 snapshot has an empty control state;
// only versions 3 to 5 carry lock identities and a cluster version, only
// 4 and 5 request ids, request records and fence keys, only 5 sessions,
// lock-delays and the locks' sessions and lock-delays.
func DecodeSnapshotState(b []byte) (SnapshotState, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version < SnapshotVersion1 || version > SnapshotVersion6 {
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
	perSession := make(map[uint64]int)
	lockFields := 0
	for i := uint64(0); i < n; i++ {
		l := d.lock()
		if version >= SnapshotVersion3 {
			l.Identity = d.str(MaxIdentityLen)
		}
		if version >= SnapshotVersion4 {
			l.RequestID = d.str(MaxRequestIDLen)
		}
		if version >= SnapshotVersion5 {
			l.SessionID = d.uvarint()
			l.LockDelayMS = d.uvarint()
			if l.SessionID != 0 {
				perSession[l.SessionID]++
			}
			if l.SessionID != 0 || l.LockDelayMS != 0 {
				lockFields++
			}
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
		cs, err := d.control(snapshotControlVersion(version))
		if err != nil {
			return SnapshotState{}, err
		}
		if snapshotVersion(cs) != version {
			return SnapshotState{}, malformedf("snapshot version %d at cluster version %d", version, cs.ClusterVersion)
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
	if version >= SnapshotVersion5 {
		s.Sessions = d.sessions()
		if d.err != nil {
			return SnapshotState{}, d.err
		}
		if version >= SnapshotVersion6 {
			// Read before the sessions are checked, as walkSnapshot reads
			// it: the same input gives the same error.
			if s.Holders = d.kindsSection(); d.err != nil {
				return SnapshotState{}, d.err
			}
		}
		held := func(key string) bool {
			_, ok := slices.BinarySearchFunc(locks, key, func(l Lock, k string) int { return strings.Compare(l.Key, k) })
			return ok
		}
		if err := validateSessions(&s.Sessions, perSession, lockFields, held, s.Control.ClusterVersion); err != nil {
			return SnapshotState{}, err
		}
		if version >= SnapshotVersion6 {
			held := func(tok uint64) bool { _, ok := seen[tok]; return ok }
			if err := checkKinds(&s, perSession, held, withID); err != nil {
				return SnapshotState{}, err
			}
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
