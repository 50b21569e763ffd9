package lockservice

import (
	"fmt"

	"github.com/ticketd/ticketd/core"
)

// Quotas: what one client can make the leader hold.
//
// Every Grant reserves its key on the leader before it is proposed (and a
// waiter is handed a key the same way), so the leader knows exactly how
// many locks are held (its lease timers, one per applied lock) and how
// many are on their way (its reservations). A reservation is admitted only
// if, counting it, the table stays within Limits.MaxLocks and the caller's
// identity within Limits.MaxLocksPerIdentity, and the storage is not in
// its low-space alarm; otherwise the request fails with a *LimitError
// (ErrResourceExhausted) and nothing is proposed. Releases, expiries and
// renewals never pass through here: they only ever free room, so they work
// at any quota and on a low disk.
//
// Identities: the caller's authenticated identity (IdentityFrom) is
// recorded in the Grant from cluster version 2 on, so a new leader
// rebuilds the per-identity counts from the applied table. Anonymous
// requests, and locks granted before version 2, all count under the empty
// identity "": with MaxLocksPerIdentity set they share one quota.
//
// Waiters are bounded too: at most MaxWaitersPerKey in one key's queue and
// MaxWaiters on the node; an acquire beyond either fails the same way at
// once instead of queueing.

// Defaults of Limits.
const (
	// MaxLocksDefault is the total lock limit (see core.DefaultMaxLocks
	// for why it is safe).
	MaxLocksDefault = core.DefaultMaxLocks
	// MaxWaitersPerKeyDefault bounds one key's queue.
	MaxWaitersPerKeyDefault = 1000
	// MaxWaitersDefault bounds the waiters of the whole node. The NATS
	// edge bounds acquires in flight at the same number.
	MaxWaitersDefault = 10000
)

// Limits bounds what clients can make the leader hold. Zero fields take
// their defaults; MaxLocksPerIdentity 0 means no per-identity limit.
type Limits struct {
	MaxLocks            int
	MaxLocksPerIdentity int
	MaxWaitersPerKey    int
	MaxWaiters          int
}

func (l *Limits) withDefaults() {
	if l.MaxLocks <= 0 {
		l.MaxLocks = MaxLocksDefault
	}
	if l.MaxWaitersPerKey <= 0 {
		l.MaxWaitersPerKey = MaxWaitersPerKeyDefault
	}
	if l.MaxWaiters <= 0 {
		l.MaxWaiters = MaxWaitersDefault
	}
}

// Resources a LimitError names. They are stable: they appear in messages
// and in the ticketd_resource_exhausted_total metric.
const (
	ResourceLocks         = "locks"          // the lock table is full (MaxLocks)
	ResourceIdentityLocks = "identity_locks" // the caller's identity holds MaxLocksPerIdentity
	ResourceKeyWaiters    = "key_waiters"    // the key's queue is full
	ResourceWaiters       = "waiters"        // the node's waiters are at MaxWaiters
	ResourceStorage       = "storage"        // the leader's storage is low on space
)

// LimitError is a request refused by a limit. It matches
// ErrResourceExhausted; nothing was proposed.
type LimitError struct {
	Resource string // one of the Resource* names
	Limit    int    // the limit reached (0 for storage)
	Identity string // the identity whose quota was reached (identity_locks)
	Detail   string // for storage: the alarm
}

func (e *LimitError) Error() string {
	switch e.Resource {
	case ResourceIdentityLocks:
		return fmt.Sprintf("lockservice: identity %q holds its limit of %d locks", e.Identity, e.Limit)
	case ResourceStorage:
		return "lockservice: grants refused while storage is low on space: " + e.Detail
	case ResourceLocks:
		return fmt.Sprintf("lockservice: the lock table holds its limit of %d locks", e.Limit)
	}
	return fmt.Sprintf("lockservice: %s at its limit of %d", e.Resource, e.Limit)
}

// Is makes errors.Is(err, ErrResourceExhausted) hold.
func (e *LimitError) Is(target error) bool { return target == ErrResourceExhausted }

// reservation is a key reserved for a Grant in flight.
type reservation struct {
	epoch    uint64 // the leadership epoch that made it
	identity string // who it counts against
}

// reserve reserves key for a Grant of identity in epoch. s.lead.mu held.
func (s *Service) reserve(key string, epoch uint64, identity string) {
	s.lead.reserved[key] = reservation{epoch: epoch, identity: identity}
	s.lead.reservedBy[identity]++
}

// dropReservation forgets key's reservation, whoever made it. s.lead.mu
// held.
func (s *Service) dropReservation(key string) {
	r, ok := s.lead.reserved[key]
	if !ok {
		return
	}
	delete(s.lead.reserved, key)
	if n := s.lead.reservedBy[r.identity] - 1; n > 0 {
		s.lead.reservedBy[r.identity] = n
	} else {
		delete(s.lead.reservedBy, r.identity)
	}
}

// admitGrant decides whether one more lock may be reserved for identity:
// the one check every Grant (direct or handed to a waiter) passes before
// its key is reserved. s.lead.mu held.
func (s *Service) admitGrant(identity string) error {
	lim := &s.cfg.Limits
	if s.cfg.StorageAlarm != nil {
		if err := s.cfg.StorageAlarm(); err != nil {
			return s.refuse(&LimitError{Resource: ResourceStorage, Detail: err.Error()})
		}
	}
	if s.lead.leases.Len()+len(s.lead.reserved) >= lim.MaxLocks {
		return s.refuse(&LimitError{Resource: ResourceLocks, Limit: lim.MaxLocks})
	}
	if lim.MaxLocksPerIdentity > 0 && s.lead.leases.held(identity)+s.lead.reservedBy[identity] >= lim.MaxLocksPerIdentity {
		return s.refuse(&LimitError{Resource: ResourceIdentityLocks, Limit: lim.MaxLocksPerIdentity, Identity: identity})
	}
	return nil
}

// admitWaiter decides whether an acquire may wait in key's queue.
// s.lead.mu held.
func (s *Service) admitWaiter(key string) error {
	lim := &s.cfg.Limits
	if q := s.lead.queues[key]; q != nil && q.len() >= lim.MaxWaitersPerKey {
		return s.refuse(&LimitError{Resource: ResourceKeyWaiters, Limit: lim.MaxWaitersPerKey})
	}
	if s.lead.waiters >= lim.MaxWaiters {
		return s.refuse(&LimitError{Resource: ResourceWaiters, Limit: lim.MaxWaiters})
	}
	return nil
}

func (s *Service) refuse(e *LimitError) error {
	s.cfg.Metrics.Exhausted.WithLabelValues(e.Resource).Inc()
	return e
}
