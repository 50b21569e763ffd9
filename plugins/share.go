package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Fair shares of a plugin's policy calls, by identity (issue 21).
//
// A policy call holds one of the plugin's instances for as long as it
// runs, and one that runs to its deadline (or traps) also pays for the
// fresh instance that replaces it. Without shares, one identity whose keys
// make the policy slow would hold every instance, and every other
// identity's Grants would queue behind it. So each identity that calls
// ValidateGrant gets:
//
//   - at most Config.IdentityCalls calls running at once (by default half
//     the instances): the others wait for one of its own calls to finish,
//     never for the pool, so other identities always find instances;
//   - a budget of Config.IdentityTime of instance time per second
//     (refilled continuously, holding at most one second's worth): a call
//     is charged the time it held an instance, replacement included, and
//     while the identity's budget is spent its calls are refused at once
//     with a *ShareError, without touching an instance.
//
// Identities are the transport's (lockservice); anonymous callers share
// the empty identity. The state per identity is dropped once it is idle
// with a full budget, so it is bounded by the identities active within
// about a second (plus those still paying off a debt).

// ErrShareSpent: the identity has spent its share of the plugin's time;
// nothing ran. A *ShareError matches it.
var ErrShareSpent = errors.New("plugins: identity spent its share of plugin time")

// ShareError refuses a policy call of an identity whose plugin time is
// spent. It matches ErrShareSpent.
type ShareError struct {
	Plugin   string
	Identity string
	// PerSecond is the identity's budget (Config.IdentityTime).
	PerSecond time.Duration
}

func (e *ShareError) Error() string {
	who := "anonymous callers"
	if e.Identity != "" {
		who = fmt.Sprintf("identity %q", e.Identity)
	}
	return fmt.Sprintf("plugins: %s used its share of plugin %s's time (%v per second); retry later", who, e.Plugin, e.PerSecond)
}

// Is makes errors.Is(err, ErrShareSpent) hold.
func (e *ShareError) Is(target error) bool { return target == ErrShareSpent }

// maxIdleShares is how many identities' shares may be kept before a sweep
// drops the idle ones whose budget has refilled.
const maxIdleShares = 1024

// shares is the per-identity accounting of one plugin's policy calls.
type shares struct {
	plugin string
	calls  int           // calls of one identity at once
	rate   time.Duration // instance time per second of one identity
	now    func() time.Time

	mu sync.Mutex // guards by and every share's fields but slots
	by map[string]*share
}

// share is one identity's state.
type share struct {
	slots  chan struct{} // one token per running call, cap calls
	users  int           // calls running or waiting for a slot
	credit time.Duration // instance time left; negative: in debt
	at     time.Time     // when credit was last refilled
}

func newShares(plugin string, calls int, rate time.Duration) *shares {
	return &shares{plugin: plugin, calls: calls, rate: rate, now: time.Now, by: make(map[string]*share)}
}

// refill adds the credit earned since sh.at, up to one second's worth.
// s.mu held.
func (s *shares) refill(sh *share, now time.Time) {
	if d := now.Sub(sh.at); d > 0 {
		sh.credit = min(s.rate, sh.credit+time.Duration(float64(d)*float64(s.rate)/float64(time.Second)))
	}
	sh.at = now
}

// begin admits one call of identity: it fails with a *ShareError while the
// identity's budget is spent, else waits (under ctx) until fewer than
// s.calls of its calls run. The caller calls end with the time the call
// held an instance.
func (s *shares) begin(ctx context.Context, identity string) (*share, error) {
	s.mu.Lock()
	sh := s.by[identity]
	if sh == nil {
		if len(s.by) >= maxIdleShares {
			s.sweep()
		}
		sh = &share{slots: make(chan struct{}, s.calls), credit: s.rate, at: s.now()}
		s.by[identity] = sh
	}
	if err := s.spent(sh, identity); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	sh.users++
	s.mu.Unlock()
	select {
	case sh.slots <- struct{}{}:
	case <-ctx.Done():
		s.done(identity, sh, 0, false)
		return nil, ctx.Err()
	}
	// The budget may have been spent by the calls it waited for.
	s.mu.Lock()
	err := s.spent(sh, identity)
	s.mu.Unlock()
	if err != nil {
		s.done(identity, sh, 0, true)
		return nil, err
	}
	return sh, nil
}

// spent refuses a call while sh's credit is used up. s.mu held.
func (s *shares) spent(sh *share, identity string) error {
	s.refill(sh, s.now())
	if sh.credit > 0 {
		return nil
	}
	return &ShareError{Plugin: s.plugin, Identity: identity, PerSecond: s.rate}
}

// end charges a call that began (begin) the instance time it used.
func (s *shares) end(identity string, sh *share, used time.Duration) {
	s.done(identity, sh, used, true)
}

func (s *shares) done(identity string, sh *share, used time.Duration, slot bool) {
	if slot {
		<-sh.slots
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sh.users--
	sh.credit -= used
	if sh.users == 0 {
		s.refill(sh, s.now())
		if sh.credit >= s.rate && s.by[identity] == sh {
			delete(s.by, identity)
		}
	}
}

// sweep drops the shares that are idle with a full budget. s.mu held.
func (s *shares) sweep() {
	now := s.now()
	for id, sh := range s.by {
		if sh.users == 0 {
			s.refill(sh, now)
			if sh.credit >= s.rate {
				delete(s.by, id)
			}
		}
	}
}
