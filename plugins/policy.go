package plugins

import (
	"context"
	"errors"

	"github.com/ticketd/ticketd/core"
)

// Grant is what a policy decides on: a Grant the leader is about to
// propose (or a renewal that lengthens a lease, with the holder's kind).
type Grant struct {
	Key   string
	Owner string
	// Identity is who the transport authenticated for the request
	// ("ACCOUNT" or "ACCOUNT/user", "" when none); unlike Owner, a client
	// cannot choose it.
	Identity string
	LeaseMS  uint64
	// Limit and Mode are the lock's kind (core/kinds.go): Limit 0 a mutex
	// or read/write lock, 2..core.MaxSemaphoreLimit a semaphore slot;
	// Mode core.ModeShared a shared hold. Modules of ABI version 1 never
	// see them (README.md).
	Limit uint32
	Mode  core.Mode
}

// Policy decides whether a Grant may be proposed. Implementations fail
// closed: when err is non-nil the Verdict denies.
type Policy interface {
	ValidateGrant(ctx context.Context, g Grant) (Verdict, error)
}

// Auditor observes applied commands and returns audit events.
type Auditor interface {
	OnApplied(ctx context.Context, index uint64, cmd core.Command, res core.Result) ([]Event, error)
}

var (
	_ Policy  = (*Set)(nil)
	_ Auditor = (*Set)(nil)
)

// Set is an ordered set of loaded plugins acting as one Policy and one
// Auditor. It is safe for concurrent use.
type Set struct {
	plugins []*Plugin
}

// NewSet returns a Set of plugins, in order. The Set takes ownership:
// Close closes them.
func NewSet(plugins ...*Plugin) *Set {
	return &Set{plugins: append([]*Plugin(nil), plugins...)}
}

// Plugins returns the plugins in order.
func (s *Set) Plugins() []*Plugin { return append([]*Plugin(nil), s.plugins...) }

// ValidateGrant asks every policy plugin in order and stops at the first
// that denies or fails; a Grant is allowed only if all allow. A Set with
// no policy plugin allows everything. A failure denies (fail closed) and
// returns the plugin's error.
func (s *Set) ValidateGrant(ctx context.Context, g Grant) (Verdict, error) {
	for _, p := range s.plugins {
		if !p.HasPolicy() {
			continue
		}
		v, err := p.ValidateGrant(ctx, g)
		if err != nil || !v.Allow {
			return v, err
		}
	}
	return Verdict{Allow: true}, nil
}

// OnApplied runs every audit plugin in order and returns all their events
// in that order. A failing plugin does not stop the others: its error is
// joined into the returned error and the other plugins' events are still
// returned.
func (s *Set) OnApplied(ctx context.Context, index uint64, cmd core.Command, res core.Result) ([]Event, error) {
	var (
		out  []Event
		errs []error
	)
	for _, p := range s.plugins {
		if !p.HasAudit() {
			continue
		}
		evs, err := p.OnApplied(ctx, index, cmd, res)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, evs...)
	}
	return out, errors.Join(errs...)
}

// Close closes every plugin.
func (s *Set) Close(ctx context.Context) error {
	var errs []error
	for _, p := range s.plugins {
		errs = append(errs, p.Close(ctx))
	}
	return errors.Join(errs...)
}
