package lockservice

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// OnApplied implements raftstore.Observer. The leader tracks lease timers
// and frees keys for waiters; followers keep no state.
func (s *Service) OnApplied(a raftstore.Applied) {
	s.countApplied(a.Result)
	freed := s.failureDelays(a) // before lead.mu: they read the machine
	kinds := s.readKinds(a)
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !s.lead.ready && !s.lead.rearming {
		return
	}
	if kinds != nil {
		s.applyKinds(kinds)
	}
	key := a.Command.Key
	if s.appliedKindGrant(a) {
		return // its holder's timer is armed by applyKinds
	}
	switch a.Result.Kind {
	case core.ResultGranted:
		s.dropReservation(key)
		s.lead.leases.arm(key, a.Result.Token, a.Command.Identity, holdOf(core.Lock{LeaseMS: a.Command.LeaseMS, SessionID: a.Command.SessionID}), s.cfg.Now())
		s.signalTimersChanged()
	case core.ResultGrantRejected:
		s.dropReservation(key)
	case core.ResultGrantRepeated, core.ResultGrantEnded, core.ResultRequestMismatch, core.ResultRequestsExhausted:
		// A Grant with a request id that found its request recorded, or
		// no room: nothing changed, and the key may be free.
		if a.Command.Kind == core.KindGrant {
			s.dropReservation(key)
			s.handOff(key)
		}
	case core.ResultRenewed:
		s.applyRenewed(s.heldTimer(key, a.Command.Token), a.Command.Token, a.LeaseMS, a.Command.LeaseMS)
	case core.ResultReleased:
		tok := a.Command.Token
		if a.Command.Kind == core.KindSettle {
			tok = a.Result.Token // a Settle names the request, not the token
		}
		s.lead.leases.remove(key, tok) // a holder's timer: applyKinds
		s.handOff(key)
	case core.ResultExpired:
		if a.Result.Existed {
			s.lead.leases.remove(key, a.Command.Token)
			for _, d := range freed {
				s.lead.sess.armDelay(d.Key, d.Seq, ms(d.DelayMS), s.cfg.Now())
				s.signalSessions()
			}
			s.handOff(key)
		}
	default:
		s.appliedSession(a, freed)
	}
}

func (s *Service) countApplied(r core.Result) {
	m := s.cfg.Metrics
	switch r.Kind {
	case core.ResultGranted:
		m.Grants.Inc()
		m.HeldLocks.Inc()
	case core.ResultReleased:
		m.Releases.Inc()
		m.HeldLocks.Dec()
	case core.ResultRenewed:
		m.Renewals.Inc()
	case core.ResultExpired:
		m.Expiries.WithLabelValues(fmt.Sprint(r.Existed)).Inc()
		if r.Existed {
			m.HeldLocks.Dec()
		}
	case core.ResultSessionClosed, core.ResultSessionExpired:
		m.HeldLocks.Sub(float64(r.Count))
	}
}

// OnLeaderReady implements raftstore.Observer: re-arm every held lock with
// its full lease (never shorter than what its holder may assume) and start
// serving.
//
// It runs on the raft loop, which must keep ticking: a loop that stalls
// for an election timeout loses the leadership it just won (run C of
// docs/benchmarks.md: 1.3 s re-arming a million locks on a busy machine,
// and the followers elected another leader). So a table of up to
// RearmChunk locks is re-armed here, at once; a larger one by rearm, off
// the loop, RearmChunk table positions at a time under the machine's read
// lock, while the loop goes on applying. Until it is done the service is
// not ready (requests are refused as not leader, clients retry) but
// OnApplied already keeps the timers it built in step with every applied
// change; see rearm for why the two together end with exactly one timer
// per held lock.
func (s *Service) OnLeaderReady(term uint64) {
	start, now := time.Now(), s.cfg.Now()
	held := 0
	s.node.View(func(m *core.Machine) { held = m.Len() })
	sess := s.rearmSessions(now)
	s.lead.mu.Lock()
	s.lead.leases = newLeaseTableFor(held)
	s.lead.sess = sess
	s.lead.reserved = make(map[string]reservation)
	s.lead.reservedBy = make(map[string]int)
	s.lead.multi = make(map[string]*kindView)
	s.lead.multiRes = make(map[string][]multiReservation)
	s.lead.multiResN = 0
	s.resetWaits()
	s.lead.requests = make(map[[32]byte]*reqAttempt)
	s.resetSettling()
	s.lead.epoch++
	epoch := s.lead.epoch
	s.lead.rearming = true
	s.lead.mu.Unlock()
	if held <= s.cfg.RearmChunk {
		s.rearm(term, epoch, start, now)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.rearm(term, epoch, start, now)
	}()
}

// rearm arms a timer for every lock in the machine at now + its lease, in
// steps of RearmChunk table positions, then makes the service ready. It
// gives up when the leadership it started for (epoch) ends or the service
// closes.
//
// Why the timers end up exactly those of the held locks, although the
// loop applies commands between the steps: a step arms what the machine
// holds at that moment, under the machine's read lock and lead.mu; the
// loop changes the machine under its write lock and tells OnApplied
// afterwards, which (while rearming) arms, removes and extends as it does
// for a ready leader. A lock held throughout is visited once
// (Machine.ForEachLockFrom) and armed; one granted meanwhile is armed by
// OnApplied, whether or not a step also saw it (arm with the same token
// only keeps the later deadline); one released meanwhile is removed by
// OnApplied after any step that saw it, since the notice follows the
// change; a step that sees a key held with a newer token replaces the
// older timer, whose own release notice then finds nothing to remove (a
// step arms its locks in one armBatch, which leaves the timers arming them
// one by one would). A deadline of now (this leader's start) + the lease
// is never shorter than what a holder may assume: it was told its lease
// before this leader's term began.
func (s *Service) rearm(term, epoch uint64, start, now time.Time) {
	next, done := 0, false
	var reqs, scratch []armReq
	for !done {
		if s.ctx.Err() != nil {
			return
		}
		stale := false
		s.node.View(func(m *core.Machine) {
			s.lead.mu.Lock()
			defer s.lead.mu.Unlock()
			if s.lead.epoch != epoch {
				stale = true
				return
			}
			if next == 0 {
				s.rearmKinds(m, now) // few keys next to the table: at once
			}
			// In one batch (armBatch: the index probes in order); the
			// keys alias the machine's memory, so the batch ends here.
			next, done = m.ForEachLockFrom(next, s.cfg.RearmChunk, func(l core.Lock) {
				reqs = append(reqs, armReq{key: l.Key, identity: l.Identity, token: l.Token, lease: holdOf(l)})
			})
			scratch = s.lead.leases.armBatch(reqs, now, scratch)
			clear(reqs)
			reqs = reqs[:0]
		})
		if stale {
			return
		}
	}
	s.lead.mu.Lock()
	if s.lead.epoch != epoch {
		s.lead.mu.Unlock()
		return
	}
	held := s.lead.leases.Len()
	s.lead.rearming = false
	s.lead.ready = true
	s.signalTimersChanged()
	s.signalSessions()
	s.lead.mu.Unlock()
	s.cfg.Metrics.HeldLocks.Set(float64(held))
	s.cfg.Metrics.LeaderChanges.Inc()
	s.cfg.Metrics.IsLeader.Set(1)
	s.log.Info("leader ready; lease timers re-armed", "term", term, "locks", held, "took", time.Since(start))
	if s.cfg.OnReady != nil {
		s.cfg.OnReady()
	}
}

// OnLeadershipLost implements raftstore.Observer: every queued waiter gets
// a retryable not-leader error at once.
func (s *Service) OnLeadershipLost() {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	was := s.lead.ready
	s.lead.ready = false
	s.lead.rearming = false
	s.lead.epoch++
	for key, q := range s.lead.queues {
		for w := q.pop(); w != nil; w = q.pop() {
			close(w.lost)
		}
		delete(s.lead.queues, key)
	}
	s.lead.waiters = 0
	s.lead.waitersBy = make(map[string]int)
	s.cfg.Metrics.Waiters.Set(0)
	s.resetWaits()
	s.lead.requests = make(map[[32]byte]*reqAttempt)
	s.resetSettling()
	s.lead.reserved = make(map[string]reservation)
	s.lead.reservedBy = make(map[string]int)
	s.lead.multi = make(map[string]*kindView)
	s.lead.multiRes = make(map[string][]multiReservation)
	s.lead.multiResN = 0
	s.lead.leases.reset()
	s.lead.sess = newSessionTimers()
	if was {
		s.cfg.Metrics.LeaderChanges.Inc()
		s.cfg.Metrics.IsLeader.Set(0)
		s.log.Info("leadership lost; waiters failed")
	}
}

// OnRestored implements raftstore.Observer.
func (s *Service) OnRestored(index uint64) {
	var n int
	s.node.View(func(m *core.Machine) { n = m.Len() })
	s.cfg.Metrics.HeldLocks.Set(float64(n))
}

// OnConfChange implements raftstore.Observer.
func (s *Service) OnConfChange(cc raftpb.ConfChangeV2, cs raftpb.ConfState) {}
