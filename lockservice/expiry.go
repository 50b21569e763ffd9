package lockservice

import (
	"context"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Expiry: one loop watches the earliest lease deadline, and a fixed pool
// of ExpireWorkers goroutines proposes the Expires of the leases that ran
// out. No goroutine is started per lease, so a mass expiry (every lease
// of a burst of clients running out at once) costs a bounded number of
// goroutines and proposals in flight, never one of each per lock.
//
// The proposals still go out in batches: raft appends every proposal that
// arrives while the previous Ready is being written to the next Ready, so
// the workers' Expires share one log write and one fsync (raftstore
// records how many per batch in ticketd_apply_batch_entries).
//
// Backpressure: the loop hands at most expireBatch due leases at a time to
// the workers' queue and waits for room; a due lease is pushed back by
// ExpireRetry when taken (leaseTable.due), so one whose Expire is lost or
// still queued comes due again rather than being forgotten.

// ExpireWorkersDefault is how many Expire proposals are in flight at most.
const ExpireWorkersDefault = 64

// expireBatch bounds how many due leases the loop takes at once.
const expireBatch = 256

// signalTimersChanged wakes the expiry loop to recompute its next deadline.
func (s *Service) signalTimersChanged() {
	select {
	case s.timersChanged <- struct{}{}:
	default:
	}
}

// startExpiry starts the expiry loop and its workers.
func (s *Service) startExpiry() {
	s.wg.Add(2 + s.cfg.ExpireWorkers)
	go s.expiryLoop()
	go s.sessionLoop()
	for i := 0; i < s.cfg.ExpireWorkers; i++ {
		go s.expireWorker()
	}
}

// waitDue waits, on timer, until the earliest deadline next reports
// (called under lead.mu; waited for only while this node is the ready
// leader) has passed: fired. A signal on changed (the earliest deadline
// may have moved) ends the wait early, not fired; running is false once
// the service stops.
func (s *Service) waitDue(timer *time.Timer, changed <-chan struct{}, next func() (time.Time, bool)) (fired, running bool) {
	s.lead.mu.Lock()
	at, ok := next()
	leader := s.lead.ready
	s.lead.mu.Unlock()
	wait := time.Hour
	if ok && leader {
		wait = max(0, at.Sub(s.cfg.Now()))
	}
	timer.Reset(wait)
	select {
	case <-s.ctx.Done():
		return false, false
	case <-changed:
		// Go ≥1.23 timers: Stop then Reset never delivers a stale tick.
		timer.Stop()
		return false, true
	case <-timer.C:
		return true, true
	}
}

// expiryLoop hands every lease that runs out on this leader's clock to
// the expire workers.
func (s *Service) expiryLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		fired, running := s.waitDue(timer, s.timersChanged, func() (time.Time, bool) { return s.lead.leases.next() })
		if !running {
			return
		}
		if !fired {
			continue
		}
		s.lead.mu.Lock()
		var due []leaseItem
		if s.lead.ready {
			due = s.lead.leases.due(s.cfg.Now(), s.cfg.ExpireRetry, expireBatch)
		}
		s.lead.mu.Unlock()
		for _, it := range due {
			select {
			case s.expireq <- it:
			case <-s.ctx.Done():
				return
			}
		}
	}
}

// expireWorker proposes the Expires the loop hands it, one at a time.
func (s *Service) expireWorker() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case it := <-s.expireq:
			s.expire(lockKeyOf(it.key), it.token) // a holder's timer key names its token
		}
	}
}

func (s *Service) expire(key string, token uint64) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
	defer cancel()
	a, err := s.propose(ctx, core.Expire(key, token))
	if err != nil {
		s.log.Debug("expire proposal failed; will retry while leader", "key", key, "token", token, "err", err)
		return
	}
	s.log.Debug("lease expired", "key", key, "token", token, "existed", a.Result.Existed, "index", a.Index)
}
