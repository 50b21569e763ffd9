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
// Waiters are bounded too: at most MaxWaitersPerKey in one key's queue,
// MaxWaitersPerIdentity of one identity and MaxWaiters on the node; an
// acquire beyond any of them fails the same way at once instead of
// queueing. The per-identity bound is each tenant's share: one identity
// that parks waits by the thousand fills its own share, never the node's
// (issue 21). Requests in flight and plugin time have per-identity shares
// too (fair.go).

// Defaults of Limits.
const (
	// MaxLocksDefault is the total lock limit (see core.DefaultMaxLocks
	// for why it is safe).
	MaxLocksDefault = core.DefaultMaxLocks
	// MaxWaitersPerKeyDefault bounds one key's queue.
	MaxWaitersPerKeyDefault = 1000
	// MaxWaitersDefault bounds the waiters of the whole node.
	MaxWaitersDefault = 10000
	// MaxWaitersPerIdentityDefault bounds the waiters of one identity: a
	// tenth of the node's.
	MaxWaitersPerIdentityDefault = 1000
	// MaxInflightPerIdentityDefault bounds the requests of one identity
	// in progress on a node, waiting acquires not counted (fair.go): a
	// tenth of the transport's node-wide budget.
	MaxInflightPerIdentityDefault = 1000
)

// Limits bounds what clients can make the leader hold. Zero fields take
// their defaults; MaxLocksPerIdentity 0 means no per-identity limit.
type Limits struct {
	MaxLocks              int
	MaxLocksPerIdentity   int
	MaxWaitersPerKey      int
	MaxWaiters            int
	MaxWaitersPerIdentity int
	// MaxInflightPerIdentity bounds one identity's requests in progress on
	// this node (BeginRequest).
	MaxInflightPerIdentity int
	// MaxSessions bounds the open sessions (default
	// core.DefaultMaxSessions, at most core.MaxSessions);
	// MaxSessionsPerIdentity those of one identity (0: no per-identity
	// limit). See sessions.go.
	MaxSessions            int
	MaxSessionsPerIdentity int
	// MaxLocksPerSession bounds the locks of one session (default and
	// at most core.MaxLocksPerSession, which Apply enforces).
	MaxLocksPerSession int
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
	if l.MaxWaitersPerIdentity <= 0 {
		l.MaxWaitersPerIdentity = MaxWaitersPerIdentityDefault
	}
	if l.MaxInflightPerIdentity <= 0 {
		l.MaxInflightPerIdentity = MaxInflightPerIdentityDefault
	}
	if l.MaxSessions <= 0 {
		l.MaxSessions = core.DefaultMaxSessions
	}
	l.MaxSessions = min(l.MaxSessions, core.MaxSessions)
	if l.MaxLocksPerSession <= 0 {
		l.MaxLocksPerSession = core.MaxLocksPerSession
	}
	l.MaxLocksPerSession = min(l.MaxLocksPerSession, core.MaxLocksPerSession)
}

// Resources a LimitError names. They are stable: they appear in messages
// and in the ticketd_resource_exhausted_total metric.
const (
	ResourceLocks         = "locks"          // the lock table is full (MaxLocks)
	ResourceIdentityLocks = "identity_locks" // the caller's identity holds MaxLocksPerIdentity
	ResourceKeyWaiters    = "key_waiters"    // the key's queue is full
	ResourceWaiters       = "waiters"        // the node's waiters are at MaxWaiters
	ResourceStorage       = "storage"        // the leader's storage is low on space
	ResourceKeyHolders    = "key_holders"    // a shared key has core.MaxHoldersPerKey holders
	// Per-identity shares (fair.go): the caller's identity has
	// MaxWaitersPerIdentity acquires waiting, MaxInflightPerIdentity
	// requests in progress, or has spent its share of a policy plugin's
	// time (Limit: milliseconds per second).
	ResourceIdentityWaiters    = "identity_waiters"
	ResourceIdentityInflight   = "identity_inflight"
	ResourceIdentityPluginTime = "identity_plugin_time"
)

// LimitError is a request refused by a limit. It matches
// ErrResourceExhausted; nothing was proposed.
type LimitError struct {
	Resource string // one of the Resource* names
	Limit    int    // the limit reached (0 for storage)
	Identity string // the identity whose quota was reached (identity_*)
	Detail   string // for storage: the alarm
}

func (e *LimitError) Error() string {
	switch e.Resource {
	case ResourceIdentityLocks:
		return fmt.Sprintf("lockservice: %s holds its limit of %d locks", who(e.Identity), e.Limit)
	case ResourceIdentityWaiters:
		return fmt.Sprintf("lockservice: %s has its limit of %d acquires waiting", who(e.Identity), e.Limit)
	case ResourceIdentityInflight:
		return fmt.Sprintf("lockservice: %s has its limit of %d requests in progress; retry when they are answered", who(e.Identity), e.Limit)
	case ResourceIdentityPluginTime:
		return fmt.Sprintf("lockservice: %s spent its share of policy plugin time (%dms per second); retry later", who(e.Identity), e.Limit)
	case ResourceStorage:
		return "lockservice: grants refused while storage is low on space: " + e.Detail
	case ResourceLocks:
		return fmt.Sprintf("lockservice: the lock table holds its limit of %d locks", e.Limit)
	}
	return fmt.Sprintf("lockservice: %s at its limit of %d", e.Resource, e.Limit)
}

// Is makes errors.Is(err, ErrResourceExhausted) hold.
func (e *LimitError) Is(target error) bool { return target == ErrResourceExhausted }

// who names an identity in a message; the caller's own, so showing it back
// reveals nothing.
func who(identity string) string {
	if identity == "" {
		return "anonymous callers (one shared identity)"
	}
	return fmt.Sprintf("identity %q", identity)
}

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
	if s.lead.leases.Len()+len(s.lead.reserved)+s.lead.multiResN >= lim.MaxLocks {
		return s.refuse(&LimitError{Resource: ResourceLocks, Limit: lim.MaxLocks})
	}
	if lim.MaxLocksPerIdentity > 0 && s.lead.leases.held(identity)+s.lead.reservedBy[identity] >= lim.MaxLocksPerIdentity {
		return s.refuse(&LimitError{Resource: ResourceIdentityLocks, Limit: lim.MaxLocksPerIdentity, Identity: identity})
	}
	return nil
}

// admitWaiter decides whether an acquire of identity may wait in key's
// queue. s.lead.mu held.
func (s *Service) admitWaiter(key, identity string) error {
	lim := &s.cfg.Limits
	if q := s.lead.queues[key]; q != nil && q.len() >= lim.MaxWaitersPerKey {
		return s.refuse(&LimitError{Resource: ResourceKeyWaiters, Limit: lim.MaxWaitersPerKey})
	}
	if s.lead.waitersBy[identity] >= lim.MaxWaitersPerIdentity {
		return s.refuse(&LimitError{Resource: ResourceIdentityWaiters, Limit: lim.MaxWaitersPerIdentity, Identity: identity})
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
