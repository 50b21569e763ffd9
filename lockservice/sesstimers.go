package lockservice

import (
	"time"
)

// The leader's session and lock-delay timers (cluster version 4): one per
// open session and one per delayed key, each ordered by deadline in a
// binary heap. They are few next to the lease timers (core bounds both at
// 2^17), so they are plain heap-allocated records; the lease table's
// pointer-free layout (leases.go) is for its million locks.
//
// Like the lease timers they live only on the ready leader, are rebuilt
// from the applied state at LeaderReady (each with its FULL TTL or delay
// from then: never shorter than what a client may assume, core's
// sessions.go), and never decide state: a timer that runs out makes the
// leader propose ExpireSession or ClearDelay, and only the applied
// command changes anything.

// sessTimer is the leader's timer of one open session.
type sessTimer struct {
	id        uint64
	identity  string
	ttl       time.Duration
	lockDelay time.Duration
	// epoch is the session's epoch as last applied (core's: 1 at open, +1
	// per RefreshSession); an ExpireSession names it.
	epoch    uint64
	deadline time.Time
	// expiring is set when the timer ran out and an ExpireSession was
	// proposed, and stays set until a RefreshSession applies (which makes
	// every expiry in flight stale) or the session ends: meanwhile a
	// keepalive is logged instead of acknowledged from the timer
	// (keepalive, rule 3 of core's sessions.go).
	expiring bool
	at       int // position in the heap
}

// delayTimer is the leader's timer of one key in its lock-delay.
type delayTimer struct {
	key      string
	seq      uint64
	delay    time.Duration
	deadline time.Time
	at       int
}

// timed is what timerHeap orders.
type timed interface {
	*sessTimer | *delayTimer
}

// timerHeap is a binary min-heap of timers by deadline; each timer knows
// its position (at) so that a refreshed one is fixed in O(log n).
type timerHeap[T timed] struct {
	items    []T
	deadline func(T) time.Time
	setAt    func(T, int)
	getAt    func(T) int
}

func newSessHeap() timerHeap[*sessTimer] {
	return timerHeap[*sessTimer]{
		deadline: func(t *sessTimer) time.Time { return t.deadline },
		setAt:    func(t *sessTimer, i int) { t.at = i },
		getAt:    func(t *sessTimer) int { return t.at },
	}
}

func newDelayHeap() timerHeap[*delayTimer] {
	return timerHeap[*delayTimer]{
		deadline: func(t *delayTimer) time.Time { return t.deadline },
		setAt:    func(t *delayTimer, i int) { t.at = i },
		getAt:    func(t *delayTimer) int { return t.at },
	}
}

func (h *timerHeap[T]) len() int { return len(h.items) }

func (h *timerHeap[T]) push(t T) {
	h.setAt(t, len(h.items))
	h.items = append(h.items, t)
	h.up(len(h.items) - 1)
}

// peek is the timer with the earliest deadline; ok false when empty.
func (h *timerHeap[T]) peek() (t T, ok bool) {
	if len(h.items) == 0 {
		return t, false
	}
	return h.items[0], true
}

func (h *timerHeap[T]) remove(t T) {
	i := h.getAt(t)
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	var zero T
	h.items[last] = zero
	h.items = h.items[:last]
	if i != last {
		h.fix(i)
	}
}

// fix restores the order after t's deadline changed.
func (h *timerHeap[T]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *timerHeap[T]) less(i, j int) bool {
	return h.deadline(h.items[i]).Before(h.deadline(h.items[j]))
}

func (h *timerHeap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.setAt(h.items[i], i)
	h.setAt(h.items[j], j)
}

func (h *timerHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap[T]) down(i int) bool {
	start := i
	for {
		c := 2*i + 1
		if c >= len(h.items) {
			break
		}
		if c+1 < len(h.items) && h.less(c+1, c) {
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

// sessionTimers is the leader's session and lock-delay state. Not safe for
// concurrent use: the service holds lead.mu.
type sessionTimers struct {
	byID     map[uint64]*sessTimer
	sessHeap timerHeap[*sessTimer]
	delays   map[string]*delayTimer
	delHeap  timerHeap[*delayTimer]
	// opening counts the OpenSessions in flight, in all and by identity,
	// so that the quotas count them before they apply.
	opening   int
	openingBy map[string]int
}

func newSessionTimers() *sessionTimers {
	return &sessionTimers{
		byID: make(map[uint64]*sessTimer), sessHeap: newSessHeap(),
		delays: make(map[string]*delayTimer), delHeap: newDelayHeap(),
		openingBy: make(map[string]int),
	}
}

// armSession starts (or restarts, for a new epoch) session id's timer at
// now + ttl. A timer of the same epoch is only ever moved later.
func (st *sessionTimers) armSession(id uint64, identity string, ttl, lockDelay time.Duration, epoch uint64, now time.Time) {
	deadline := now.Add(ttl)
	if t, ok := st.byID[id]; ok {
		if epoch > t.epoch {
			t.epoch, t.expiring = epoch, false
		}
		if deadline.After(t.deadline) {
			t.deadline = deadline
			st.sessHeap.fix(t.at)
		}
		return
	}
	t := &sessTimer{id: id, identity: identity, ttl: ttl, lockDelay: lockDelay, epoch: epoch, deadline: deadline}
	st.byID[id] = t
	st.sessHeap.push(t)
}

// refresh restarts session id's timer at now + its TTL for a keepalive
// that is not logged. It refuses (false) when the session has no timer,
// or an expiry of it is in flight: that keepalive must be logged
// (keepalive in sessions.go).
func (st *sessionTimers) refresh(id uint64, now time.Time) (ttl time.Duration, ok bool) {
	t, found := st.byID[id]
	if !found || t.expiring {
		return 0, false
	}
	if d := now.Add(t.ttl); d.After(t.deadline) {
		t.deadline = d
		st.sessHeap.fix(t.at)
	}
	return t.ttl, true
}

func (st *sessionTimers) endSession(id uint64) (*sessTimer, bool) {
	t, ok := st.byID[id]
	if ok {
		st.sessHeap.remove(t)
		delete(st.byID, id)
	}
	return t, ok
}

// armDelay starts key's lock-delay timer at now + delay for the delay
// numbered seq; one for the same seq is only ever moved later.
func (st *sessionTimers) armDelay(key string, seq uint64, delay time.Duration, now time.Time) {
	deadline := now.Add(delay)
	if t, ok := st.delays[key]; ok {
		if t.seq == seq && !deadline.After(t.deadline) {
			return
		}
		if t.seq != seq {
			t.seq, t.delay = seq, delay
		}
		t.deadline = deadline
		st.delHeap.fix(t.at)
		return
	}
	t := &delayTimer{key: key, seq: seq, delay: delay, deadline: deadline}
	st.delays[key] = t
	st.delHeap.push(t)
}

// armSlotDelay starts the lock-delay timer of a delayed slot of a
// multi-holder key (kinds.go), numbered seq, at now + delay, unless it has
// one already. A key may have several delayed slots: each is timed under
// slotRef(key, seq); the timer carries the key, for ClearDelay.
func (st *sessionTimers) armSlotDelay(key string, seq uint64, delay time.Duration, now time.Time) {
	ref := slotRef(key, seq)
	if _, ok := st.delays[ref]; ok {
		return
	}
	t := &delayTimer{key: key, seq: seq, delay: delay, deadline: now.Add(delay)}
	st.delays[ref] = t
	st.delHeap.push(t)
}

// slotRef is the delays' map key of a delayed slot: its key, a NUL (never
// in a key) and its sequence number.
func slotRef(key string, seq uint64) string { return timerKey(key, seq, true) }

// clearDelay drops the timer of key's delay, or of its delayed slot, for
// seq.
func (st *sessionTimers) clearDelay(key string, seq uint64) {
	if t, ok := st.delays[key]; ok && t.seq == seq {
		st.delHeap.remove(t)
		delete(st.delays, key)
		return
	}
	ref := slotRef(key, seq)
	if t, ok := st.delays[ref]; ok {
		st.delHeap.remove(t)
		delete(st.delays, ref)
	}
}

// delayLeft is how long key stays delayed by the leader's timer; ok false
// when it is not delayed.
func (st *sessionTimers) delayLeft(key string, now time.Time) (time.Duration, bool) {
	t, ok := st.delays[key]
	if !ok {
		return 0, false
	}
	return max(0, t.deadline.Sub(now)), true
}

// next is the earliest deadline of any timer; ok false when there is none.
func (st *sessionTimers) next() (time.Time, bool) {
	s, sok := st.sessHeap.peek()
	d, dok := st.delHeap.peek()
	switch {
	case sok && dok:
		if d.deadline.Before(s.deadline) {
			return d.deadline, true
		}
		return s.deadline, true
	case sok:
		return s.deadline, true
	case dok:
		return d.deadline, true
	}
	return time.Time{}, false
}

// sessionDue is an ExpireSession to propose; delayDue a ClearDelay.
type sessionDue struct{ id, epoch uint64 }

type delayDue struct {
	key string
	seq uint64
}

// due returns up to limit sessions and delays whose deadline is at or
// before now. Each one is pushed back by retry, so that one whose command
// is lost comes due again (pushing a deadline later never shortens
// anything); a returned session is marked expiring.
func (st *sessionTimers) due(now time.Time, retry time.Duration, limit int) (sessions []sessionDue, delays []delayDue) {
	for len(sessions)+len(delays) < limit {
		t, ok := st.sessHeap.peek()
		if !ok || t.deadline.After(now) {
			break
		}
		t.expiring = true
		sessions = append(sessions, sessionDue{id: t.id, epoch: t.epoch})
		t.deadline = now.Add(retry)
		st.sessHeap.fix(0)
	}
	for len(sessions)+len(delays) < limit {
		t, ok := st.delHeap.peek()
		if !ok || t.deadline.After(now) {
			break
		}
		delays = append(delays, delayDue{key: t.key, seq: t.seq})
		t.deadline = now.Add(retry)
		st.delHeap.fix(0)
	}
	return sessions, delays
}
