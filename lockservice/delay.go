package lockservice

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// Lock-delay (cluster version 4): a lock freed because its holder failed
// (an Expire of a lock granted with a lock-delay, an ExpireSession of a
// session with one; never a release or a close) leaves its key delayed in
// the replicated state until the leader's ClearDelay. The leader times
// the delay: it arms a key's timer when the failure applies, and a new
// leader arms every delayed key with its FULL delay at LeaderReady, so a
// leader change only ever lengthens a delay, never shortens it.
//
// While a key is delayed the leader counts it busy (waiters.go busy): a
// try gets ErrHeld as a *DelayedError with what is left of the delay on
// this leader's timer, and a waiter waits in the key's queue until the
// ClearDelay applies and hands the key on.
//
// One loop (sessionLoop) watches the earliest session and delay deadline
// and proposes ExpireSession and ClearDelay, at most sessionWorkers at a
// time; like the lease expiry (expiry.go) a timer whose command is lost
// comes due again after ExpireRetry.

// sessionWorkers bounds the ExpireSession and ClearDelay proposals in
// flight.
const sessionWorkers = 16

// DelayedError is a try of a key in its lock-delay. It matches ErrHeld
// (the code clients already handle); Remaining is what is left of the
// delay on the leader's clock.
type DelayedError struct {
	Key       string
	Remaining time.Duration
}

func (e *DelayedError) Error() string {
	return fmt.Sprintf("lockservice: key %q is held: in its lock-delay for %v more (its holder failed)", e.Key, e.Remaining.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrHeld) hold.
func (e *DelayedError) Is(target error) bool { return target == ErrHeld }

// delayedErr is the error of a try of key while it is delayed.
func (s *Service) delayedErr(key string) error {
	s.lead.mu.Lock()
	left, ok := s.lead.sess.delayLeft(key, s.cfg.Now())
	s.lead.mu.Unlock()
	if !ok {
		// The Grant met a delay this leader has not armed yet (it
		// applied in the same batch): its full delay is left.
		var d core.Delay
		s.node.View(func(m *core.Machine) { d, _ = m.Delay(key) })
		left = time.Duration(d.DelayMS) * time.Millisecond
	}
	return &DelayedError{Key: key, Remaining: left}
}

// heldErr is the error of a try of (limit, mode) of a busy key. s.lead.mu
// held.
func (s *Service) heldErr(key string, limit uint32, mode core.Mode) error {
	now := s.cfg.Now()
	if left, ok := s.lead.sess.delayLeft(key, now); ok {
		return &DelayedError{Key: key, Remaining: left}
	}
	if left, ok := s.slotDelayLeft(key, limit, mode, now); ok {
		return &DelayedError{Key: key, Remaining: left}
	}
	return fmt.Errorf("%w: %q", ErrHeld, key)
}

// slotDelayLeft is how long a try of (limit, mode) stays refused by key's
// delayed slots alone (a semaphore's, or a failed reader's for a writer):
// ok false when something else refuses it too (holders, Grants in flight,
// waiters) or a slot's timer is not armed yet. s.lead.mu held.
func (s *Service) slotDelayLeft(key string, limit uint32, mode core.Mode, now time.Time) (time.Duration, bool) {
	v := s.lead.multi[key]
	if v == nil || len(v.slots) == 0 || v.limit != limit {
		return 0, false
	}
	if _, reserved := s.lead.reserved[key]; reserved {
		return 0, false
	}
	if q := s.lead.queues[key]; q != nil && q.len() > 0 {
		return 0, false
	}
	var need int // how many slots must end before it fits
	used := len(v.holders) + len(s.lead.multiRes[key])
	switch {
	case limit > 1 && used < int(limit):
		need = used + len(v.slots) - int(limit) + 1
	case limit <= 1 && mode == core.ModeExclusive && used == 0:
		need = len(v.slots)
	}
	if need <= 0 {
		return 0, false
	}
	lefts := make([]time.Duration, 0, len(v.slots))
	for _, seq := range v.slots {
		t, ok := s.lead.sess.delays[slotRef(key, seq)]
		if !ok {
			return 0, false
		}
		lefts = append(lefts, max(0, t.deadline.Sub(now)))
	}
	slices.Sort(lefts)
	return lefts[need-1], true
}

// sessionHold is the lease timer of a session lock: it has no lease (its
// session's timer ends it), but it is held, so it has a timer in the
// lease table (busy, quotas, release) that never comes due.
const sessionHold = time.Duration(1 << 62)

// holdOf is the lease a lock's timer is armed with.
func holdOf(l core.Lock) time.Duration {
	if l.SessionID != 0 {
		return sessionHold
	}
	return time.Duration(l.LeaseMS) * time.Millisecond
}

// remainingOf is what is left of l's hold on this leader: its lease
// timer, or its session's. s.lead.mu held.
func (s *Service) remainingOf(l core.Lock, now time.Time) time.Duration {
	if l.SessionID != 0 {
		if t, ok := s.lead.sess.byID[l.SessionID]; ok {
			return max(0, t.deadline.Sub(now))
		}
		return 0
	}
	if it, ok := s.lead.leases.get(timerOf(l)); ok && it.token == l.Token {
		return max(0, it.deadline.Sub(now))
	}
	return time.Duration(l.LeaseMS) * time.Millisecond
}

// failureDelays reads, before OnApplied takes lead.mu, the lock-delays an
// applied failure (an Expire or ExpireSession that ended locks) left:
// their sequence numbers are in the applied state. Nil for anything else,
// and on a node that is not (becoming) the leader.
func (s *Service) failureDelays(a raftstore.Applied) []core.Delay {
	var keys []string
	switch {
	case a.Result.Kind == core.ResultExpired && a.Result.Existed:
		keys = []string{a.Command.Key}
	case a.Result.Kind == core.ResultSessionExpired && a.Result.Existed:
		keys = a.Keys
	default:
		return nil
	}
	s.lead.mu.Lock()
	leading := s.lead.ready || s.lead.rearming
	s.lead.mu.Unlock()
	if !leading {
		return nil
	}
	var out []core.Delay
	s.node.View(func(m *core.Machine) {
		for _, k := range keys {
			if d, ok := m.Delay(k); ok {
				out = append(out, d)
			}
		}
	})
	return out
}

// appliedSession keeps the session and delay timers in step with an
// applied session or lock-delay command, or a Grant they refused.
// s.lead.mu held.
func (s *Service) appliedSession(a raftstore.Applied, freed []core.Delay) {
	now := s.cfg.Now()
	st := s.lead.sess
	c := &a.Command
	switch a.Result.Kind {
	case core.ResultSessionOpened:
		st.armSession(a.Result.Session, c.Identity, ms(c.TTLMS), ms(c.LockDelayMS), a.Result.Epoch, now)
	case core.ResultSessionRefreshed:
		if t, ok := st.byID[c.SessionID]; ok {
			st.armSession(t.id, t.identity, t.ttl, t.lockDelay, a.Result.Epoch, now)
		}
	case core.ResultSessionClosed, core.ResultSessionExpired:
		if a.Result.Kind == core.ResultSessionExpired && !a.Result.Existed {
			return // a stale expiry: nothing changed
		}
		st.endSession(c.SessionID)
		for _, d := range freed {
			st.armDelay(d.Key, d.Seq, ms(d.DelayMS), now)
		}
		for _, k := range a.Keys {
			if it, ok := s.lead.leases.get(k); ok {
				s.lead.leases.remove(k, it.token)
			}
			s.handOff(k)
		}
	case core.ResultDelayCleared:
		st.clearDelay(c.Key, c.DelaySeq)
		s.handOff(c.Key)
	case core.ResultDelayed, core.ResultSessionNotFound, core.ResultSessionLocksExhausted:
		if c.Kind == core.KindGrant {
			s.dropReservation(c.Key)
			s.handOff(c.Key)
		}
	default:
		return
	}
	s.signalSessions()
}

func ms(v uint64) time.Duration { return time.Duration(v) * time.Millisecond }

// rearmSessions arms every open session with its full TTL and every
// delayed key with its full delay from now (OnLeaderReady, on the raft
// loop: every entry of earlier terms has applied). s.lead.mu not held.
func (s *Service) rearmSessions(now time.Time) *sessionTimers {
	st := newSessionTimers()
	s.node.View(func(m *core.Machine) {
		m.ForEachSession(func(x core.Session) {
			st.armSession(x.ID, x.Identity, ms(x.TTLMS), ms(x.LockDelayMS), x.Epoch, now)
		})
		m.ForEachDelay(func(d core.Delay) {
			if m.IsMulti(d.Key) { // a delayed slot (kinds.go)
				st.armSlotDelay(d.Key, d.Seq, ms(d.DelayMS), now)
				return
			}
			st.armDelay(d.Key, d.Seq, ms(d.DelayMS), now)
		})
	})
	return st
}

// signalSessions wakes the session loop to recompute its next deadline.
func (s *Service) signalSessions() {
	select {
	case s.sessChanged <- struct{}{}:
	default:
	}
}

// sessionLoop proposes the ExpireSessions and ClearDelays of the timers
// that run out on this leader's clock.
func (s *Service) sessionLoop() {
	defer s.wg.Done()
	sem := make(chan struct{}, sessionWorkers)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		fired, running := s.waitDue(timer, s.sessChanged, func() (time.Time, bool) { return s.lead.sess.next() })
		if !running {
			return
		}
		if !fired {
			continue
		}
		var sessions []sessionDue
		var delays []delayDue
		s.lead.mu.Lock()
		if s.lead.ready {
			sessions, delays = s.lead.sess.due(s.cfg.Now(), s.cfg.ExpireRetry, expireBatch)
		}
		s.lead.mu.Unlock()
		for _, d := range sessions {
			cmd := core.ExpireSession(d.id, d.epoch)
			if !s.proposeBounded(sem, cmd) {
				return
			}
		}
		for _, d := range delays {
			if !s.proposeBounded(sem, core.ClearDelay(d.key, d.seq)) {
				return
			}
		}
	}
}

// proposeBounded proposes cmd on its own goroutine once one of sem's
// slots is free; false when the service closes first.
func (s *Service) proposeBounded(sem chan struct{}, cmd core.Command) bool {
	select {
	case sem <- struct{}{}:
	case <-s.ctx.Done():
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-sem }()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
		defer cancel()
		a, err := s.propose(ctx, cmd)
		if err != nil {
			s.log.Debug("session timer proposal failed; will retry while leader", "cmd", cmd.Kind.String(), "err", err)
			return
		}
		s.log.Debug("session timer ran out", "cmd", cmd.Kind.String(), "result", a.Result.String(), "index", a.Index)
	}()
	return true
}
