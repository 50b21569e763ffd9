package lockservice

import (
	"context"
	"time"
)

// Settling grants: a grant whose outcome for its requester is still being
// decided on this leader. A grant handed to a requester that waited is
// published with a delivery watch (natsapi, delivery.go) and released if
// nobody received it; a lost-reply release (ReleaseUndelivered) is a
// proposal in flight. A retry with the grant's request id that arrived
// meanwhile must not be answered with the grant (Repeated): the release
// would then take it from a client that believes it holds it. So the
// lookup waits until the grant settles — the release applied (the retry
// then learns grant_ended) or the delivery window passed (nobody will
// release it) — and looks again.

// SettleWindowDefault bounds how long a grant handed out for a watched
// delivery counts as settling: longer than the transport's delivery watch
// (natsapi.DeliveryWatchDefault, 2 s), after which nothing releases it.
const SettleWindowDefault = 3 * time.Second

// settleRef names one grant.
type settleRef struct {
	key   string
	token uint64
}

// settleMark is a settling grant: done is closed when it settles; until
// bounds a delivery whose end nobody reports.
type settleMark struct {
	done  chan struct{}
	until time.Time
}

// markSettling records that key's grant with token settles until
// window from now (0: until endSettling).
func (s *Service) markSettling(key string, token uint64, window time.Duration) {
	now := s.cfg.Now()
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	ref := settleRef{key, token}
	until := time.Time{}
	if window > 0 {
		until = now.Add(window)
	}
	if m := s.lead.settling[ref]; m != nil {
		if until.IsZero() || (!m.until.IsZero() && until.After(m.until)) {
			m.until = until
		}
		return
	}
	if len(s.lead.settling) >= 1024 {
		// Marks whose window passed are forgotten here; their number is
		// bounded by the grants made in one window.
		for r, m := range s.lead.settling {
			if !m.until.IsZero() && now.After(m.until) {
				close(m.done)
				delete(s.lead.settling, r)
			}
		}
	}
	s.lead.settling[ref] = &settleMark{done: make(chan struct{}), until: until}
}

// endSettling ends key's mark for token.
func (s *Service) endSettling(key string, token uint64) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	ref := settleRef{key, token}
	if m := s.lead.settling[ref]; m != nil {
		close(m.done)
		delete(s.lead.settling, ref)
	}
}

// resetSettling wakes every waiter (leadership changed). s.lead.mu held.
func (s *Service) resetSettling() {
	for _, m := range s.lead.settling {
		close(m.done)
	}
	s.lead.settling = make(map[settleRef]*settleMark)
}

// awaitSettled waits until key's grant with token is not settling.
// waited reports whether it was, so the caller looks again.
func (s *Service) awaitSettled(ctx context.Context, key string, token uint64) (waited bool, _ error) {
	for {
		s.lead.mu.Lock()
		m := s.lead.settling[settleRef{key, token}]
		var until time.Time
		if m != nil {
			until = m.until
		}
		s.lead.mu.Unlock()
		if m == nil {
			return waited, nil
		}
		var timeout <-chan time.Time
		if !until.IsZero() {
			left := until.Sub(s.cfg.Now())
			if left <= 0 {
				s.endSettling(key, token)
				return true, nil
			}
			t := time.NewTimer(left)
			defer t.Stop()
			timeout = t.C
		}
		waited = true
		select {
		case <-m.done:
		case <-timeout:
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}
