package core

import (
	"encoding/binary"
	"strconv"
)

// Session encodings (cluster version 4): one session and one delayed key
// as storage keeps them in rows of their own, and the session section of
// a snapshot (version 5).
//
//	session record:  version:1 | session
//	delay record:    version:1 | delay
//	session section: last_session_id:uvarint | last_delay_seq:uvarint
//	                 | count:uvarint | session* | count:uvarint | delay*
//	session = id:uvarint | identity:str | ttl_ms:uvarint | lock_delay_ms:uvarint | epoch:uvarint
//	delay   = key:str | delay_ms:uvarint | seq:uvarint
//
// Sessions come in ascending ID order, delayed keys in ascending key
// order.

// Record versions.
const (
	SessionRecVersion1 byte = 1
	DelayRecVersion1   byte = 1
)

// Smallest encodings, which bound an honest count by the input length.
const (
	minSessionSize = 1 + 1 + 2 + 1 + 1 // ttl_ms at least MinSessionTTLMS, 2 bytes
	minDelaySize   = 2 + 1 + 1
)

func appendSession(b []byte, x *Session) []byte {
	b = binary.AppendUvarint(b, x.ID)
	b = appendString(b, x.Identity)
	b = binary.AppendUvarint(b, x.TTLMS)
	b = binary.AppendUvarint(b, x.LockDelayMS)
	return binary.AppendUvarint(b, x.Epoch)
}

func appendDelay(b []byte, d *Delay) []byte {
	b = appendString(b, d.Key)
	b = binary.AppendUvarint(b, d.DelayMS)
	return binary.AppendUvarint(b, d.Seq)
}

func (d *decoder) session() Session {
	var x Session
	x.ID = d.uvarint()
	x.Identity = d.str(MaxIdentityLen)
	x.TTLMS = d.uvarint()
	x.LockDelayMS = d.uvarint()
	x.Epoch = d.uvarint()
	return x
}

func (d *decoder) delay() Delay {
	var x Delay
	x.Key = d.str(MaxKeyLen)
	x.DelayMS = d.uvarint()
	x.Seq = d.uvarint()
	return x
}

// EncodeSessionRecord encodes one session as stored in its storage row.
func EncodeSessionRecord(x Session) []byte {
	b := make([]byte, 0, 1+MaxSessionSnapshotSize)
	return appendSession(append(b, SessionRecVersion1), &x)
}

// DecodeSessionRecord decodes and validates one stored session row; how
// it relates to the rest of the state is for Machine.LoadSessions to
// check.
func DecodeSessionRecord(b []byte) (Session, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != SessionRecVersion1 {
		return Session{}, &Error{Code: CodeUnknownVersion, Detail: "session record version " + strconv.Itoa(int(v))}
	}
	x := d.session()
	if err := d.finish(); err != nil {
		return Session{}, err
	}
	if err := validateSession(&x); err != nil {
		return Session{}, err
	}
	return x, nil
}

// EncodeDelayRecord encodes one delayed key as stored in its storage row.
func EncodeDelayRecord(x Delay) []byte {
	b := make([]byte, 0, 1+16+len(x.Key))
	return appendDelay(append(b, DelayRecVersion1), &x)
}

// DecodeDelayRecord decodes and validates one stored delay row.
func DecodeDelayRecord(b []byte) (Delay, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != DelayRecVersion1 {
		return Delay{}, &Error{Code: CodeUnknownVersion, Detail: "delay record version " + strconv.Itoa(int(v))}
	}
	x := d.delay()
	if err := d.finish(); err != nil {
		return Delay{}, err
	}
	if err := validateDelay(&x); err != nil {
		return Delay{}, err
	}
	return x, nil
}

func appendSessionsHeader(b []byte, lastSessionID, lastDelaySeq uint64) []byte {
	b = binary.AppendUvarint(b, lastSessionID)
	return binary.AppendUvarint(b, lastDelaySeq)
}

// sessions reads a session section. The caller validates it against the
// rest of the snapshot (validateSessions).
func (d *decoder) sessions() SessionState {
	var ss SessionState
	ss.LastSessionID = d.uvarint()
	ss.LastDelaySeq = d.uvarint()
	n := d.count(MaxSessions, minSessionSize, "sessions")
	if n > 0 {
		ss.Sessions = make([]Session, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		ss.Sessions = append(ss.Sessions, d.session())
	}
	n = d.count(MaxDelayedKeys, minDelaySize, "delayed keys")
	if n > 0 {
		ss.Delays = make([]Delay, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		ss.Delays = append(ss.Delays, d.delay())
	}
	if d.err != nil {
		return SessionState{}
	}
	return ss
}
