package sdk

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Bounds of a client's background requests in flight (WithKeepAlivesInFlight).
const (
	// DefaultKeepAlivesInFlight is how many session keepalives a client
	// has in flight at most, and separately how many background lock
	// renewals (KeepAlive, WithAutoRenew). A node admits at most 1,000
	// requests of one identity at once by default (lockservice
	// MaxInflightPerIdentityDefault), and every client of the identity
	// shares them: a client whose overdue keepalives all go out at once
	// (after a GC pause or a stop of its process) would take that whole
	// share from the others. A keepalive is in flight about 21 ms (the
	// node holds its ReadIndex up to 20 ms for others to share the round;
	// TestSessionKeepAlivesWithinIdentityShare logs it), so 64 carry about
	// 3,000 keepalives a second: a client's sessions keep up unqueued to
	// about 900 per second of TTL (9,000 at a 10 s TTL, 54,000 at 60 s;
	// more wait their turn, later but within their loss deadline, or
	// raise the bound). In the 2-pair run of docs/benchmarks.md "Sessions
	// (issue 24)", a holder of 10,000 sessions over four clients resumed
	// after a 15 s stop without any refusal for the other clients at 16,
	// 64 or 128; at 128 the load's p99 right after the resume was about
	// 2 ms higher (three runs) than at 64 (two) or without a bound (three).
	DefaultKeepAlivesInFlight = 64
	// MaxKeepAlivesInFlight is the largest bound WithKeepAlivesInFlight
	// accepts: a default node's whole share of one identity.
	MaxKeepAlivesInFlight = 1000
)

// WithKeepAlivesInFlight bounds the client's session keepalives in flight
// to n (default DefaultKeepAlivesInFlight, 1 to MaxKeepAlivesInFlight), and
// separately its locks' background renewals (KeepAlive, WithAutoRenew).
// A keepalive or renewal that falls due while n are in flight waits for
// one to finish, in the order they fell due, but never past its session's
// or lock's loss deadline (Deadline minus the safety margin): then the
// session or lock ends with ErrLost, as if the request had failed. Set it
// at most to what the nodes admit of the client's identity at once
// (lockservice Limits.MaxInflightPerIdentity), less what its other
// clients need.
//
// Renewals have their own bound rather than sharing the keepalives': a
// renewal is a raft entry, in progress many times longer than a
// keepalive (which writes none), and a session's keepalive, which holds
// all its locks, should not wait behind them.
func WithKeepAlivesInFlight(n int) Option {
	return func(c *config) { c.keepAlivesInFlight = n }
}

// inflightSlots bounds a kind of background request in flight: take a
// slot before sending one, give it back after its reply. Waiters are
// served in the order they came (a channel's blocked senders are).
type inflightSlots struct {
	slots chan struct{}
	// waiting counts the callers blocked in take (tests watch it).
	waiting atomic.Int64
}

func newInflightSlots(n int) *inflightSlots {
	return &inflightSlots{slots: make(chan struct{}, n)}
}

// take takes a slot at once if one is free, or else waits for one at most
// patience; it reports false when patience ran out or ctx ended first.
// When it returns true the caller owes a give.
func (s *inflightSlots) take(ctx context.Context, patience time.Duration) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	if patience <= 0 || ctx.Err() != nil {
		return false
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	t := time.NewTimer(patience)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

// give returns a slot taken by take.
func (s *inflightSlots) give() { <-s.slots }

// errNoSlot is the last error of a keepalive or renewal that found every
// slot in use until its deadline (the session's or lock's Err names it).
func errNoSlot(what string, n int) error {
	return fmt.Errorf("ticketd: waited for one of the client's %d %s in flight to finish", n, what)
}
