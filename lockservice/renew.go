package lockservice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Renewal: a held lock's lease is lengthened by a replicated Renew
// command (core.KindRenew, cluster version 2), never by the leader alone.
//
// Why a deposed leader never acknowledges a renewal the next leader does
// not honour: Renew answers only after its entry committed and applied.
// A leader that lost its quorum cannot commit, so it cannot answer. A
// committed Renew is in every later leader's log before that leader's
// first entry, so the lock's LeaseMS it applied is what that leader
// re-arms in full when it becomes ready (OnLeaderReady), at a moment after
// the renew request was sent. The holder may therefore assume the lock
// until (its send time + the LeaseMS of the reply) on any leader.
//
// Expire and Renew race on the leader: an Expire proposed for a lease that
// ran out would still remove the lock if a Renew proposed just before it
// applied first (both carry the same token). The leader keeps them apart
// on the lock's timer: a Renew is refused once the lease ran out on the
// leader's clock (the holder's own deadline, counted from an earlier send,
// has passed too), and the expiry loop never hands out a lock with a Renew
// in flight (leaseTable.due). A Renew and an Expire of the same lock are
// therefore never in flight together on one leader; a later leader's
// Renew follows every entry of earlier terms in the log.

// Renewal is an applied renewal.
type Renewal struct {
	Key   string
	Token uint64
	// Lease is the lock's lease after the renewal: at least the lease
	// asked for, never less than before.
	Lease time.Duration
	Index uint64
}

// Renew lengthens the lease of key's lock held with token. lease 0 keeps
// the lock's lease; a shorter one than the lock's changes nothing (a
// renewal never shortens a lease). The leader's timer for the lock is
// re-armed at (apply time + the resulting lease).
func (s *Service) Renew(ctx context.Context, key string, token uint64, lease time.Duration) (Renewal, error) {
	cmd := core.Renew(key, token, uint64(lease/time.Millisecond))
	if err := cmd.Validate(); err != nil {
		return Renewal{}, err
	}
	if err := s.authorize(ctx, OpAcquire, key); err != nil {
		return Renewal{}, err
	}
	if !s.IsLeader() {
		return Renewal{}, s.notLeader()
	}
	if have, need := s.node.ClusterVersion(), core.CommandVersion(cmd); have < need {
		return Renewal{}, fmt.Errorf("%w: renew needs cluster version %d, the cluster runs version %d (a member runs an older binary, or the new leader has not raised it yet); retry later",
			ErrUnavailable, need, have)
	}
	if err := s.checkRenewal(ctx, key, token, lease); err != nil {
		return Renewal{}, err
	}
	epoch, err := s.beginRenew(key, token)
	if errors.Is(err, ErrNotFound) {
		// Answer not_found only as the current leader: a deposed leader's
		// timers may be stale. After ReadIndex the timers include every
		// write committed before this request.
		if rerr := s.node.ReadIndex(ctx); rerr != nil {
			return Renewal{}, s.nodeErr(rerr)
		}
		epoch, err = s.beginRenew(key, token)
	}
	if err != nil {
		return Renewal{}, err
	}
	defer s.endRenew(key, token, epoch)
	a, err := s.propose(ctx, cmd)
	if err != nil {
		return Renewal{}, err
	}
	switch a.Result.Kind {
	case core.ResultRenewed:
		return Renewal{Key: key, Token: token, Lease: time.Duration(a.LeaseMS) * time.Millisecond, Index: a.Index}, nil
	case core.ResultNotFound:
		return Renewal{}, fmt.Errorf("%w: %q with token %d", ErrNotFound, key, token)
	}
	return Renewal{}, fmt.Errorf("lockservice: renew applied as %v", a.Result)
}

// beginRenew checks, on the leader's timers, that key is held with token
// and its lease has not run out, and counts the Renew in flight so that
// the lock is not expired under it. It returns the leadership epoch.
func (s *Service) beginRenew(key string, token uint64) (uint64, error) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !s.lead.ready {
		return 0, s.notLeader()
	}
	tk := s.heldTimer(key, token)
	it, ok := s.lead.leases.get(tk)
	if !ok || it.token != token {
		// The timers mirror the applied table, so nothing to propose.
		return 0, fmt.Errorf("%w: %q is not held with token %d", ErrNotFound, key, token)
	}
	if it.expiring || !it.deadline.After(s.cfg.Now()) {
		return 0, fmt.Errorf("%w: the lease of %q with token %d ran out on the leader; it is being expired", ErrNotFound, key, token)
	}
	s.lead.leases.addRenewing(tk, token, +1)
	return s.lead.epoch, nil
}

// endRenew undoes beginRenew's count, if the timer is still the one it
// counted on (same leadership, same lock).
func (s *Service) endRenew(key string, token, epoch uint64) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if s.lead.epoch != epoch {
		return
	}
	tk := s.heldTimer(key, token)
	if s.lead.leases.addRenewing(tk, token, -1) {
		if it, _ := s.lead.leases.get(tk); it.renewing == 0 && !it.deadline.After(s.cfg.Now()) {
			s.signalTimersChanged()
		}
	}
}

// applyRenewed re-arms the timer of a renewed lock at now + its lease
// after the renewal. s.lead.mu held.
func (s *Service) applyRenewed(key string, token, leaseMS, askedMS uint64) {
	lease := time.Duration(max(leaseMS, askedMS)) * time.Millisecond
	if s.lead.leases.extend(key, token, lease, s.cfg.Now()) {
		s.signalTimersChanged()
	}
}

// checkRenewal holds a renewal to the rules its grant met: only the
// identity the lock was granted to may renew it (another identity that may
// acquire under the prefix could otherwise read the token with get or list
// and keep someone else's lock alive), and a renewal that lengthens the
// lease is asked of the policy like a Grant of that lease, so a policy's
// lease cap cannot be renewed around. A lock that is not held with token
// passes here: beginRenew answers not_found.
func (s *Service) checkRenewal(ctx context.Context, key string, token uint64, lease time.Duration) error {
	var held core.Lock
	var ok bool
	s.node.View(func(m *core.Machine) { held, ok = m.Holder(key, token) })
	if !ok {
		return nil
	}
	if held.SessionID != 0 {
		return &core.Error{Code: core.CodeInvalidArgument, Detail: errRenewSessionLock.Error()}
	}
	if id := IdentityFrom(ctx); held.Identity != "" && held.Identity != id && !nodeAuthority(ctx) {
		s.cfg.Metrics.PermissionDenied.WithLabelValues(string(OpAcquire)).Inc()
		return &PermissionError{Identity: id, Op: "renew the lock of another identity on", Key: key}
	}
	if leaseMS := uint64(lease / time.Millisecond); leaseMS > held.LeaseMS {
		return s.checkPolicy(ctx, AcquireParams{Key: key, Owner: held.Owner, Limit: held.Limit, Mode: held.Mode}, leaseMS)
	}
	return nil
}
