package core

import (
	"bytes"
	"crypto/sha256"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Loading a whole table: from stored lock records (Loader, raftstore's
// restart) and from a snapshot (Machine.Restore, SnapshotRecords: a
// follower's catch-up).
//
// At a million locks the old path (decode every record into a Lock with
// fresh strings, append it to a slice, check token uniqueness in a
// map[uint64]string, then insert each into a map) cost 2.7-3.1 s of CPU
// (docs/benchmarks.md). Here each lock goes from its encoded bytes
// straight into the table (table.go): its fields are checked in place,
// its strings copied once into the arena, its digest term hashed from the
// bytes it already is, and token uniqueness checked by sorting one
// []uint64 at the end. The checks are exactly DecodeLockRecord's and
// DecodeSnapshotState's (fuzz_test.go holds them to it); on a rejection
// the slow path builds the Lock so that the error is validateLock's word
// for word.

// rawLock is one encoded lock, checked, its byte slices aliasing the input.
type rawLock struct {
	key, owner, identity, requestID []byte
	token, leaseMS                  uint64
	grantedAtMS                     uint64
	sessionID, lockDelayMS          uint64
	// term is the digest term's bytes (lockTerm: appendLock's fields, the
	// identity as a string, empty or not, then the request id if any).
	term []byte
}

// check applies validateLock's rules to r, returning validateLock's error.
func (r *rawLock) check() error {
	if validKeyBytes(r.key) && len(r.owner) <= MaxOwnerLen && utf8.Valid(r.owner) && validIdentityBytes(r.identity) &&
		validRequestIDBytes(r.requestID) && validateHold(r.leaseMS, r.sessionID, r.lockDelayMS) == nil && r.token != 0 {
		return nil
	}
	return validateLock(r.lock())
}

// lock copies r into a Lock.
func (r *rawLock) lock() Lock {
	return Lock{Key: string(r.key), Token: r.token, Owner: string(r.owner), Identity: string(r.identity),
		RequestID: string(r.requestID), LeaseMS: r.leaseMS, GrantedAtMS: r.grantedAtMS,
		SessionID: r.sessionID, LockDelayMS: r.lockDelayMS}
}

// rawFields reads appendLock's fields from d into r (not the identity)
// and returns their bytes.
func (d *decoder) rawFields(r *rawLock) []byte {
	start := d.b
	r.key = d.rawStr(MaxKeyLen)
	r.token = d.uvarint()
	r.owner = d.rawStr(MaxOwnerLen)
	r.leaseMS = d.uvarint()
	r.grantedAtMS = d.uvarint()
	if d.err != nil {
		return nil
	}
	return start[:len(start)-len(d.b)]
}

// tableBuilder fills a new lock table, keeping its digest sum and the
// index of held requests (request -> key, as Machine.put keeps it).
type tableBuilder struct {
	t    *lockTable
	sum  sum256
	held map[[32]byte]string
	sess sessions // only its index of session locks (locksOf)
}

func newTableBuilder(n int) tableBuilder {
	return tableBuilder{t: newLockTable(min(max(0, n), MaxSnapshotLocks))}
}

// add inserts r (checked); it reports false if its key is already held.
// fresh vouches that it is not (putRaw).
func (b *tableBuilder) add(r *rawLock, fresh bool) bool {
	if !b.t.putRaw(r, fresh) {
		return false
	}
	b.sum.add(termOf(sha256.Sum256(r.term)))
	if len(r.requestID) > 0 {
		if b.held == nil {
			b.held = make(map[[32]byte]string)
		}
		// A copy, not the arena's bytes: the index outlives compactions
		// of the arena (table.go).
		b.held[RequestKey(string(r.identity), string(r.requestID))] = strings.Clone(string(r.key))
	}
	if r.sessionID != 0 {
		b.sess.lockAdded(&Lock{Key: string(r.key), SessionID: r.sessionID})
	}
	return true
}

// Loader builds a machine from stored lock records (EncodeLockRecord
// bytes, as raftstore keeps them, one row per lock), one at a time.
type Loader struct {
	b         tableBuilder
	tokens    []uint64
	lastToken uint64
	err       error
	scratch   []byte
	// last is the previous key; sorted holds while every key came in
	// strictly ascending order (then none can repeat).
	last    []byte
	started bool
	sorted  bool
}

// NewLoader starts a machine whose token counter is lastToken, with room
// for about sizeHint locks (it grows past them).
func NewLoader(lastToken uint64, sizeHint int) *Loader {
	n := min(max(0, sizeHint), MaxSnapshotLocks)
	return &Loader{b: newTableBuilder(n), tokens: make([]uint64, 0, n), lastToken: lastToken, sorted: true}
}

// AddRecord adds the lock stored under key. It checks what DecodeLockRecord
// checks, and that the record holds key, its token is not above the last
// token and key was not added before. The first error is kept: Machine
// returns it too.
func (ld *Loader) AddRecord(key, record []byte) error {
	if ld.err != nil {
		return ld.err
	}
	d := decoder{b: record}
	v := d.byte()
	if d.err == nil && (v < LockRecVersion1 || v > LockRecVersion4) {
		ld.err = &Error{Code: CodeUnknownVersion, Detail: "lock record version " + strconv.Itoa(int(v))}
		return ld.err
	}
	var r rawLock
	fields := d.rawFields(&r)
	if v >= LockRecVersion2 {
		r.identity = d.rawStr(MaxIdentityLen)
	}
	if v >= LockRecVersion3 {
		r.requestID = d.rawStr(MaxRequestIDLen)
	}
	if v >= LockRecVersion4 {
		r.sessionID = d.uvarint()
		r.lockDelayMS = d.uvarint()
	}
	// Canonical: each lock has one record, the oldest version that carries
	// it (DecodeLockRecord).
	switch {
	case d.err != nil:
	case v == LockRecVersion2 && len(r.identity) == 0:
		d.err = malformedf("lock record version 2 with an empty identity")
	case v == LockRecVersion3 && len(r.requestID) == 0:
		d.err = malformedf("lock record version 3 with an empty request id")
	case v == LockRecVersion4 && r.sessionID == 0 && r.lockDelayMS == 0:
		d.err = malformedf("lock record version 4 without a session or a lock-delay")
	}
	if err := d.finish(); err != nil {
		ld.err = err
		return err
	}
	if v >= LockRecVersion2 {
		// The fields, the identity, the request id if any (always in
		// version 4), the session and lock-delay in version 4: lockTerm.
		r.term = record[1:]
	} else {
		ld.scratch = append(append(ld.scratch[:0], fields...), 0) // an empty identity
		r.term = ld.scratch
	}
	switch err := r.check(); {
	case err != nil:
		ld.err = err
	case !bytes.Equal(r.key, key):
		ld.err = malformedf("lock record under %q holds key %q", key, r.key)
	case r.token > ld.lastToken:
		ld.err = malformedf("lock %q has token %d above last token %d", r.key, r.token, ld.lastToken)
	case !ld.b.add(&r, ld.ascending(r.key)):
		ld.err = malformedf("key %q stored twice", r.key)
	default:
		ld.tokens = append(ld.tokens, r.token)
	}
	return ld.err
}

// ascending reports whether key sorts after every key added before (as
// rows read in order do), which makes it certainly new.
func (ld *Loader) ascending(key []byte) bool {
	up := ld.last == nil || bytes.Compare(key, ld.last) > 0
	ld.last = append(ld.last[:0], key...)
	if ld.started && !up {
		ld.sorted = false
	}
	ld.started = true
	return ld.sorted
}

// Machine returns the loaded machine, or the first error, also when a
// token is held twice. Its control state, request records and sessions
// are empty: LoadControl, LoadRequests and LoadSessions replace them, as
// after Load. A request
// held by two locks is left for LoadRequests to refuse, as after Load.
func (ld *Loader) Machine() (*Machine, error) {
	if ld.err != nil {
		return nil, ld.err
	}
	ld.b.t.flushPending()
	if tok, dup := duplicateToken(ld.tokens); dup {
		return nil, malformedf("token %d held twice", tok)
	}
	m := NewMachine()
	m.lastToken, m.locks, m.lockSum, m.req.held = ld.lastToken, ld.b.t, ld.b.sum, ld.b.held
	m.sess.locksOf = ld.b.sess.locksOf
	return m, nil
}

// duplicateToken sorts tokens and returns one that appears twice, if any.
func duplicateToken(tokens []uint64) (uint64, bool) {
	slices.Sort(tokens)
	for i := 1; i < len(tokens); i++ {
		if tokens[i] == tokens[i-1] {
			return tokens[i], true
		}
	}
	return 0, false
}

// SnapshotLockCount reads the number of locks a snapshot declares from its
// first bytes (the first 32 are enough), without checking anything else:
// a size hint for a caller about to load a table of about that size, never
// a value to trust.
func SnapshotLockCount(head []byte) (int, bool) {
	if len(head) < len(snapshotMagic)+1 || [3]byte(head[:3]) != snapshotMagic {
		return 0, false
	}
	d := decoder{b: head[4:]}
	_ = d.uvarint()
	n := d.uvarint()
	if d.err != nil || n > MaxSnapshotLocks {
		return 0, false
	}
	return int(n), true
}
