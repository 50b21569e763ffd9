package lockservice

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/plugins"
)

// Fair shares (issue 21): one identity must not be able to take what every
// other identity needs. Next to the waiter share (quota.go), each identity
// has:
//
//   - a share of the requests in progress on a node: BeginRequest, which
//     the transport calls for every request it serves, admits at most
//     Limits.MaxInflightPerIdentity of one identity at once. An acquire
//     that starts waiting in a key's queue is parked: it leaves this count
//     (AcquireParams.Parked), so waits, bounded by the waiter limits,
//     never use up the budget that try requests, releases, renewals and
//     reads need. Releases are counted: each costs the leader a raft
//     entry, even of a lock long gone, so uncounted releases let one
//     identity fill the node's budget that others' renewals need (a
//     client over its share gives back what it holds once its requests
//     are answered, or its leases expire);
//   - a share of a policy plugin's time: the plugin refuses a call of an
//     identity that spent its share (plugins.ShareError), which checkPolicy
//     reports as a *LimitError like every other limit.
//
// Each refusal is a *LimitError naming its resource, counted in
// ticketd_resource_exhausted_total. Anonymous callers share one identity
// (""), as for every quota.

// inflight counts requests in progress by identity.
type inflight struct {
	mu sync.Mutex // guards by
	by map[string]int
}

// BeginRequest admits one request of identity on this node, or refuses it
// with a *LimitError (ResourceIdentityInflight) when the identity has
// Limits.MaxInflightPerIdentity requests in progress already. done, which
// is safe to call more than once, ends it: when the request is answered,
// or earlier when it parks in a key's queue (AcquireParams.Parked).
func (s *Service) BeginRequest(identity string) (done func(), err error) {
	lim := s.cfg.Limits.MaxInflightPerIdentity
	s.inflight.mu.Lock()
	n := s.inflight.by[identity]
	if n >= lim {
		s.inflight.mu.Unlock()
		return func() {}, s.refuse(&LimitError{Resource: ResourceIdentityInflight, Limit: lim, Identity: identity})
	}
	s.inflight.by[identity] = n + 1
	s.inflight.mu.Unlock()
	var once atomic.Bool
	return func() {
		if once.Swap(true) {
			return
		}
		s.inflight.mu.Lock()
		defer s.inflight.mu.Unlock()
		if n := s.inflight.by[identity] - 1; n > 0 {
			s.inflight.by[identity] = n
		} else {
			delete(s.inflight.by, identity)
		}
	}, nil
}

// policyLimit turns a policy plugin's refusal of an identity that spent
// its share of the plugin's time into a *LimitError (nil for any other
// error).
func (s *Service) policyLimit(err error) error {
	var se *plugins.ShareError
	if !errors.As(err, &se) {
		return nil
	}
	return s.refuse(&LimitError{Resource: ResourceIdentityPluginTime, Limit: int(se.PerSecond / time.Millisecond), Identity: se.Identity})
}
