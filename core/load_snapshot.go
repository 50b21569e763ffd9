package core

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"slices"
)

// A snapshot's locks without a Lock per lock (load.go): Machine.Restore
// builds the table straight from the bytes, SnapshotRecords hands
// raftstore each lock as the record it stores. At a million locks,
// DecodeSnapshotState then RestoreState (a []Lock, three strings and a
// map entry per lock, then the table) took 1.2 s of a new follower's
// catch-up on the raft loop (docs/benchmarks.md).
//
// walkSnapshot is a second decoder of the formats DecodeSnapshotState
// reads; it makes the same checks in the same order but for two: token
// uniqueness is checked by a sort at the end, not as each lock comes, and
// the held tokens that ended records must not repeat are looked up in the
// sorted tokens. So it accepts exactly what DecodeSnapshotState accepts,
// with the same error for every input but one that has both a repeated
// token and a later fault (FuzzDecodeSnapshot checks both). A version it
// does not know (a later one: walkedSnapshotVersion) is left to
// DecodeSnapshotState, so a new format is never refused here.

// walkedSnapshotVersion is the latest snapshot version walkSnapshot reads.
const walkedSnapshotVersion = SnapshotVersion6

// walkSnapshot decodes and validates snapshot b as DecodeSnapshotState
// does, calling begin with the declared lock count and then each with
// every lock (r and its slices are valid only during the call) instead of
// collecting them. The returned state has no Locks. walked is false, with
// nothing called, when b's version is one walkSnapshot does not read.
func walkSnapshot(b []byte, begin func(n int), each func(r *rawLock)) (s SnapshotState, walked bool, err error) {
	if len(b) >= len(snapshotMagic)+1 && (b[3] < SnapshotVersion1 || b[3] > walkedSnapshotVersion) {
		return SnapshotState{}, false, nil
	}
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, true, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, true, malformedf("snapshot magic missing")
	}
	version := b[3]
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return SnapshotState{}, true, malformedf("snapshot checksum mismatch")
	}
	d := decoder{b: body[4:]}
	s.LastToken = d.uvarint()
	n := d.uvarint()
	if d.err != nil {
		return SnapshotState{}, true, d.err
	}
	// Each lock takes at least 5 bytes, which bounds an honest count by the
	// input length; a larger count is a lie and must not drive allocation.
	if n > MaxSnapshotLocks || n > uint64(len(body))/5 {
		return SnapshotState{}, true, malformedf("snapshot declares %d locks in %d bytes", n, len(body))
	}
	begin(int(n))
	tokens := make([]uint64, 0, n)
	var withID map[[32]byte]struct{}
	lockBytes := d.b // for the second pass over the keys, with delayed keys
	var perSession map[uint64]int
	lockFields := 0
	var prevKey, term []byte
	var r rawLock // one for the whole walk: each gets a pointer to it
	for i := uint64(0); i < n; i++ {
		r = rawLock{}
		start := d.b
		fields := d.rawFields(&r)
		if version >= SnapshotVersion3 {
			r.identity = d.rawStr(MaxIdentityLen)
		}
		// lockTerm's bytes: the fields and the identity (an empty one for
		// versions 1 and 2), then the request id if there is one, then
		// (the request id always) the session and lock-delay if either is
		// set. They are the lock's own bytes but for those cases.
		withIdentity := len(start) - len(d.b)
		if version >= SnapshotVersion4 {
			r.requestID = d.rawStr(MaxRequestIDLen)
		}
		withRequest := len(start) - len(d.b)
		if version >= SnapshotVersion5 {
			r.sessionID = d.uvarint()
			r.lockDelayMS = d.uvarint()
			if r.sessionID != 0 {
				if perSession == nil {
					perSession = make(map[uint64]int)
				}
				perSession[r.sessionID]++
			}
			if r.sessionID != 0 || r.lockDelayMS != 0 {
				lockFields++
			}
		}
		if d.err != nil {
			return SnapshotState{}, true, d.err
		}
		switch {
		case version < SnapshotVersion3:
			term = append(append(term[:0], fields...), 0)
			r.term = term
		case r.sessionID != 0 || r.lockDelayMS != 0:
			r.term = start[:len(start)-len(d.b)]
		case len(r.requestID) > 0:
			r.term = start[:withRequest]
		default:
			r.term = start[:withIdentity]
		}
		if err := r.check(); err != nil {
			return SnapshotState{}, true, err
		}
		if i > 0 && bytes.Compare(r.key, prevKey) <= 0 {
			return SnapshotState{}, true, malformedf("snapshot keys not strictly ascending at lock %d", i)
		}
		if r.token > s.LastToken {
			return SnapshotState{}, true, malformedf("lock %q has token %d above last token %d", r.key, r.token, s.LastToken)
		}
		if len(r.requestID) > 0 {
			if withID == nil {
				withID = make(map[[32]byte]struct{})
			}
			h := RequestKey(string(r.identity), string(r.requestID))
			if _, dup := withID[h]; dup {
				return SnapshotState{}, true, malformedf("lock %q repeats the request of another lock", r.key)
			}
			withID[h] = struct{}{}
		}
		prevKey = r.key
		tokens = append(tokens, r.token)
		each(&r)
	}
	if tok, dup := duplicateToken(tokens); dup {
		return SnapshotState{}, true, malformedf("token %d appears twice", tok)
	}
	if version >= SnapshotVersion2 {
		cs, err := d.control(snapshotControlVersion(version))
		if err != nil {
			return SnapshotState{}, true, err
		}
		if snapshotVersion(cs) != version {
			return SnapshotState{}, true, malformedf("snapshot version %d at cluster version %d", version, cs.ClusterVersion)
		}
		s.Control = cs
	}
	if version >= SnapshotVersion4 {
		s.Requests = d.requests()
		if d.err != nil {
			return SnapshotState{}, true, d.err
		}
		// The held tokens an ended record names (validateRequests looks
		// up nothing else), from the sorted tokens.
		held := make(map[uint64]struct{})
		for _, e := range s.Requests.Ended {
			if _, found := slices.BinarySearch(tokens, e.Token); found {
				held[e.Token] = struct{}{}
			}
		}
		if err := validateRequests(&s.Requests, s.LastToken, len(withID), held, s.Control.ClusterVersion); err != nil {
			return SnapshotState{}, true, err
		}
	}
	if version >= SnapshotVersion5 {
		s.Sessions = d.sessions()
		if d.err != nil {
			return SnapshotState{}, true, d.err
		}
		var kinds []KeyHolders
		if version >= SnapshotVersion6 {
			if kinds = d.kindsSection(); d.err != nil {
				return SnapshotState{}, true, d.err
			}
		}
		held := heldDelayed(lockBytes, n, s.Sessions.Delays, kinds)
		isHeld := func(key string) bool { _, ok := held[key]; return ok }
		if err := validateSessions(&s.Sessions, perSession, lockFields, isHeld, s.Control.ClusterVersion); err != nil {
			return SnapshotState{}, true, err
		}
		if version >= SnapshotVersion6 {
			v := kindsCheck{clusterVersion: s.Control.ClusterVersion, lastToken: s.LastToken, sessions: &s.Sessions,
				ended: s.Requests.Ended, requests: len(withID) + len(s.Requests.Ended), perSession: perSession, plainKey: isHeld,
				plainRequest: func(h [32]byte) bool { _, ok := withID[h]; return ok }}
			if _, err := v.validate(kinds); err != nil {
				return SnapshotState{}, true, err
			}
			for _, kh := range kinds { // in order: the error is DecodeSnapshotState's
				for _, l := range kh.Holders {
					if _, dup := slices.BinarySearch(tokens, l.Token); dup {
						return SnapshotState{}, true, malformedf("token %d appears twice", l.Token)
					}
				}
			}
			s.Holders = kinds
		}
	}
	if err := d.finish(); err != nil {
		return SnapshotState{}, true, err
	}
	return s, true, nil
}

// heldDelayed returns which of the delayed keys and multi-holder keys
// are held by one of the n locks of a version 5 or 6 snapshot's lock
// section b (already checked): a second pass over the locks, only when
// there are such keys, instead of keeping every key of the first.
func heldDelayed(b []byte, n uint64, delays []Delay, kinds []KeyHolders) map[string]struct{} {
	if len(delays) == 0 && len(kinds) == 0 {
		return nil
	}
	delayed := make(map[string]struct{}, len(delays)+len(kinds))
	for i := range delays {
		delayed[delays[i].Key] = struct{}{}
	}
	for i := range kinds {
		delayed[kinds[i].Key] = struct{}{}
	}
	held := make(map[string]struct{})
	d := decoder{b: b}
	var r rawLock
	for i := uint64(0); i < n && d.err == nil; i++ {
		d.rawFields(&r)
		d.rawStr(MaxIdentityLen)
		d.rawStr(MaxRequestIDLen)
		d.uvarint()
		d.uvarint()
		if _, ok := delayed[string(r.key)]; ok {
			held[string(r.key)] = struct{}{}
		}
	}
	return held
}

// restoreSnapshot is Restore: the snapshot decoded straight into a new
// table, swapped in only when all of it is valid; what RestoreState of
// DecodeSnapshotState's result does, without the []Lock. A version
// walkSnapshot does not read goes that way.
func (m *Machine) restoreSnapshot(b []byte) error {
	var tb tableBuilder
	s, walked, err := walkSnapshot(b, func(n int) { tb = newTableBuilder(n) }, func(r *rawLock) {
		tb.add(r, true) // keys strictly ascending: never held twice
	})
	if !walked {
		s, err := DecodeSnapshotState(b)
		if err != nil {
			return err
		}
		m.RestoreState(s)
		return nil
	}
	if err != nil {
		return err
	}
	tb.t.flushPending()
	// As RestoreState: Load, then the control state, then the requests
	// (whose load keeps the held index).
	m.lastToken, m.locks, m.lockSum, m.req.held = s.LastToken, tb.t, tb.sum, tb.held
	m.ctl = newControl(s.Control)
	m.ctlSum = controlSum(m.ctl.state())
	m.req.load(s.Requests)
	m.sess.locksOf = tb.sess.locksOf
	m.sess.load(s.Sessions)
	m.loadKinds(s.Holders)
	return nil
}

// SnapshotRecords decodes and validates snapshot b as DecodeSnapshotState
// does, but hands each lock to each as its key and the record storage
// keeps for it (EncodeLockRecord's bytes; both valid only during the call)
// instead of collecting them: how raftstore writes a received snapshot's
// rows without a Lock per lock. The returned state has no Locks; count is
// how many there were. each is called only for a valid snapshot's locks
// when the format is one walkSnapshot reads, and for every lock after the
// whole snapshot is checked otherwise: either way the caller must discard
// what it did with them on an error.
func SnapshotRecords(b []byte, each func(key, record []byte) error) (s SnapshotState, count int, err error) {
	var rec []byte
	var eachErr error
	s, walked, err := walkSnapshot(b, func(int) {}, func(r *rawLock) {
		if eachErr != nil {
			return
		}
		count++
		rec = appendRawRecord(rec[:0], r)
		eachErr = each(r.key, rec)
	})
	if !walked {
		if s, err = DecodeSnapshotState(b); err != nil {
			return SnapshotState{}, 0, err
		}
		for _, l := range s.Locks {
			if err := each([]byte(l.Key), EncodeLockRecord(l)); err != nil {
				return SnapshotState{}, 0, err
			}
		}
		count, s.Locks = len(s.Locks), nil
		return s, count, nil
	}
	if err == nil {
		err = eachErr
	}
	if err != nil {
		return SnapshotState{}, 0, err
	}
	return s, count, nil
}

// appendRawRecord appends EncodeLockRecord of r to dst.
func appendRawRecord(dst []byte, r *rawLock) []byte {
	withSession := r.sessionID != 0 || r.lockDelayMS != 0
	switch {
	case withSession:
		dst = append(dst, LockRecVersion4)
	case len(r.requestID) > 0:
		dst = append(dst, LockRecVersion3)
	case len(r.identity) > 0:
		dst = append(dst, LockRecVersion2)
	default:
		dst = append(dst, LockRecVersion1)
	}
	dst = appendRawString(dst, r.key)
	dst = binary.AppendUvarint(dst, r.token)
	dst = appendRawString(dst, r.owner)
	dst = binary.AppendUvarint(dst, r.leaseMS)
	dst = binary.AppendUvarint(dst, r.grantedAtMS)
	if len(r.identity) > 0 || len(r.requestID) > 0 || withSession {
		dst = appendRawString(dst, r.identity)
	}
	if len(r.requestID) > 0 || withSession {
		dst = appendRawString(dst, r.requestID)
	}
	if withSession {
		dst = binary.AppendUvarint(dst, r.sessionID)
		dst = binary.AppendUvarint(dst, r.lockDelayMS)
	}
	return dst
}

func appendRawString(dst, s []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}
