package sdk

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// Sentinels of Lock.Err (and of context.Cause(Lock.Context())).
var (
	// ErrLost: the lock can no longer be assumed held. Either a renewal
	// was refused (the lock is gone: it expired or was released), or no
	// renewal succeeded before Deadline minus the safety margin.
	ErrLost = errors.New("ticketd: lock lost")
	// ErrReleased: Release was called.
	ErrReleased = errors.New("ticketd: lock released")
)

// Keepalive defaults.
const (
	// DefaultMarginFraction of the lease is the default safety margin,
	// bounded by MinDefaultMargin and MaxDefaultMargin.
	DefaultMarginFraction = 10
	MinDefaultMargin      = 20 * time.Millisecond
	MaxDefaultMargin      = time.Second
	// renewsPerWindow: a keepalive renews every (lease-margin)/3, so two
	// more attempts fit before Lost fires if one renewal fails.
	renewsPerWindow = 3
)

// lifecycle is the part of a Lock that Context, Lost, KeepAlive and the
// watchdog share; Lock.mu guards it. Nothing is allocated until one of
// them is used.
type lifecycle struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}
	err    error         // why the lock ended; nil while held
	margin time.Duration // Lost fires at deadline - margin
	timer  *time.Timer   // the watchdog, once armed
	// kaStop stops the keepalive goroutine, if one runs.
	kaStop context.CancelFunc
	// lastErr is the last renewal failure, for the lost message.
	lastErr error
}

// KeepAliveOption configures KeepAlive and WithAutoRenew.
type KeepAliveOption func(*keepAliveConfig)

type keepAliveConfig struct {
	margin    time.Duration
	marginSet bool
	interval  time.Duration
}

// WithSafetyMargin makes Lost fire (and Context end) margin before
// Deadline when renewals keep failing, instead of the default (a tenth of
// the lease, within [MinDefaultMargin, MaxDefaultMargin]). Choose it to
// cover the time your code needs to stop touching the protected resource.
// It must be positive and at most three quarters of the lease.
func WithSafetyMargin(margin time.Duration) KeepAliveOption {
	return func(k *keepAliveConfig) { k.margin, k.marginSet = margin, true }
}

// WithAutoRenew makes Acquire start KeepAlive on the lock it returns. If
// the grant came so late (after a long wait) that its first renewal is
// due, Acquire renews before returning, and if that renewal is refused,
// or fails with the lock's deadline too near, it releases the grant and
// returns the error.
func WithAutoRenew(opts ...KeepAliveOption) AcquireOption {
	return func(o *acquireOptions) { o.autoRenew, o.keepAlive = true, opts }
}

func defaultMargin(lease time.Duration) time.Duration {
	return min(max(lease/DefaultMarginFraction, MinDefaultMargin), MaxDefaultMargin)
}

func newKeepAliveConfig(lease time.Duration, opts []KeepAliveOption) (keepAliveConfig, error) {
	k := keepAliveConfig{}
	for _, o := range opts {
		o(&k)
	}
	if !k.marginSet {
		k.margin = defaultMargin(lease)
	}
	// A margin of 0 would let Lost fire at the deadline rather than
	// before it.
	if k.margin <= 0 || k.margin > lease*3/4 {
		return k, fmt.Errorf("safety margin %v is outside (0, 3/4 of the lease %v]", k.margin, lease)
	}
	k.interval = (lease - k.margin) / renewsPerWindow
	return k, nil
}

// Context returns a context that is cancelled when the lock ends: when
// Lost fires or Release is called. context.Cause tells why (it matches
// ErrLost or ErrReleased). Without KeepAlive it ends at Deadline minus
// the safety margin. Pass it to the work the lock protects.
func (l *Lock) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.initLocked()
	return l.life.ctx
}

// Lost returns a channel that is closed when the lock can no longer be
// assumed held: a renewal was refused, no renewal succeeded before
// Deadline minus the safety margin (without KeepAlive: simply then), or
// Release was called. It is always closed before Deadline. Err says why.
func (l *Lock) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.initLocked()
	return l.life.lost
}

// Err is nil while the lock is held, and afterwards an error matching
// ErrLost or ErrReleased.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.life.err
}

// KeepAlive renews the lock in the background every (lease - margin)/3
// after the last successful renewal, retrying failures that leave the
// lock in place (no leader, a lost reply) until Deadline minus the
// safety margin; then, or at once when a renewal is refused (the lock is
// gone), it ends the lock: Lost is closed and Context cancelled, before
// Deadline. Release stops it, and so does ctx (then Lost still fires
// before Deadline, as the lock is no longer renewed). It fails if the
// lock has ended or a keepalive already runs.
func (l *Lock) KeepAlive(ctx context.Context, opts ...KeepAliveOption) error {
	if l.client == nil {
		return &Error{Code: protocol.CodeInvalidArgument, Message: "lock has no client", Op: "renew", Key: l.Key}
	}
	if l.session != nil {
		return errSessionLock(l.Key)
	}
	l.mu.Lock()
	lease := l.lease
	l.mu.Unlock()
	k, err := newKeepAliveConfig(lease, opts)
	if err != nil {
		return &Error{Code: protocol.CodeInvalidArgument, Message: err.Error(), Op: "renew", Key: l.Key}
	}
	return l.startKeepAlive(ctx, k)
}

func (l *Lock) startKeepAlive(ctx context.Context, k keepAliveConfig) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.life.err != nil {
		return l.life.err
	}
	if l.life.kaStop != nil {
		return fmt.Errorf("ticketd: lock %q: a keepalive already runs", l.Key)
	}
	if err := l.client.bg.addLock(l); err != nil {
		return fmt.Errorf("ticketd: lock %q: %w", l.Key, err)
	}
	l.initLocked()
	l.life.margin = k.margin
	l.rearmLocked()
	kctx, stop := context.WithCancel(ctx)
	l.life.kaStop = stop
	go l.keepAlive(kctx, k)
	return nil
}

// startAutoRenew is WithAutoRenew's part of Acquire.
func (l *Lock) startAutoRenew(ctx context.Context, k keepAliveConfig) error {
	l.mu.Lock()
	due := !l.now().Before(l.renewedAt.Add(k.interval))
	l.mu.Unlock()
	if due {
		if err := l.Renew(ctx); err != nil && (renewalRefused(err) || l.Remaining() <= k.margin) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
			_ = l.Release(rctx)
			cancel()
			return fmt.Errorf("ticketd: acquire %q: granted too late to use, or its renewal was refused (the grant was released): %w", l.Key, err)
		}
	}
	if err := l.startKeepAlive(context.Background(), k); err != nil {
		// The client was closed during the acquire: nothing will renew
		// the grant, so give it back (over a connection Close left open).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
		_ = l.Release(rctx)
		cancel()
		return fmt.Errorf("ticketd: acquire %q: granted, but not renewed (the grant was released, or expires within its lease): %w", l.Key, err)
	}
	return nil
}

// keepAlive is the renewal loop; it returns when the lock ends or ctx is
// done.
func (l *Lock) keepAlive(ctx context.Context, k keepAliveConfig) {
	defer l.client.bg.dropLock(l)
	for {
		l.mu.Lock()
		next, lost := l.renewedAt.Add(k.interval), l.life.lost
		l.mu.Unlock()
		t := time.NewTimer(max(next.Sub(l.now()), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-lost:
			t.Stop()
			return
		case <-t.C:
		}
		if !l.renewBeforeLost(ctx, k) {
			return
		}
	}
}

// renewBeforeLost renews once, retrying while it is worth it; it reports
// whether the lock was renewed.
func (l *Lock) renewBeforeLost(ctx context.Context, k keepAliveConfig) bool {
	for n := 0; ; n++ {
		l.mu.Lock()
		now := l.now()
		left, ended, lost := l.deadline.Add(-k.margin).Sub(now), l.life.err != nil, l.life.lost
		l.mu.Unlock()
		if ended || left <= 0 || ctx.Err() != nil {
			return false // the watchdog ends the lock in time
		}
		// At most the client's bound of renewals in flight: one that finds
		// them all taken waits its turn until the lock's loss deadline.
		// The watchdog, not this loop, ends the lock: the reason to show
		// is set before the wait.
		slots := l.client.renewSlots
		if !slots.take(ctx, 0) {
			l.mu.Lock()
			l.life.lastErr = errNoSlot("lock renewals", l.client.cfg.keepAlivesInFlight)
			l.mu.Unlock()
			if !slots.take(ctx, left) {
				return false // the watchdog ends the lock in time
			}
		}
		// One attempt waits at most an interval: a leader that died with
		// our request is better retried than waited for.
		rctx, cancel := context.WithTimeout(ctx, min(left-l.now().Sub(now), max(k.interval, MinRequestTimeout)))
		err := l.Renew(rctx)
		cancel()
		slots.give()
		if err == nil {
			return true
		}
		l.mu.Lock()
		l.life.lastErr = err
		l.mu.Unlock()
		if renewalRefused(err) {
			l.end(fmt.Errorf("%w: renewal refused: %w", ErrLost, err))
			return false
		}
		t := time.NewTimer(l.client.backoff(n))
		select {
		case <-ctx.Done():
		case <-lost:
		case <-t.C:
		}
		t.Stop()
	}
}

// renewalRefused reports whether err says the lock cannot be renewed at
// all (it is gone, or the request can never succeed), as opposed to "not
// now".
func renewalRefused(err error) bool {
	switch CodeOf(err) {
	case protocol.CodeNotFound, protocol.CodeInvalidArgument, protocol.CodePermissionDenied,
		protocol.CodeDenied, protocol.CodeMalformed, protocol.CodeTooLarge:
		return true
	}
	return false
}

// initLocked makes Context and Lost and arms the watchdog; l.mu is held.
func (l *Lock) initLocked() {
	if l.life.lost != nil {
		return
	}
	l.life.ctx, l.life.cancel = context.WithCancelCause(context.Background())
	l.life.lost = make(chan struct{})
	l.life.margin = defaultMargin(l.lease)
	if l.life.err != nil {
		close(l.life.lost)
		l.life.cancel(l.life.err)
		return
	}
	if l.session != nil {
		go l.followSession(l.life.lost) // session.go: the session's keepalive is the watchdog
		return
	}
	l.rearmLocked()
}

// rearmLocked sets the watchdog to Deadline minus the margin; l.mu is
// held. It does nothing before Context, Lost or KeepAlive armed it.
func (l *Lock) rearmLocked() {
	if l.life.lost == nil || l.life.err != nil || l.session != nil {
		return
	}
	d := l.deadline.Add(-l.life.margin).Sub(l.now())
	if l.life.timer == nil {
		l.life.timer = time.AfterFunc(d, l.watchdog)
		return
	}
	l.life.timer.Reset(d)
}

// watchdog ends the lock when Deadline minus the margin has come (a
// renewal may have moved it since the timer was set).
func (l *Lock) watchdog() {
	l.mu.Lock()
	left := l.deadline.Add(-l.life.margin).Sub(l.now())
	margin, last := l.life.margin, l.life.lastErr
	if left > 0 {
		l.rearmLocked()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if last == nil {
		l.end(fmt.Errorf("%w: not renewed %v before its deadline", ErrLost, margin))
		return
	}
	l.end(fmt.Errorf("%w: not renewed %v before its deadline; last renewal error: %w", ErrLost, margin, last))
}

// end ends the lock for why (the first reason wins): it closes Lost,
// cancels Context and stops the keepalive and the watchdog.
func (l *Lock) end(why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.life.err != nil {
		return
	}
	l.life.err = why
	if l.life.timer != nil {
		l.life.timer.Stop()
	}
	if l.life.kaStop != nil {
		l.life.kaStop()
	}
	if l.life.lost != nil {
		close(l.life.lost)
		l.life.cancel(why)
	}
}
