package lockservice

import (
	"context"
	"time"

	"github.com/ticketd/ticketd/core"
)

// signalTimersChanged wakes the expiry loop to recompute its next deadline.
func (s *Service) signalTimersChanged() {
	select {
	case s.timersChanged <- struct{}{}:
	default:
	}
}

// expiryLoop proposes Expire for every lease that runs out on this
// leader's clock.
func (s *Service) expiryLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.lead.mu.Lock()
		next, ok := s.lead.leases.next()
		leader := s.lead.ready
		s.lead.mu.Unlock()
		wait := time.Hour
		if ok && leader {
			wait = max(0, next.Sub(s.cfg.Now()))
		}
		timer.Reset(wait)
		select {
		case <-s.ctx.Done():
			return
		case <-s.timersChanged:
			// Go ≥1.23 timers: Stop then Reset never delivers a stale tick.
			timer.Stop()
			continue
		case <-timer.C:
		}
		s.lead.mu.Lock()
		var due []leaseItem
		if s.lead.ready {
			due = s.lead.leases.due(s.cfg.Now(), s.cfg.ExpireRetry)
		}
		s.lead.mu.Unlock()
		for _, it := range due {
			s.wg.Add(1)
			go s.expire(it.key, it.token)
		}
	}
}

func (s *Service) expire(key string, token uint64) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
	defer cancel()
	a, err := s.propose(ctx, core.Expire(key, token))
	if err != nil {
		s.log.Debug("expire proposal failed; will retry while leader", "key", key, "token", token, "err", err)
		return
	}
	s.log.Debug("lease expired", "key", key, "token", token, "existed", a.Result.Existed, "index", a.Index)
}
