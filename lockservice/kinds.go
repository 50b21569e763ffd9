package lockservice

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// Counting semaphores and read/write locks on the leader (cluster version
// 5; core/kinds.go has the replicated rules).
//
// An acquire names its kind with Limit (0 or 1: a mutex; 2..
// core.MaxSemaphoreLimit: a semaphore slot) and Mode (exclusive, the
// default, or shared). Core decides every grant; the leader decides when
// to propose one, and in which order, from its view of each multi-holder
// key (kindView), which it reads from the applied machine whenever an
// applied command may have changed the key (readKinds, before lead.mu:
// the machine's lock comes first) and then holds under lead.mu.
//
// Order (docs/protocol.md §"Semaphores and read/write locks"): one FIFO
// queue per key for every kind. A request is proposed at once only when
// the key's queue is empty and the request fits beside the key's holders,
// delayed slots and the Grants in flight; otherwise a try answers held and
// an acquire that waits joins the back of the queue. The head of the
// queue is handed the key as soon as it fits; nobody behind it is served
// before it. So a waiting exclusive request is never overtaken by later
// shared ones (Curator's rule): a shared try while an exclusive waiter is
// queued answers held even though the key is held only shared.
//
// Each holder of a multi-holder key has its own lease timer, in the one
// lease table under timerKey(key, token), so expiry, renewal, release and
// the lost-reply path work per holder token as they do per key.

// kindView is the leader's view of one multi-holder key.
type kindView struct {
	limit   uint32
	mode    core.Mode
	holders []uint64 // tokens, in token order
	slots   []uint64 // delayed slots' sequence numbers
}

// multiKind reports whether a lock of this kind has holders beside it
// (core.isMulti).
func multiKind(limit uint32, mode core.Mode) bool { return limit > 1 || mode == core.ModeShared }

// keyLimit is the limit the wire names for a key: 1 for a mutex or a
// read/write lock, N for a semaphore.
func keyLimit(limit uint32) uint32 { return max(1, limit) }

// timerKey is the lease table's key of a timer: the lock's key for a mutex
// or exclusive lock, the key, a NUL (never in a key: core.ValidateKey) and
// the token for a holder of a multi-holder key.
func timerKey(key string, token uint64, multi bool) string {
	if !multi {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 9)
	b.WriteString(key)
	b.WriteByte(0)
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], token)
	b.Write(t[:])
	return b.String()
}

// lockKeyOf is the lock's key of a timer key.
func lockKeyOf(tk string) string {
	if i := strings.IndexByte(tk, 0); i >= 0 {
		return tk[:i]
	}
	return tk
}

// timerOf is the lease table's key of l's timer.
func timerOf(l core.Lock) string { return timerKey(l.Key, l.Token, multiKind(l.Limit, l.Mode)) }

// heldTimer is the timer key of (key, token) as the leader knows it: a
// holder of a multi-holder key, or the key's lock. s.lead.mu held.
func (s *Service) heldTimer(key string, token uint64) string {
	if v := s.lead.multi[key]; v != nil {
		if _, found := slices.BinarySearch(v.holders, token); found {
			return timerKey(key, token, true)
		}
	}
	return key
}

// limitMismatch is the error of an acquire of a key held (or waited for)
// as another kind: invalid_argument naming the key's current limit (1: a
// mutex or read/write lock).
func limitMismatch(key string, limit, asked uint32) error {
	return &core.Error{Code: core.CodeInvalidArgument, Detail: fmt.Sprintf(
		"key %q has limit %d, the acquire asked for limit %d: every holder and waiter of a key names the same limit", key, limit, keyLimit(asked))}
}

// multiReservation is a Grant of a multi-holder kind in flight: a key may
// have several (a semaphore's free slots, shared holds), up to its room.
type multiReservation struct {
	epoch    uint64
	identity string
}

// reserveMulti reserves room on key for a Grant of identity in epoch.
// s.lead.mu held.
func (s *Service) reserveMulti(key string, epoch uint64, identity string) {
	s.lead.multiRes[key] = append(s.lead.multiRes[key], multiReservation{epoch: epoch, identity: identity})
	s.lead.multiResN++
	s.lead.reservedBy[identity]++
}

// dropMulti forgets one reservation on key of identity (of epoch, when not
// 0); it reports whether there was one. s.lead.mu held.
func (s *Service) dropMulti(key, identity string, epoch uint64) bool {
	rs := s.lead.multiRes[key]
	for i, r := range rs {
		if r.identity != identity || (epoch != 0 && r.epoch != epoch) {
			continue
		}
		rs = slices.Delete(rs, i, i+1)
		if len(rs) == 0 {
			delete(s.lead.multiRes, key)
		} else {
			s.lead.multiRes[key] = rs
		}
		s.lead.multiResN--
		if n := s.lead.reservedBy[identity] - 1; n > 0 {
			s.lead.reservedBy[identity] = n
		} else {
			delete(s.lead.reservedBy, identity)
		}
		return true
	}
	return false
}

// reserveKind reserves key for a Grant of its kind. s.lead.mu held.
func (s *Service) reserveKind(key string, limit uint32, mode core.Mode, epoch uint64, identity string) {
	if multiKind(limit, mode) {
		s.reserveMulti(key, epoch, identity)
		return
	}
	s.reserve(key, epoch, identity)
}

// unreserveKind drops the reservation epoch made on key for a Grant of
// this kind and identity, and hands the key on. s.lead.mu held.
func (s *Service) unreserveKind(key string, limit uint32, mode core.Mode, epoch uint64, identity string) {
	if !multiKind(limit, mode) {
		s.unreserve(key, epoch)
		return
	}
	if s.dropMulti(key, identity, epoch) {
		s.handOff(key)
	}
}

// fits reports whether a Grant of (limit, mode) on key would be proposed
// now, leaving the queue aside: it fits beside the key's holders, delayed
// slots and Grants in flight as the leader knows them. mismatch is the
// key's current limit when the request names another one (0: none).
// s.lead.mu held.
func (s *Service) fits(key string, limit uint32, mode core.Mode) (ok bool, mismatch uint32) {
	_, reserved := s.lead.reserved[key]
	inflight := len(s.lead.multiRes[key])
	if v := s.lead.multi[key]; v != nil {
		if v.limit != limit {
			return false, keyLimit(v.limit)
		}
		used := len(v.holders) + len(v.slots) + inflight
		switch {
		case reserved:
			return false, 0
		case limit > 1:
			return used < int(limit), 0
		case mode == core.ModeExclusive:
			return used == 0, 0
		}
		// A full shared key is core's bound (ResultHoldersExhausted):
		// proposed, and refused as resource_exhausted, not waited for.
		return true, 0
	}
	_, held := s.lead.leases.get(key)
	_, delayed := s.lead.sess.delays[key]
	if limit > 1 && (held || delayed) {
		return false, 1
	}
	if held || delayed || reserved {
		return false, 0
	}
	if inflight == 0 {
		return true, 0
	}
	// Only Grants in flight, of the multi-holder kind they name: a
	// semaphore's (up to its limit) or shared ones.
	switch {
	case limit > 1:
		return inflight < int(limit), 0
	case mode == core.ModeShared:
		return true, 0
	}
	return false, 0
}

// admitKind decides at once whether a Grant of (limit, mode) may be
// proposed for key now: only if its queue is empty and it fits (fits). A
// request that names another limit than the key's holders or the waiters
// ahead of it gets invalid_argument (limitMismatch). s.lead.mu held.
func (s *Service) admitKind(key string, limit uint32, mode core.Mode) (bool, error) {
	ok, mismatch := s.fits(key, limit, mode)
	if q := s.lead.queues[key]; q != nil && q.len() > 0 {
		if head := q.front(); mismatch == 0 && head.limit != limit {
			mismatch = keyLimit(head.limit)
		}
		ok = false
	}
	if mismatch != 0 {
		return false, limitMismatch(key, mismatch, limit)
	}
	return ok, nil
}

// kindRead is a multi-holder key as the applied machine has it (found
// false: the key is not one now).
type kindRead struct {
	key   string
	kh    core.KeyHolders
	found bool
}

// readKinds reads, before OnApplied takes lead.mu, the multi-holder keys
// an applied command may have changed: the key of a Grant of a
// multi-holder kind, and any key the leader knows as one that the command
// names. Nil on a node that is not (becoming) the leader and for commands
// that change no multi-holder key.
func (s *Service) readKinds(a raftstore.Applied) []kindRead {
	c := &a.Command
	var keys []string
	s.lead.mu.Lock()
	switch {
	case !s.lead.ready && !s.lead.rearming:
	case c.Kind == core.KindGrant && multiKind(c.Limit, c.Mode):
		keys = []string{c.Key}
	case len(s.lead.multi) == 0:
	case c.Kind == core.KindRelease, c.Kind == core.KindExpire, c.Kind == core.KindClearDelay, c.Kind == core.KindSettle:
		if s.lead.multi[c.Key] != nil {
			keys = []string{c.Key}
		}
	case a.Result.Kind == core.ResultSessionClosed, a.Result.Kind == core.ResultSessionExpired:
		for _, k := range a.Keys {
			if s.lead.multi[k] != nil && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	s.lead.mu.Unlock()
	if len(keys) == 0 {
		return nil
	}
	out := make([]kindRead, len(keys))
	s.node.View(func(m *core.Machine) {
		for i, k := range keys {
			out[i].key = k
			out[i].kh, out[i].found = m.KeyHolders(k)
		}
	})
	return out
}

// applyKinds brings the leader's view of each key read to the machine's:
// a timer armed for each new holder and removed for each gone one, a
// lock-delay timer for each new delayed slot, and the key handed to its
// waiters that now fit. s.lead.mu held.
func (s *Service) applyKinds(reads []kindRead) {
	now := s.cfg.Now()
	for _, r := range reads {
		old := s.lead.multi[r.key]
		var v *kindView
		if r.found {
			v = &kindView{limit: r.kh.Limit, mode: r.kh.Mode}
			for _, l := range r.kh.Holders {
				v.holders = append(v.holders, l.Token)
				if old == nil || !slices.Contains(old.holders, l.Token) {
					s.lead.leases.arm(timerOf(l), l.Token, l.Identity, holdOf(l), now)
					s.signalTimersChanged()
				}
			}
			for _, d := range r.kh.Delays {
				v.slots = append(v.slots, d.Seq)
				if old == nil || !slices.Contains(old.slots, d.Seq) {
					s.lead.sess.armSlotDelay(d.Key, d.Seq, ms(d.DelayMS), now)
					s.signalSessions()
				}
			}
		}
		if old != nil {
			for _, t := range old.holders {
				if v == nil || !slices.Contains(v.holders, t) {
					s.lead.leases.remove(timerKey(r.key, t, true), t)
				}
			}
			for _, seq := range old.slots {
				if v == nil || !slices.Contains(v.slots, seq) {
					s.lead.sess.clearDelay(r.key, seq)
				}
			}
		}
		if v == nil {
			delete(s.lead.multi, r.key)
		} else {
			s.lead.multi[r.key] = v
		}
		s.handOff(r.key)
	}
}

// appliedKindGrant keeps the reservations of an applied Grant of a
// multi-holder kind; it reports whether the Grant was one. s.lead.mu held.
func (s *Service) appliedKindGrant(a raftstore.Applied) bool {
	c := &a.Command
	if c.Kind != core.KindGrant || !multiKind(c.Limit, c.Mode) {
		return false
	}
	s.dropMulti(c.Key, c.Identity, 0)
	s.handOff(c.Key)
	return true
}

// rearmKinds builds a new leader's view of every multi-holder key and arms
// a timer for each holder (OnLeaderReady; s.lead.mu held, under the
// machine's read lock). Delayed slots are armed with the sessions
// (rearmSessions).
func (s *Service) rearmKinds(m *core.Machine, now time.Time) {
	for _, kh := range m.MultiKeys() {
		v := &kindView{limit: kh.Limit, mode: kh.Mode}
		for _, l := range kh.Holders {
			v.holders = append(v.holders, l.Token)
			s.lead.leases.arm(timerOf(l), l.Token, l.Identity, holdOf(l), now)
		}
		for _, d := range kh.Delays {
			v.slots = append(v.slots, d.Seq)
		}
		s.lead.multi[kh.Key] = v
	}
}

// kindGrantErr is the error of a Grant that applied as a refusal of its
// kind; ok false for any other result.
func (s *Service) kindGrantErr(p AcquireParams, r core.Result) (err error, ok bool) {
	switch r.Kind {
	case core.ResultLimitMismatch:
		return limitMismatch(p.Key, r.Limit, p.Limit), true
	case core.ResultHoldersExhausted:
		return s.refuse(&LimitError{Resource: ResourceKeyHolders, Limit: core.MaxHoldersPerKey}), true
	}
	return nil, false
}

// Waiting is the number of acquires queued for key on this leader (0 on a
// follower): what tests and operators read to see a queue's length.
func (s *Service) Waiting(key string) int {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if q := s.lead.queues[key]; q != nil {
		return q.len()
	}
	return 0
}
