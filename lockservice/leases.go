package lockservice

import (
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/intern"
)

// The leader's lease timers: one per held lock, ordered by deadline.
//
// The table holds a timer for every held lock (a million at the largest
// --max-locks), so it is laid out to cost little memory and no work for
// the garbage collector: fixed-size records in one slice, the keys'
// bytes in one arena, an open-addressing index of record numbers and a
// binary min-heap of record numbers. None of it holds a pointer, so a GC
// cycle never scans it. A record is 40 bytes; with the key's bytes, the
// index and the heap a timer costs about 70 bytes (148 in the earlier
// layout of one heap-allocated item per lock, a map and a pointer heap),
// and arming one allocates nothing once the table has room.
//
// Deadlines are nanoseconds after the table's base, a reading of the
// leader's monotonic clock taken when the table starts; they are never
// compared with another node's clock (SPEC §4.1).

// leaseRec is one timer. A free record has heapAt -1.
type leaseRec struct {
	deadline int64 // nanoseconds after base
	token    uint64
	leaseMS  uint32 // at most core.MaxLease
	keyOff   uint32 // the key is keys[keyOff : keyOff+keyLen]
	identity uint32 // index into idents
	heapAt   int32  // position in heap, -1 when the record is free
	renewing uint32 // Renews of this lock in flight (renew.go)
	keyLen   uint16
	// expiring is set once the lease ran out and its Expire was handed to
	// the workers: from then on a Renew is refused (renew.go).
	expiring bool
}

// MaxLease must fit leaseRec.leaseMS, and a key its keyLen.
const (
	_ = uint32(core.MaxLease / time.Millisecond)
	_ = uint16(core.MaxKeyLen)
)

// leaseItem is a timer handed to the expiry workers.
type leaseItem struct {
	key   string
	token uint64
}

// leaseTimer is a copy of one timer's state.
type leaseTimer struct {
	token    uint64
	deadline time.Time
	lease    time.Duration
	renewing uint32
	expiring bool
}

// leaseTable is the set of timers. Not safe for concurrent use: the
// service holds lead.mu.
type leaseTable struct {
	base  time.Time
	based bool
	recs  []leaseRec
	free  []int32 // free record numbers
	// index is open addressing with linear probing, a power of two long;
	// an entry is a record number + 1 with 6 bits of the key's hash above
	// it (indexEntry; 0: empty). Removal shifts the entries after it back,
	// so there are no tombstones.
	index []int32
	seed  maphash.Seed
	heap  []int32 // record numbers; recs[heap[0]] has the earliest deadline
	keys  []byte  // the arena of keys; dead bytes are reclaimed by compactKeys
	dead  int     // bytes of keys no record names
	// idents numbers the timers' identities (0: the empty one); an
	// identity's count is the number of timers naming it.
	idents intern.Table
}

func newLeaseTable() *leaseTable { return newLeaseTableFor(0) }

// newLeaseTableFor makes a table with room for n timers.
func newLeaseTableFor(n int) *leaseTable {
	h := &leaseTable{seed: maphash.MakeSeed()}
	h.resetFor(n)
	return h
}

// reset drops every timer.
func (h *leaseTable) reset() { h.resetFor(0) }

// resetFor drops every timer and makes room for n.
func (h *leaseTable) resetFor(n int) {
	h.based = false
	h.recs = make([]leaseRec, 0, n)
	h.free = nil
	h.index = make([]int32, indexSize(n))
	h.heap = make([]int32, 0, n)
	h.keys = make([]byte, 0, 16*n)
	h.dead = 0
	h.idents = intern.New()
}

// indexSize is the index length for n timers: a power of two with the
// table at most half full (linear probing stays short).
func indexSize(n int) int {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	return size
}

// Len is the number of timers.
func (h *leaseTable) Len() int { return len(h.heap) }

// held is the number of timers identity holds.
func (h *leaseTable) held(identity string) int {
	return h.idents.Refs(identity)
}

func (h *leaseTable) at(now time.Time) int64 {
	if !h.based {
		h.base, h.based = now, true
	}
	return int64(now.Sub(h.base))
}

func (h *leaseTable) timeOf(ns int64) time.Time { return h.base.Add(time.Duration(ns)) }

func (h *leaseTable) key(r *leaseRec) []byte { return h.keys[r.keyOff : r.keyOff+uint32(r.keyLen)] }

// An index entry carries 6 bits of its key's hash above the record
// number: a probe reads a record (a cache miss away in a large table) only
// when they match, 1 in 64 of the other keys. Record numbers stay below
// 2^25: there are never more records than timers were held at once, one
// per held lock, and no table of locks is larger than a snapshot may
// declare (core.MaxSnapshotLocks, 2^24).
const (
	entryRecBits = 25
	entryRecMask = 1<<entryRecBits - 1
)

// entryTag is the hash bits an entry for a key of hash hv carries.
func entryTag(hv uint64) int32 { return int32(hv>>58) << entryRecBits }

// indexEntry is the entry for record n of a key of hash hv.
func indexEntry(n int32, hv uint64) int32 { return (n + 1) | entryTag(hv) }

// entryRec is the record number entry e names.
func entryRec(e int32) int32 { return e&entryRecMask - 1 }

const _ = uint(entryRecMask - 1 - core.MaxSnapshotLocks)

// find returns the record number of key's timer and the index slot that
// names it, or -1 and the empty slot where it would go.
func (h *leaseTable) find(key string) (rec int32, slot int) {
	return h.findHashed(key, maphash.String(h.seed, key))
}

// findHashed is find for a key whose hash hv is known.
func (h *leaseTable) findHashed(key string, hv uint64) (rec int32, slot int) {
	mask := len(h.index) - 1
	slot = int(hv) & mask
	tag := entryTag(hv)
	for {
		e := h.index[slot]
		if e == 0 {
			return -1, slot
		}
		if e&^entryRecMask == tag {
			if r := &h.recs[entryRec(e)]; int(r.keyLen) == len(key) && string(h.key(r)) == key {
				return entryRec(e), slot
			}
		}
		slot = (slot + 1) & mask
	}
}

// unindex empties slot and moves back the entries of the probe run after
// it that may no longer be reachable (linear probing without tombstones).
func (h *leaseTable) unindex(slot int) {
	mask := len(h.index) - 1
	h.index[slot] = 0
	for j := (slot + 1) & mask; h.index[j] != 0; j = (j + 1) & mask {
		e := h.index[j]
		home := int(maphash.Bytes(h.seed, h.key(&h.recs[entryRec(e)]))) & mask
		// e may move to slot when slot lies cyclically in [home, j).
		if (j-home)&mask >= (j-slot)&mask {
			h.index[slot], h.index[j] = e, 0
			slot = j
		}
	}
}

// grow doubles the index when it is half full.
// It reports whether it did (which moves every entry).
func (h *leaseTable) grow() bool {
	if 2*(len(h.heap)+1) <= len(h.index) {
		return false
	}
	h.index = make([]int32, 2*len(h.index))
	mask := len(h.index) - 1
	for i := range h.recs {
		r := &h.recs[i]
		if r.heapAt < 0 {
			continue
		}
		hv := maphash.Bytes(h.seed, h.key(r))
		slot := int(hv) & mask
		for h.index[slot] != 0 {
			slot = (slot + 1) & mask
		}
		h.index[slot] = indexEntry(int32(i), hv)
	}
	return true
}

// newRec stores a timer's key and identity in a free record and returns
// its number; the caller sets the rest and indexes it.
func (h *leaseTable) newRec(key, identity string) int32 {
	var n int32
	if k := len(h.free); k > 0 {
		n, h.free = h.free[k-1], h.free[:k-1]
	} else {
		h.recs = append(h.recs, leaseRec{})
		n = int32(len(h.recs) - 1)
	}
	h.recs[n] = leaseRec{keyOff: uint32(len(h.keys)), keyLen: uint16(len(key)), identity: h.idents.Add(identity)}
	h.keys = append(h.keys, key...)
	return n
}

// freeRec releases record n (already out of the heap and the index).
func (h *leaseTable) freeRec(n int32) {
	r := &h.recs[n]
	h.dead += int(r.keyLen)
	h.idents.Release(r.identity)
	*r = leaseRec{heapAt: -1}
	h.free = append(h.free, n)
	if h.dead > 1<<16 && h.dead > len(h.keys)/2 {
		h.compactKeys()
	}
}

// compactKeys copies the live keys into a new arena, so that dead bytes
// never outnumber live ones (amortised O(1) per removal).
func (h *leaseTable) compactKeys() {
	keys := make([]byte, 0, len(h.keys)-h.dead+len(h.keys)/8)
	for i := range h.recs {
		r := &h.recs[i]
		if r.heapAt < 0 {
			continue
		}
		off := uint32(len(keys))
		keys = append(keys, h.key(r)...)
		r.keyOff = off
	}
	h.keys, h.dead = keys, 0
}

// arm sets key's timer to now+lease for token, held by identity. An
// existing timer for the same token is only ever moved later, never
// earlier; one for another token is replaced.
func (h *leaseTable) arm(key string, token uint64, identity string, lease time.Duration, now time.Time) {
	h.armHashed(key, maphash.String(h.seed, key), token, identity, lease, h.at(now)+int64(lease))
}

// armReq is one timer for armBatch.
type armReq struct {
	key, identity string
	token         uint64
	lease         time.Duration
	hv            uint64 // set by armBatch
}

// armRegionBits is how finely armBatch groups a batch by index region:
// 2048 regions, a 4-KB page of a million-timer index each (256 regions of
// 32 KB saved a third less in BenchmarkLeaseTableArmBatch1M).
const armRegionBits = 11

// armBatch arms every timer of reqs at now + its lease, as arm would one
// after another; it reorders reqs. Armed one by one, a new leader's
// million timers hit the 8-MB index at random, a cache and TLB miss each:
// two thirds of the re-arm (BenchmarkLeaseTableArm1M). Here they are
// armed grouped by the region of the index their home slot lies in (a
// stable counting sort on the slot's top bits, as core's bulk load writes
// its index: core/table.go flushPending), so the probes sweep the index.
// The timers that result are the same: arms of different keys commute,
// and the sort keeps the order of a key's own arms (one key, one home
// slot).
func (h *leaseTable) armBatch(reqs []armReq, now time.Time, scratch []armReq) []armReq {
	if len(reqs) == 0 {
		return scratch
	}
	base := h.at(now)
	mask := len(h.index) - 1
	shift := max(0, bits.Len(uint(mask))-armRegionBits)
	var count [1<<armRegionBits + 1]int
	for i := range reqs {
		reqs[i].hv = maphash.String(h.seed, reqs[i].key)
		count[(int(reqs[i].hv)&mask)>>shift+1]++
	}
	for i := 1; i < len(count); i++ {
		count[i] += count[i-1]
	}
	scratch = slices.Grow(scratch[:0], len(reqs))[:len(reqs)]
	for _, r := range reqs {
		at := (int(r.hv) & mask) >> shift
		scratch[count[at]] = r
		count[at]++
	}
	for _, r := range scratch {
		h.armHashed(r.key, r.hv, r.token, r.identity, r.lease, base+int64(r.lease))
	}
	clear(scratch) // the keys may alias the caller's memory
	return scratch
}

// armHashed is arm for a key whose hash hv is known, with its deadline in
// the table's nanoseconds.
func (h *leaseTable) armHashed(key string, hv uint64, token uint64, identity string, lease time.Duration, deadline int64) {
	n, slot := h.findHashed(key, hv)
	moved := n >= 0 // a removal below shifts entries
	if n >= 0 {
		r := &h.recs[n]
		if r.token == token {
			if deadline > r.deadline {
				r.deadline = deadline
				h.fix(int(r.heapAt))
			}
			return
		}
		h.remove(key, r.token)
	}
	if h.grow() || moved {
		_, slot = h.findHashed(key, hv)
	}
	n = h.newRec(key, identity)
	r := &h.recs[n]
	r.token, r.leaseMS, r.deadline = token, leaseMillis(lease), deadline
	h.index[slot] = indexEntry(n, hv)
	r.heapAt = int32(len(h.heap))
	h.heap = append(h.heap, n)
	h.up(len(h.heap) - 1)
}

// leaseMillis is lease in milliseconds for leaseRec.leaseMS. Leases come
// from validated locks (at most core.MaxLease, which fits); one above it
// is kept as the longest the field holds, never as a shorter one.
func leaseMillis(lease time.Duration) uint32 {
	ms := lease / time.Millisecond
	if lease%time.Millisecond != 0 {
		ms++ // never shorter than asked
	}
	return uint32(min(ms, math.MaxUint32))
}

// remove drops key's timer if it belongs to token.
func (h *leaseTable) remove(key string, token uint64) {
	n, slot := h.find(key)
	if n < 0 || h.recs[n].token != token {
		return
	}
	h.unindex(slot)
	h.heapRemove(int(h.recs[n].heapAt))
	h.freeRec(n)
}

// get returns a copy of key's timer.
func (h *leaseTable) get(key string) (leaseTimer, bool) {
	n, _ := h.find(key)
	if n < 0 {
		return leaseTimer{}, false
	}
	r := &h.recs[n]
	return leaseTimer{token: r.token, deadline: h.timeOf(r.deadline), lease: time.Duration(r.leaseMS) * time.Millisecond,
		renewing: r.renewing, expiring: r.expiring}, true
}

// addRenewing counts a Renew of key's lock held with token in (d = 1) or
// out (d = -1) of flight. It reports whether the timer exists; a count
// never goes below zero.
func (h *leaseTable) addRenewing(key string, token uint64, d int) bool {
	n, _ := h.find(key)
	if n < 0 || h.recs[n].token != token {
		return false
	}
	r := &h.recs[n]
	switch {
	case d > 0:
		r.renewing++
	case r.renewing > 0:
		r.renewing--
	}
	return true
}

// due returns up to limit timers whose deadline is at or before now,
// earliest first. Each one is pushed back by retry, so that if its Expire
// does not apply (the proposal was lost) it comes due again; pushing a
// deadline later never shortens a lease.
//
// A timer with a Renew in flight is pushed back without being returned:
// its Expire must not be proposed while a Renew it could overtake in the
// log may still apply (renew.go). Returned timers are marked expiring.
func (h *leaseTable) due(now time.Time, retry time.Duration, limit int) []leaseItem {
	var out []leaseItem
	t := h.at(now)
	for len(h.heap) > 0 && len(out) < limit {
		r := &h.recs[h.heap[0]]
		if r.deadline > t {
			break
		}
		if r.renewing == 0 {
			r.expiring = true
			out = append(out, leaseItem{key: string(h.key(r)), token: r.token})
		}
		r.deadline = t + int64(retry)
		h.down(0)
	}
	return out
}

// extend records an applied renewal of key's lock held with token: its
// lease becomes lease (never shorter than before) and its deadline
// now+lease (never earlier than before). It reports whether the timer
// exists.
func (h *leaseTable) extend(key string, token uint64, lease time.Duration, now time.Time) bool {
	n, _ := h.find(key)
	if n < 0 || h.recs[n].token != token {
		return false
	}
	r := &h.recs[n]
	r.leaseMS = max(r.leaseMS, leaseMillis(lease))
	if d := h.at(now) + int64(time.Duration(r.leaseMS)*time.Millisecond); d > r.deadline {
		r.deadline = d
		h.fix(int(r.heapAt))
	}
	return true
}

// next returns the earliest deadline; ok is false when nothing is held.
func (h *leaseTable) next() (time.Time, bool) {
	if len(h.heap) == 0 {
		return time.Time{}, false
	}
	return h.timeOf(h.recs[h.heap[0]].deadline), true
}

// The binary heap, on record numbers ordered by deadline.

func (h *leaseTable) less(i, j int) bool {
	return h.recs[h.heap[i]].deadline < h.recs[h.heap[j]].deadline
}

func (h *leaseTable) swap(i, j int) {
	h.heap[i], h.heap[j] = h.heap[j], h.heap[i]
	h.recs[h.heap[i]].heapAt = int32(i)
	h.recs[h.heap[j]].heapAt = int32(j)
}

func (h *leaseTable) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down moves heap[i] down to its place; it reports whether it moved.
func (h *leaseTable) down(i int) bool {
	start := i
	for {
		c := 2*i + 1
		if c >= len(h.heap) {
			break
		}
		if c+1 < len(h.heap) && h.less(c+1, c) {
			c++
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}

func (h *leaseTable) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *leaseTable) heapRemove(i int) {
	last := len(h.heap) - 1
	if i != last {
		h.swap(i, last)
	}
	h.heap = h.heap[:last]
	if i != last {
		h.fix(i)
	}
}
