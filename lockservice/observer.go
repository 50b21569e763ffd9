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
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !s.lead.ready {
		return
	}
	key := a.Command.Key
	switch a.Result.Kind {
	case core.ResultGranted:
		s.dropReservation(key)
		s.lead.leases.arm(key, a.Result.Token, a.Command.Identity, time.Duration(a.Command.LeaseMS)*time.Millisecond, s.cfg.Now())
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
		s.applyRenewed(key, a.Command.Token, a.LeaseMS, a.Command.LeaseMS)
	case core.ResultReleased:
		s.lead.leases.remove(key, a.Command.Token)
		s.handOff(key)
	case core.ResultExpired:
		if a.Result.Existed {
			s.lead.leases.remove(key, a.Command.Token)
			s.handOff(key)
		}
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
	}
}

// OnLeaderReady implements raftstore.Observer: re-arm every held lock with
// its full lease (never shorter than what its holder may assume) and start
// serving.
func (s *Service) OnLeaderReady(term uint64) {
	// The timers are rebuilt in a table of their own, without lead.mu (the
	// service is not ready yet, so nothing else reads them), and swapped
	// in: one pass over the machine, no allocation per lock, the heap
	// ordered once at the end (leases.go). Unsorted: the order of arming
	// does not matter, and sorting a large table here would hold up the
	// raft loop that calls us.
	start, now := time.Now(), s.cfg.Now()
	leases := newLeaseTable()
	held := 0
	s.node.View(func(m *core.Machine) {
		held = m.Len()
		leases.load(now, held, func(add func(key string, token uint64, identity string, leaseMS uint64)) {
			m.ForEachLock(func(l core.Lock) { add(l.Key, l.Token, l.Identity, l.LeaseMS) })
		})
	})
	s.lead.mu.Lock()
	s.lead.leases = leases
	s.lead.reserved = make(map[string]reservation)
	s.lead.reservedBy = make(map[string]int)
	s.resetWaits()
	s.lead.requests = make(map[[32]byte]*reqAttempt)
	s.resetSettling()
	s.lead.epoch++
	s.lead.ready = true
	s.signalTimersChanged()
	s.lead.mu.Unlock()
	s.cfg.Metrics.HeldLocks.Set(float64(held))
	s.cfg.Metrics.LeaderChanges.Inc()
	s.cfg.Metrics.IsLeader.Set(1)
	s.log.Info("leader ready; lease timers re-armed", "term", term, "locks", held, "took", time.Since(start))
}

// OnLeadershipLost implements raftstore.Observer: every queued waiter gets
// a retryable not-leader error at once.
func (s *Service) OnLeadershipLost() {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	was := s.lead.ready
	s.lead.ready = false
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
	s.lead.leases.reset()
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
