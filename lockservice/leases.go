package lockservice

import (
	"container/heap"
	"time"
)

// leaseItem is one held lock's timer on the leader.
type leaseItem struct {
	key      string
	token    uint64
	identity string // who the lock was granted to (quota accounting)
	lease    time.Duration
	deadline time.Time // on the local monotonic clock
	index    int       // heap position
	// renewing counts the Renews of this lock in flight; while it is not
	// zero the lock is never handed to the expiry workers (renew.go).
	renewing int
	// expiring is set once the lease ran out and its Expire was handed to
	// the workers: from then on a Renew is refused (renew.go).
	expiring bool
}

// leaseHeap orders held locks by deadline, one item per key, and counts
// them per identity for the quotas.
type leaseHeap struct {
	items      []*leaseItem
	byKey      map[string]*leaseItem
	byIdentity map[string]int
}

func newLeaseHeap() *leaseHeap {
	return &leaseHeap{byKey: make(map[string]*leaseItem), byIdentity: make(map[string]int)}
}

func (h *leaseHeap) Len() int           { return len(h.items) }
func (h *leaseHeap) Less(i, j int) bool { return h.items[i].deadline.Before(h.items[j].deadline) }
func (h *leaseHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index = i
	h.items[j].index = j
}
func (h *leaseHeap) Push(x any) {
	it := x.(*leaseItem)
	it.index = len(h.items)
	h.items = append(h.items, it)
}
func (h *leaseHeap) Pop() any {
	old := h.items
	it := old[len(old)-1]
	old[len(old)-1] = nil
	h.items = old[:len(old)-1]
	it.index = -1
	return it
}

// arm sets key's timer to now+lease for token, held by identity. An
// existing timer for the same token is only ever moved later, never
// earlier.
func (h *leaseHeap) arm(key string, token uint64, identity string, lease time.Duration, now time.Time) {
	deadline := now.Add(lease)
	if it, ok := h.byKey[key]; ok {
		if it.token == token {
			if deadline.After(it.deadline) {
				it.deadline = deadline
				heap.Fix(h, it.index)
			}
			return
		}
		heap.Remove(h, it.index)
		h.count(it.identity, -1)
	}
	it := &leaseItem{key: key, token: token, identity: identity, lease: lease, deadline: deadline}
	heap.Push(h, it)
	h.byKey[key] = it
	h.count(identity, +1)
}

// remove drops key's timer if it belongs to token.
func (h *leaseHeap) remove(key string, token uint64) {
	if it, ok := h.byKey[key]; ok && it.token == token {
		heap.Remove(h, it.index)
		delete(h.byKey, key)
		h.count(it.identity, -1)
	}
}

// held is the number of locks identity holds.
func (h *leaseHeap) held(identity string) int { return h.byIdentity[identity] }

func (h *leaseHeap) count(identity string, d int) {
	if n := h.byIdentity[identity] + d; n > 0 {
		h.byIdentity[identity] = n
	} else {
		delete(h.byIdentity, identity)
	}
}

// get returns key's timer.
func (h *leaseHeap) get(key string) (*leaseItem, bool) {
	it, ok := h.byKey[key]
	return it, ok
}

// due returns up to limit items whose deadline is at or before now,
// earliest first. Each one is pushed back by retry, so that if its Expire
// does not apply (the proposal was lost) it comes due again; pushing a
// deadline later never shortens a lease.
//
// An item with a Renew in flight is pushed back without being returned:
// its Expire must not be proposed while a Renew it could overtake in the
// log may still apply (renew.go). Returned items are marked expiring.
func (h *leaseHeap) due(now time.Time, retry time.Duration, limit int) []leaseItem {
	var out []leaseItem
	for len(h.items) > 0 && len(out) < limit && !h.items[0].deadline.After(now) {
		it := h.items[0]
		if it.renewing == 0 {
			it.expiring = true
			out = append(out, *it)
		}
		it.deadline = now.Add(retry)
		heap.Fix(h, 0)
	}
	return out
}

// extend records an applied renewal of key's lock held with token: its
// lease becomes lease (never shorter than before) and its deadline
// now+lease (never earlier than before). It reports whether the timer
// exists.
func (h *leaseHeap) extend(key string, token uint64, lease time.Duration, now time.Time) bool {
	it, ok := h.byKey[key]
	if !ok || it.token != token {
		return false
	}
	it.lease = max(it.lease, lease)
	if d := now.Add(it.lease); d.After(it.deadline) {
		it.deadline = d
		heap.Fix(h, it.index)
	}
	return true
}

// next returns the earliest deadline; ok is false when nothing is held.
func (h *leaseHeap) next() (time.Time, bool) {
	if len(h.items) == 0 {
		return time.Time{}, false
	}
	return h.items[0].deadline, true
}

func (h *leaseHeap) reset() {
	h.items = nil
	h.byKey = make(map[string]*leaseItem)
	h.byIdentity = make(map[string]int)
}
