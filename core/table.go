package core

import (
	"hash/maphash"
	"math/bits"
	"unsafe"

	"github.com/ticketd/ticketd/internal/intern"
)

// The lock table's memory layout.
//
// A node holds every lock of the cluster (a million at the largest
// --max-locks), so the table is laid out for memory and for the garbage
// collector rather than as a map[string]Lock (196 bytes a lock at a
// million, all of it scanned by every GC cycle; docs/benchmarks.md):
//
//   - recs: one fixed 40-byte record per lock (token, lease, grant time,
//     where its strings are, its interned identity);
//   - arena: the bytes of every lock's key, owner and request id, back to
//     back;
//   - index: open addressing with linear probing over record numbers, at
//     most half full, 4 bytes a slot (with 7 bits of the key's hash, so
//     that a probe rarely touches a record that is not the one sought);
//   - identities: interned (a cluster has few), counted, freed at zero.
//
// None of recs, arena or index holds a pointer, so the collector never
// scans them. A lock with a 12-byte key and a 9-byte owner costs about 70
// bytes.
//
// Strings handed out (Get, ForEachLock) alias the arena instead of being
// copied. That is safe because arena bytes are never written twice: a new
// or changed lock's bytes are appended after the arena's length (into
// capacity no string can alias, or into a new array when it grows), a
// removed lock's bytes are left as they are (counted dead), and
// compaction copies the live bytes into a new array and leaves the old
// one to the collector, which keeps it for as long as any string handed
// out from it lives. Callers that keep a string for long therefore keep
// an old arena alive; every caller in this module either copies what it
// keeps or drops it within a Ready.
//
// Determinism: the index's hash seed is random per table, like a Go map's
// and for the same reason (keys are chosen by clients, so a fixed hash
// would let them pile keys onto one probe run). Like a map's, it never
// reaches anything replicated: the index only finds records, iteration
// walks the records (in an order no result, snapshot or digest depends on:
// Locks sorts, the digest is a sum), and no decision depends on where a
// key landed.

// lockFields stops compiling when Lock gains, loses or reorders a field:
// the table keeps every field of a lock (lockRec, lock, put, putRaw, and
// Loader.AddRecord for the stored record), so a new one must be added
// there too, or it would be silently dropped. Limit and Mode are the
// exception: the table holds only mutex and exclusive locks, whose Limit
// and Mode are 0 (multi-holder keys are kinds.go's; Apply and the loaders
// put nothing else here).
var _ = Lock(struct {
	Key         string
	Token       uint64
	Owner       string
	Identity    string
	RequestID   string
	LeaseMS     uint64
	GrantedAtMS uint64
	SessionID   uint64
	LockDelayMS uint64
	Limit       uint32
	Mode        Mode
}{})

// lockRec is one lock. A free record has keyLen 0 (no key is empty).
type lockRec struct {
	token       uint64
	leaseMS     uint64
	grantedAtMS uint64
	off         uint32 // the key, the owner, the request id start at arena[off]
	identity    uint32 // index into idents
	keyLen      uint16
	ownerLen    uint16
	reqLen      uint8
	// A session lock (cluster version 4) has no lease, so leaseMS holds
	// its session ID when inSession is set; lockDelayMS fits 16 bits. Both
	// sit in what was padding: the record stays 40 bytes.
	inSession   bool
	lockDelayMS uint16
}

// hold returns the lease, session and lock-delay fields of a record for l.
func hold(l *Lock) (leaseMS uint64, inSession bool, lockDelayMS uint16) {
	if l.SessionID != 0 {
		return l.SessionID, true, uint16(l.LockDelayMS)
	}
	return l.LeaseMS, false, uint16(l.LockDelayMS)
}

// size is how many arena bytes r's strings take.
func (r *lockRec) size() int { return int(r.keyLen) + int(r.ownerLen) + int(r.reqLen) }

// An index entry is a record number + 1 in its low entryRecBits bits and
// 7 bits of the key's hash above them: a probe compares a key only when
// those bits match (1 in 128 of the other keys), so it rarely touches a
// record, a cache miss away in a large table, for nothing. 0 is empty.
const (
	entryRecBits = 25
	entryRecMask = 1<<entryRecBits - 1
)

func entryTag(h uint64) uint32                { return uint32(h>>57) << entryRecBits }
func entryOf(rec uint32, h uint64) uint32     { return (rec + 1) | entryTag(h) }
func entryRec(e uint32) uint32                { return e&entryRecMask - 1 }
func (t *lockTable) hashOf(key string) uint64 { return maphash.String(t.seed, key) }

// The fields' widths hold every valid lock (and arena offsets stay below
// 4 GiB: at most MaxLocks+MaxLocksOverrun locks of at most 768 bytes,
// twice over before compaction).
const (
	_ = uint16(MaxKeyLen)
	_ = uint16(MaxOwnerLen)
	_ = uint8(MaxRequestIDLen)
	_ = uint16(MaxLockDelayMS)
	_ = uint32(2 * (MaxLocks + MaxLocksOverrun) * (MaxKeyLen + MaxOwnerLen + MaxRequestIDLen))
	// Record numbers fit an index entry: a table never has more records
	// than a snapshot may declare locks.
	_ = uint(entryRecMask - 1 - MaxSnapshotLocks)
)

// lockTable is the lock table. The zero value is not usable; newLockTable
// makes one.
type lockTable struct {
	recs  []lockRec
	free  []uint32 // free record numbers
	n     int      // locks held
	index []uint32 // record number + 1; 0 is an empty slot
	seed  maphash.Seed
	arena []byte
	dead  int // arena bytes no record names
	// pending are index entries a bulk load has yet to write
	// (flushPending, which sorts them into sorted). Every method but
	// putRaw runs with none pending.
	pending, sorted []pendingEntry
	// idents numbers the locks' identities (0: the empty one).
	idents intern.Table
}

// newLockTable makes an empty table with room for n locks.
func newLockTable(n int) *lockTable {
	t := &lockTable{
		recs:   make([]lockRec, 0, n),
		index:  make([]uint32, tableIndexSize(n)),
		seed:   maphash.MakeSeed(),
		arena:  make([]byte, 0, 24*n),
		idents: intern.New(),
	}
	return t
}

// tableIndexSize is the index length for n locks: a power of two, at most
// half full.
func tableIndexSize(n int) int {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	return size
}

func (t *lockTable) len() int { return t.n }

// str is the string of n arena bytes at off, aliasing the arena (see the
// top of this file for why that is safe).
func (t *lockTable) str(off uint32, n uint16) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(&t.arena[off], int(n))
}

func (t *lockTable) keyOf(r *lockRec) string { return t.str(r.off, r.keyLen) }

func (t *lockTable) lock(r *lockRec) Lock {
	owner := r.off + uint32(r.keyLen)
	l := Lock{Key: t.keyOf(r), Token: r.token, Owner: t.str(owner, r.ownerLen),
		Identity: t.idents.Name(r.identity), RequestID: t.str(owner+uint32(r.ownerLen), uint16(r.reqLen)),
		LeaseMS: r.leaseMS, GrantedAtMS: r.grantedAtMS, LockDelayMS: uint64(r.lockDelayMS)}
	if r.inSession {
		l.LeaseMS, l.SessionID = 0, r.leaseMS
	}
	return l
}

// find returns the record number of key and the index slot naming it, or
// -1 and the empty slot where key would go.
func (t *lockTable) find(key string) (int, int) {
	i, slot, _ := t.findHashed(key, t.hashOf(key))
	return i, slot
}

// findHashed is find for a key whose hash h is known; it also returns h.
func (t *lockTable) findHashed(key string, h uint64) (int, int, uint64) {
	mask := len(t.index) - 1
	slot, tag := int(h)&mask, entryTag(h)
	for {
		e := t.index[slot]
		if e == 0 {
			return -1, slot, h
		}
		if e&^entryRecMask == tag {
			if r := &t.recs[entryRec(e)]; int(r.keyLen) == len(key) && t.keyOf(r) == key {
				return int(entryRec(e)), slot, h
			}
		}
		slot = (slot + 1) & mask
	}
}

func (t *lockTable) get(key string) (Lock, bool) {
	i, _ := t.find(key)
	if i < 0 {
		return Lock{}, false
	}
	return t.lock(&t.recs[i]), true
}

// put sets the lock on l.Key and returns the lock it replaced, if any.
func (t *lockTable) put(l Lock) (old Lock, replaced bool) {
	i, slot, h := t.findHashed(l.Key, t.hashOf(l.Key))
	if i >= 0 {
		r := &t.recs[i]
		old = t.lock(r)
		if old.Owner != l.Owner || old.RequestID != l.RequestID {
			// The key stays; the strings move to the end.
			t.dead += r.size()
			r.off, r.ownerLen, r.reqLen = t.appendStrings(l.Key, l.Owner, l.RequestID), uint16(len(l.Owner)), uint8(len(l.RequestID))
		}
		if old.Identity != l.Identity {
			t.idents.Release(r.identity)
			r.identity = t.idents.Add(l.Identity)
		}
		r.token, r.grantedAtMS = l.Token, l.GrantedAtMS
		r.leaseMS, r.inSession, r.lockDelayMS = hold(&l)
		t.maybeCompact()
		return old, true
	}
	if 2*(t.n+1) > len(t.index) {
		t.growIndex()
		_, slot, _ = t.findHashed(l.Key, h)
	}
	var n uint32
	if k := len(t.free); k > 0 {
		n, t.free = t.free[k-1], t.free[:k-1]
	} else {
		t.recs = append(t.recs, lockRec{})
		n = uint32(len(t.recs) - 1)
	}
	t.recs[n] = lockRec{token: l.Token, grantedAtMS: l.GrantedAtMS,
		off: t.appendStrings(l.Key, l.Owner, l.RequestID), identity: t.idents.Add(l.Identity),
		keyLen: uint16(len(l.Key)), ownerLen: uint16(len(l.Owner)), reqLen: uint8(len(l.RequestID))}
	t.recs[n].leaseMS, t.recs[n].inSession, t.recs[n].lockDelayMS = hold(&l)
	t.index[slot] = entryOf(n, h)
	t.n++
	return Lock{}, false
}

// putRaw adds the lock r (checked), copying its strings once, into the
// arena. A key already held makes it return false and change nothing,
// unless the caller vouches that the key is new (fresh: the keys arrive
// in strictly ascending order). A fresh key's index entry is deferred
// (flushPending): a bulk load then probes the index in batches.
func (t *lockTable) putRaw(r *rawLock, fresh bool) bool {
	if 2*(t.n+1) > len(t.index) {
		t.flushPending()
		t.growIndex()
	}
	h := maphash.Bytes(t.seed, r.key)
	slot := -1
	if !fresh {
		t.flushPending()
		mask, tag := len(t.index)-1, entryTag(h)
		for slot = int(h) & mask; t.index[slot] != 0; slot = (slot + 1) & mask {
			e := t.index[slot]
			if e&^entryRecMask == tag {
				if rec := &t.recs[entryRec(e)]; int(rec.keyLen) == len(r.key) && t.keyOf(rec) == string(r.key) {
					return false
				}
			}
		}
	}
	id := t.idents.AddBytes(r.identity)
	off := uint32(len(t.arena))
	t.arena = append(append(append(t.arena, r.key...), r.owner...), r.requestID...)
	n := uint32(len(t.recs))
	rec := lockRec{token: r.token, leaseMS: r.leaseMS, grantedAtMS: r.grantedAtMS,
		off: off, identity: id, keyLen: uint16(len(r.key)), ownerLen: uint16(len(r.owner)), reqLen: uint8(len(r.requestID)),
		lockDelayMS: uint16(r.lockDelayMS)}
	if r.sessionID != 0 {
		rec.leaseMS, rec.inSession = r.sessionID, true
	}
	t.recs = append(t.recs, rec)
	t.n++
	if fresh {
		if t.pending == nil {
			// A batch, or the table's room if smaller.
			t.pending = make([]pendingEntry, 0, min(pendingBatch, len(t.index)/2))
		}
		t.pending = append(t.pending, pendingEntry{rec: n, h: h})
		if len(t.pending) == cap(t.pending) {
			t.flushPending()
		}
	} else {
		t.index[slot] = entryOf(n, h)
	}
	return true
}

// pendingEntry is an index entry putRaw deferred.
type pendingEntry struct {
	rec uint32
	h   uint64
}

// pendingBatch is how many index entries a bulk load defers. Inserted as
// they come, a million keys hit the 8-MB index at random: a cache and TLB
// miss each, the largest cost of a load (docs/benchmarks.md). Deferred,
// they are written in the order of their home slots (flushPending), so
// the writes sweep the index instead of jumping about it.
const pendingBatch = 1 << 16

// flushPending writes the deferred index entries, grouped by the region of
// the index their home slot lies in (a counting sort on its top bits),
// each probing from its home slot as usual.
func (t *lockTable) flushPending() {
	if len(t.pending) == 0 {
		return
	}
	mask := len(t.index) - 1
	const regionBits = 8
	shift := max(0, bits.Len(uint(mask))-regionBits)
	var count [1<<regionBits + 1]int
	for _, p := range t.pending {
		count[(int(p.h)&mask)>>shift+1]++
	}
	for i := 1; i < len(count); i++ {
		count[i] += count[i-1]
	}
	if cap(t.sorted) < len(t.pending) {
		t.sorted = make([]pendingEntry, len(t.pending))
	}
	sorted := t.sorted[:len(t.pending)]
	for _, p := range t.pending {
		r := (int(p.h) & mask) >> shift
		sorted[count[r]] = p
		count[r]++
	}
	for _, p := range sorted {
		slot := int(p.h) & mask
		for t.index[slot] != 0 {
			slot = (slot + 1) & mask
		}
		t.index[slot] = entryOf(p.rec, p.h)
	}
	t.pending = t.pending[:0]
}

// appendStrings appends a lock's strings to the arena and returns where
// they start.
func (t *lockTable) appendStrings(key, owner, requestID string) uint32 {
	off := uint32(len(t.arena))
	t.arena = append(append(append(t.arena, key...), owner...), requestID...)
	return off
}

// del removes the lock on key and returns it.
func (t *lockTable) del(key string) (Lock, bool) {
	i, slot := t.find(key)
	if i < 0 {
		return Lock{}, false
	}
	r := &t.recs[i]
	old := t.lock(r)
	t.unindex(slot)
	t.dead += r.size()
	t.idents.Release(r.identity)
	*r = lockRec{}
	t.free = append(t.free, uint32(i))
	t.n--
	t.maybeCompact()
	return old, true
}

// unindex empties slot and moves back the entries of the probe run after
// it that would otherwise be cut off from their home slot (linear probing
// without tombstones).
func (t *lockTable) unindex(slot int) {
	mask := len(t.index) - 1
	t.index[slot] = 0
	for j := (slot + 1) & mask; t.index[j] != 0; j = (j + 1) & mask {
		e := t.index[j]
		home := int(t.hashOf(t.keyOf(&t.recs[entryRec(e)]))) & mask
		if (j-home)&mask >= (j-slot)&mask {
			t.index[slot], t.index[j] = e, 0
			slot = j
		}
	}
}

// growIndex doubles the index.
func (t *lockTable) growIndex() {
	t.index = make([]uint32, 2*len(t.index))
	mask := len(t.index) - 1
	for i := range t.recs {
		r := &t.recs[i]
		if r.keyLen == 0 {
			continue
		}
		h := t.hashOf(t.keyOf(r))
		slot := int(h) & mask
		for t.index[slot] != 0 {
			slot = (slot + 1) & mask
		}
		t.index[slot] = entryOf(uint32(i), h)
	}
}

// maybeCompact copies the live strings into a new arena once dead bytes
// are more than half the live ones (and worth the copy), so the arena
// stays within 1.5 times its live bytes at amortised O(1) cost per
// change.
func (t *lockTable) maybeCompact() {
	live := len(t.arena) - t.dead
	if t.dead < 1<<16 || 2*t.dead < live {
		return
	}
	arena := make([]byte, 0, live+live/8)
	for i := range t.recs {
		r := &t.recs[i]
		if r.keyLen == 0 {
			continue
		}
		off := uint32(len(arena))
		arena = append(arena, t.arena[r.off:r.off+uint32(r.size())]...)
		r.off = off
	}
	t.arena, t.dead = arena, 0
}

// forEachFrom calls f for the locks in records [from, from+n) and
// returns the next record number, and whether the walk is done.
func (t *lockTable) forEachFrom(from, n int, f func(l Lock)) (int, bool) {
	from = max(0, from)
	end := min(len(t.recs), from+n)
	for i := from; i < end; i++ {
		if r := &t.recs[i]; r.keyLen != 0 {
			f(t.lock(r))
		}
	}
	return end, end >= len(t.recs)
}

// forEach calls f for every lock, in record order (no particular order).
func (t *lockTable) forEach(f func(l Lock)) {
	for i := range t.recs {
		if r := &t.recs[i]; r.keyLen != 0 {
			f(t.lock(r))
		}
	}
}
