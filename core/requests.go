package core

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// Request records: what makes an acquire retry-safe (cluster version 3).
//
// A Grant may carry the client's request id (Command.RequestID), scoped
// to the identity that sent it. Its request record lets a retry of the
// same acquire, which may reach another leader after the first reply was
// lost, learn the first outcome instead of being granted a second time:
//
//   - while the grant is held, the request id is a field of the lock
//     (Lock.RequestID), indexed by RequestKey(identity, request id);
//   - when the lock is released or expires, the record moves to a FIFO of
//     ended records, which keeps only hashes: EndedRequest is 80 bytes
//     whatever the key and identity sizes, so the table's bound costs
//     little memory and snapshot space (limits.go).
//
// Apply of a Grant with a request id, in order:
//
//  1. the request names a held lock: same key, ResultGrantRepeated with
//     its token; another key, ResultRequestMismatch;
//  2. it names an ended grant not older than RequestRetentionMS:
//     ResultGrantEnded with its token if the key matches, else
//     ResultRequestMismatch;
//  3. otherwise the normal Grant path (GrantRejected when the key is
//     held, Noop when the tokens are exhausted), except that a grant that
//     would take the records past MaxRequestRecords, when no ended record
//     older than MinRequestRetentionMS can be forgotten to make room,
//     yields ResultRequestsExhausted.
//
// None of 1, 2 or the refusals changes a lock or a record.
//
// Settle (cluster version 6) is what a client that gave up on an acquire
// sends, so that no attempt of it still in the network is granted later.
// Its Apply, atomically:
//
//   - the request names a held lock: same key, that lock (or holder) is
//     released as a Release would, its end recorded, and ResultReleased
//     answers its token; another key, ResultRequestMismatch;
//   - it names an ended grant (not stale): ResultGrantEnded with its
//     token (ResultRequestMismatch for another key); nothing changes;
//   - otherwise a tombstone, an ended record with token 0, is pushed
//     (ResultSettled), or, when the records are full and none can be
//     forgotten, ResultRequestsExhausted and nothing changes.
//
// A Grant of a tombstoned request finds it at step 2: ResultGrantEnded
// with token 0 (ResultRequestMismatch for another key). A tombstone is
// pruned like any ended record, after RequestRetentionMS: an attempt that
// arrives later than that can still be granted.
//
// Time is data: the data clock is the highest GrantedAtMS of any Grant
// applied at cluster version 3 (a leader's wall clock, carried in the
// command), whatever its result, so that time passes for pruning even
// while grants are refused. An ended record carries the data clock at its
// end. Because the clock advances only with grants, an end that follows
// a long quiet spell is dated at the last grant before it, and the record
// may be forgotten that much sooner by real time; and a leader whose clock
// runs ahead shortens every window. Neither ever decides whether a lock is
// held: only whether a retry still finds the first outcome.
//
// Determinism: the FIFO has a sequence number per record, replicated (a
// snapshot carries its head), so storage rows (raftstore keys them by it)
// and the digest are the same on every replica. Records are pruned only
// from the head, at most RequestPruneBudget per applied lock command; a
// stale record not yet pruned is already ignored by lookups. A request id
// reused after its ended record went stale leaves that record in the FIFO
// until pruned; the index always names the newest record of a request.

// RequestKey names the request id requestID of identity: the SHA-256 of
// both, unambiguously framed. Records are kept and found by it.
func RequestKey(identity, requestID string) [32]byte {
	const domain = "ticketd request v1\x00"
	var buf [len(domain) + binary.MaxVarintLen64 + MaxIdentityLen + MaxRequestIDLen]byte
	b := append(buf[:0], domain...)
	b = appendString(b, identity)
	b = append(b, requestID...)
	return sha256.Sum256(b)
}

// RequestKeyHash is the hash of a lock key an ended record keeps.
func RequestKeyHash(key string) [32]byte {
	const domain = "ticketd request key v1\x00"
	var buf [len(domain) + MaxKeyLen]byte
	return sha256.Sum256(append(append(buf[:0], domain...), key...))
}

// EndedRequest is the record of a grant made with a request id that has
// ended (released or expired).
type EndedRequest struct {
	Request   [32]byte // RequestKey(identity, request id)
	KeyHash   [32]byte // RequestKeyHash(key)
	Token     uint64   // the grant's token
	EndedAtMS uint64   // the data clock when it ended
}

// RequestState is the replicated request state besides the locks' own
// request ids: the data clock and the FIFO of ended records.
type RequestState struct {
	DataClockMS uint64
	// EndedHead is the sequence number of Ended[0] (of the next record to
	// end, when Ended is empty); the others follow one by one.
	EndedHead uint64
	Ended     []EndedRequest // oldest first; EndedAtMS never decreases
}

// RequestStatus says what a request id names.
type RequestStatus uint8

// Request statuses.
const (
	RequestUnknown RequestStatus = 0 // no record (never seen, or forgotten)
	RequestHeld    RequestStatus = 1 // a lock held now
	RequestEnded   RequestStatus = 2 // a grant that ended
)

func (s RequestStatus) String() string {
	switch s {
	case RequestHeld:
		return "held"
	case RequestEnded:
		return "ended"
	}
	return "unknown"
}

// RequestRecord is what LookupRequest finds.
type RequestRecord struct {
	Status RequestStatus
	// Key is the held lock's key; for an ended grant only its hash is
	// kept (KeyHash).
	Key     string
	KeyHash [32]byte
	Token   uint64
}

// requests is the machine's in-memory request state. The zero value is
// empty.
type requests struct {
	clockMS uint64
	held    map[[32]byte]string // request key -> key of the lock holding it
	fifo    []EndedRequest      // the ended records are fifo[first:]
	first   int
	base    uint64              // sequence number of fifo[0]
	newest  map[[32]byte]uint64 // request key -> seq of its newest ended record
	sum     sum256              // Σ endedTerm(seq, record), for the digest
	// limit replaces MaxRequestRecords when not zero; only tests set it
	// (export_test.go), so that a full table takes a few records.
	limit int
}

func (r *requests) maxRecords() int {
	if r.limit > 0 {
		return r.limit
	}
	return MaxRequestRecords
}

func (r *requests) headSeq() uint64 { return r.base + uint64(r.first) }
func (r *requests) nextSeq() uint64 { return r.base + uint64(len(r.fifo)) }
func (r *requests) endedLen() int   { return len(r.fifo) - r.first }
func (r *requests) count() int      { return len(r.held) + r.endedLen() }

// age is how long before the data clock e ended.
func (r *requests) age(e *EndedRequest) uint64 { return r.clockMS - e.EndedAtMS }

// ended finds the newest ended record of request h that is not stale.
func (r *requests) ended(h [32]byte) (EndedRequest, bool) {
	seq, ok := r.newest[h]
	if !ok {
		return EndedRequest{}, false
	}
	e := r.fifo[seq-r.base]
	if r.age(&e) > RequestRetentionMS {
		return EndedRequest{}, false
	}
	return e, true
}

func (r *requests) push(e EndedRequest) {
	if r.newest == nil {
		r.newest = make(map[[32]byte]uint64)
	}
	seq := r.nextSeq()
	r.fifo = append(r.fifo, e)
	r.newest[e.Request] = seq
	r.sum.add(endedTerm(seq, &e))
}

func (r *requests) popHead() {
	seq := r.headSeq()
	e := &r.fifo[r.first]
	if r.newest[e.Request] == seq {
		delete(r.newest, e.Request)
	}
	r.sum.sub(endedTerm(seq, e))
	*e = EndedRequest{}
	r.first++
	// Move the live records down once the dead prefix is as long as they
	// are: amortised O(1) per record, and the array never grows past
	// twice the records it holds.
	if r.first >= 64 && 2*r.first >= len(r.fifo) {
		n := copy(r.fifo, r.fifo[r.first:])
		clear(r.fifo[n:])
		r.fifo = r.fifo[:n]
		r.base += uint64(r.first)
		r.first = 0
	}
}

// prune forgets up to budget ended records older than RequestRetentionMS,
// oldest first.
func (r *requests) prune(budget int) {
	for ; budget > 0 && r.endedLen() > 0 && r.age(&r.fifo[r.first]) > RequestRetentionMS; budget-- {
		r.popHead()
	}
}

// makeRoom reports whether one more record fits, forgetting the oldest
// ended record if the table is full and it is older than
// MinRequestRetentionMS.
func (r *requests) makeRoom() bool {
	if r.count() < r.maxRecords() {
		return true
	}
	if r.endedLen() > 0 && r.age(&r.fifo[r.first]) >= MinRequestRetentionMS {
		r.popHead()
		return true
	}
	return false
}

// state returns a copy of the replicated part.
func (r *requests) state() RequestState {
	rs := RequestState{DataClockMS: r.clockMS, EndedHead: r.headSeq()}
	if r.endedLen() > 0 {
		rs.Ended = append([]EndedRequest(nil), r.fifo[r.first:]...)
	}
	return rs
}

// load replaces the clock and the ended records with rs (validated), and
// keeps the held index, which Load builds from the locks.
func (r *requests) load(rs RequestState) {
	*r = requests{clockMS: rs.DataClockMS, held: r.held, base: rs.EndedHead, limit: r.limit}
	r.fifo = make([]EndedRequest, 0, len(rs.Ended))
	for _, e := range rs.Ended {
		r.push(e)
	}
}

// grantRequest is step 1 and 2 of a Grant with a request id h (see
// above): the result when the request names a grant already, ok false
// otherwise.
func (m *Machine) grantRequest(c *Command, h [32]byte) (res Result, ok bool) {
	if key, held := m.req.held[h]; held {
		tok := m.heldRequestToken(key, c.Identity, c.RequestID)
		if key == c.Key {
			return Result{Kind: ResultGrantRepeated, Token: tok}, true
		}
		return Result{Kind: ResultRequestMismatch, Token: tok}, true
	}
	if e, ended := m.req.ended(h); ended {
		if e.KeyHash == RequestKeyHash(c.Key) {
			return Result{Kind: ResultGrantEnded, Token: e.Token}, true
		}
		return Result{Kind: ResultRequestMismatch, Token: e.Token}, true
	}
	return Result{}, false
}

// settle applies a Settle (see above).
func (m *Machine) settle(c *Command) Result {
	h := RequestKey(c.Identity, c.RequestID)
	if key, held := m.req.held[h]; held {
		tok := m.heldRequestToken(key, c.Identity, c.RequestID)
		if key != c.Key {
			return Result{Kind: ResultRequestMismatch, Token: tok}
		}
		if mk := m.kinds.get(key); mk != nil {
			m.applyMulti(mk, &Command{Kind: KindRelease, Key: key, Token: tok})
		} else if l, ok := m.locks.get(key); ok {
			m.end(l)
		}
		return Result{Kind: ResultReleased, Token: tok}
	}
	if e, ended := m.req.ended(h); ended {
		if e.KeyHash != RequestKeyHash(c.Key) {
			return Result{Kind: ResultRequestMismatch, Token: e.Token}
		}
		return Result{Kind: ResultGrantEnded, Token: e.Token}
	}
	if !m.req.makeRoom() {
		return Result{Kind: ResultRequestsExhausted}
	}
	m.req.push(EndedRequest{Request: h, KeyHash: RequestKeyHash(c.Key), EndedAtMS: m.req.clockMS})
	return Result{Kind: ResultSettled}
}

// end removes the lock held on l.Key (l is that lock), and from the
// session's index, and, when it was granted with a request id, records
// its end.
func (m *Machine) end(l Lock) {
	m.lockSum.sub(lockTerm(l))
	m.locks.del(l.Key)
	m.sess.lockRemoved(&l)
	m.endRequest(&l)
}

// endRequest records the end of the lock or holder l when it was granted
// with a request id.
func (m *Machine) endRequest(l *Lock) {
	if l.RequestID != "" {
		h := RequestKey(l.Identity, l.RequestID)
		delete(m.req.held, h)
		m.req.push(EndedRequest{Request: h, KeyHash: RequestKeyHash(l.Key), Token: l.Token, EndedAtMS: m.req.clockMS})
	}
}

// grant adds a new lock (its key is free) made by the request h (zero:
// none), keeping lockSum and the index of held requests in step.
func (m *Machine) grant(l Lock, h *[32]byte) {
	m.locks.put(l)
	m.lockSum.add(lockTerm(l))
	m.sess.lockAdded(&l)
	if l.RequestID != "" {
		if m.req.held == nil {
			m.req.held = make(map[[32]byte]string)
		}
		m.req.held[*h] = l.Key
	}
}

// LookupRequest says what the request id requestID of identity names: a
// held lock (with its key and token), a grant that ended (with its token
// and the hash of its key) not longer than RequestRetentionMS ago by the
// data clock, or nothing. It is what a Grant with that request id would
// find now (before the clock moves).
func (m *Machine) LookupRequest(identity, requestID string) RequestRecord {
	h := RequestKey(identity, requestID)
	if key, ok := m.req.held[h]; ok {
		return RequestRecord{Status: RequestHeld, Key: key, KeyHash: RequestKeyHash(key), Token: m.heldRequestToken(key, identity, requestID)}
	}
	if e, ok := m.req.ended(h); ok {
		return RequestRecord{Status: RequestEnded, KeyHash: e.KeyHash, Token: e.Token}
	}
	return RequestRecord{}
}

// lockToken is the token of the lock held on key (0: none).
func (m *Machine) lockToken(key string) uint64 {
	l, _ := m.Get(key)
	return l.Token
}

// RequestRecords is the number of request records: held locks with a
// request id plus ended records not yet pruned. At most MaxRequestRecords.
func (m *Machine) RequestRecords() int { return m.req.count() }

// RequestRoom reports whether a Grant with a new request id, carrying
// grantedAtMS, would find room in the request records (cheap: O(1)). A
// leader refuses one that would not with resource_exhausted rather than
// propose it (it would apply as ResultRequestsExhausted).
func (m *Machine) RequestRoom(grantedAtMS uint64) bool {
	r := &m.req
	if r.count() < r.maxRecords() {
		return true
	}
	return r.endedLen() > 0 && max(r.clockMS, grantedAtMS)-r.fifo[r.first].EndedAtMS >= MinRequestRetentionMS
}

// DataClockMS is the data clock: the highest GrantedAtMS of any Grant
// applied at cluster version 3 (0 before).
func (m *Machine) DataClockMS() uint64 { return m.req.clockMS }

// RequestState returns a copy of the request state (the ended records in
// FIFO order). It costs O(records).
func (m *Machine) RequestState() RequestState { return m.req.state() }

// EndedSeqs returns the sequence numbers of the oldest ended record (head)
// and of the next one to end (next): the records are head..next-1.
// Storage keeps one row per sequence number.
func (m *Machine) EndedSeqs() (head, next uint64) { return m.req.headSeq(), m.req.nextSeq() }

// EndedRequestAt returns the ended record with sequence number seq, if it
// is still kept.
func (m *Machine) EndedRequestAt(seq uint64) (EndedRequest, bool) {
	r := &m.req
	if seq < r.headSeq() || seq >= r.nextSeq() {
		return EndedRequest{}, false
	}
	return r.fifo[seq-r.base], true
}

// LoadRequests replaces the request state with rs, as read back from
// storage, after Load and LoadControl: it is checked against the locks,
// the token counter and the cluster version already loaded. On error the
// machine is unchanged.
func (m *Machine) LoadRequests(rs RequestState) error {
	// validateRequests looks up only the tokens of ended records among
	// the held ones, so the set holds just those: not a map entry per held
	// lock (a million at the largest table).
	ended := make(map[uint64]struct{}, len(rs.Ended))
	for _, e := range rs.Ended {
		ended[e.Token] = struct{}{}
	}
	heldTokens := make(map[uint64]struct{})
	withID := 0
	m.ForEachLock(func(l Lock) {
		if _, ok := ended[l.Token]; ok {
			heldTokens[l.Token] = struct{}{}
		}
		if l.RequestID != "" {
			withID++
		}
	})
	if withID != len(m.req.held) {
		return malformedf("two held locks carry the same request")
	}
	if err := validateRequests(&rs, m.lastToken, withID, heldTokens, m.ClusterVersion()); err != nil {
		return err
	}
	m.req.load(rs)
	return nil
}

// validateRequests checks a request state against the rest of the state:
// nothing before cluster version 3; the total within MaxRequestRecords;
// sequence numbers that do not overflow; ended records with tokens not
// above lastToken, none twice nor held, dated in order and not after the
// data clock; token 0 (a tombstone) only from cluster version 6. heldWithID is the number of locks with a request
// id, heldTokens the tokens of all held locks.
func validateRequests(rs *RequestState, lastToken uint64, heldWithID int, heldTokens map[uint64]struct{}, clusterVersion uint64) error {
	if clusterVersion < 3 && (rs.DataClockMS != 0 || rs.EndedHead != 0 || len(rs.Ended) != 0 || heldWithID != 0) {
		return malformedf("request records before cluster version 3")
	}
	if heldWithID+len(rs.Ended) > MaxRequestRecords {
		return malformedf("%d held and %d ended request records, the limit is %d", heldWithID, len(rs.Ended), MaxRequestRecords)
	}
	if rs.EndedHead > math.MaxUint64-uint64(len(rs.Ended)) {
		return malformedf("ended request sequence %d+%d overflows", rs.EndedHead, len(rs.Ended))
	}
	tokens := make(map[uint64]struct{}, len(rs.Ended))
	var prev uint64
	for i, e := range rs.Ended {
		if e.Token == 0 && clusterVersion >= 6 {
			if e.EndedAtMS < prev || e.EndedAtMS > rs.DataClockMS {
				return malformedf("ended request %d ended at %d, after %d, data clock %d", i, e.EndedAtMS, prev, rs.DataClockMS)
			}
			prev = e.EndedAtMS
			continue
		}
		_, held := heldTokens[e.Token]
		_, dup := tokens[e.Token]
		switch {
		case e.Token == 0 || e.Token > lastToken:
			return malformedf("ended request %d has token %d, last token %d", i, e.Token, lastToken)
		case held || dup:
			return malformedf("ended request %d repeats token %d", i, e.Token)
		case e.EndedAtMS < prev || e.EndedAtMS > rs.DataClockMS:
			return malformedf("ended request %d ended at %d, after %d, data clock %d", i, e.EndedAtMS, prev, rs.DataClockMS)
		}
		tokens[e.Token] = struct{}{}
		prev = e.EndedAtMS
	}
	return nil
}
