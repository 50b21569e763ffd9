package lockservice

import (
	"context"
	"fmt"

	"github.com/ticketd/ticketd/core"
)

// Release gives back key if token is the token it is held with.
func (s *Service) Release(ctx context.Context, key string, token uint64) error {
	cmd := core.Release(key, token)
	if err := cmd.Validate(); err != nil {
		return err
	}
	if err := s.authorize(ctx, OpRelease, key); err != nil {
		return err
	}
	if !s.IsLeader() {
		return s.notLeader()
	}
	if err := s.checkReleaser(ctx, key, token); err != nil {
		return err
	}
	a, err := s.propose(ctx, cmd)
	if err != nil {
		return err
	}
	switch a.Result.Kind {
	case core.ResultReleased:
		return nil
	case core.ResultNotFound:
		return fmt.Errorf("%w: %q with token %d", ErrNotFound, key, token)
	}
	return fmt.Errorf("lockservice: release applied as %v", a.Result)
}

// checkReleaser holds a release to the rule renew follows (checkRenewal):
// only the identity the lock was granted to may release it. Another
// identity that may release under the prefix could otherwise read the
// token with get or list (or guess it: tokens are small integers) and
// free someone else's lock. A lock without a recorded identity (anonymous,
// or granted before cluster version 2) may be released by anyone who may
// release under its prefix, as before; the cluster's own lost-reply
// release (WithNodeAuthority) passes.
//
// A token above the last one the table issued is not_found without a
// proposal, once a ReadIndex confirms that this node still leads and its
// table includes every commit before the request: no client was answered
// that token yet, so a Release proposed for it could only meet a Grant
// still in flight, which it would free whoever that Grant is for. Older
// tokens no longer held are proposed as before (they apply as not_found):
// no later Grant can carry them.
func (s *Service) checkReleaser(ctx context.Context, key string, token uint64) error {
	held, last := s.lockOf(key, token)
	if held.Token != token && token > last {
		if err := s.node.ReadIndex(ctx); err != nil {
			return s.nodeErr(err)
		}
		if held, last = s.lockOf(key, token); held.Token != token && token > last {
			return fmt.Errorf("%w: %q with token %d (no lock was granted that token yet)", ErrNotFound, key, token)
		}
	}
	if id := IdentityFrom(ctx); held.Token == token && held.Identity != "" && held.Identity != id && !nodeAuthority(ctx) {
		s.cfg.Metrics.PermissionDenied.WithLabelValues(string(OpRelease)).Inc()
		return &PermissionError{Identity: id, Op: "release the lock of another identity on", Key: key}
	}
	return nil
}

// lockOf reads key's holder with token (the zero Lock when there is none:
// any holder of a multi-holder key, the lock of any other) and the last
// token issued from the applied table.
func (s *Service) lockOf(key string, token uint64) (held core.Lock, lastToken uint64) {
	s.node.View(func(m *core.Machine) {
		held, _ = m.Holder(key, token)
		lastToken = m.LastToken()
	})
	return held, lastToken
}

// Get returns the current holder of key, read linearizably (ReadIndex): the
// lock of a mutex or an exclusive holder, or, for a multi-holder key
// (kinds.go), the oldest holder in Lock and every holder in All, in token
// order.
func (s *Service) Get(ctx context.Context, key string) (Holder, error) {
	if err := core.ValidateKey(key); err != nil {
		return Holder{}, err
	}
	if err := s.authorize(ctx, OpGet, key); err != nil {
		return Holder{}, err
	}
	if !s.IsLeader() {
		return Holder{}, s.notLeader()
	}
	if err := s.node.ReadIndex(ctx); err != nil {
		return Holder{}, s.nodeErr(err)
	}
	var locks []core.Lock
	var kh core.KeyHolders
	var multi bool
	s.node.View(func(m *core.Machine) {
		locks = m.Holders(key)
		kh, multi = m.KeyHolders(key)
	})
	var h Holder
	if multi {
		h.Limit, h.Mode = keyLimit(kh.Limit), kh.Mode
	}
	if len(locks) == 0 {
		return h, nil
	}
	now := s.cfg.Now()
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	h.Lock, h.Held, h.Remaining = locks[0], true, s.remainingOf(locks[0], now)
	if multi {
		h.All = make([]Holder, len(locks))
		for i, l := range locks {
			h.All[i] = Holder{Lock: l, Held: true, Remaining: s.remainingOf(l, now)}
		}
	}
	return h, nil
}
