package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Observe re-reads the key at least this often (bounded by the lease), so
// a change whose event was missed is seen.
const (
	minObserveResync = time.Second
	maxObserveResync = 30 * time.Second
)

// errNotLeader ends the Context of an Election that holds no term.
var errNotLeader = errors.New("ticketd: not the leader")

// Election is leader election on one key: the leader is the holder of
// the key's lock, candidates wait in the key's FIFO queue, and the lock's
// fencing token numbers the term. Pass Token to everything the leader
// writes, so a resource can refuse an older leader's writes.
type Election struct {
	c         *Client
	key, id   string
	lease     time.Duration
	keepAlive []KeepAliveOption
	// session, if set, holds the terms (Session.NewElection).
	session *Session

	// mu guards lock: Campaign and Resign write it, the getters read it.
	mu   sync.Mutex
	lock *Lock
}

// NewElection prepares candidate id (recorded as the lock's owner, so
// Leader and Observe show it) for the election on key. The leader's lock
// has lease and is kept alive with opts (see KeepAlive); a leader that
// dies is replaced within lease.
func NewElection(c *Client, key, id string, lease time.Duration, opts ...KeepAliveOption) (*Election, error) {
	bad := func(format string, args ...any) (*Election, error) {
		return nil, &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: "campaign", Key: key}
	}
	if c == nil {
		return bad("nil client")
	}
	if err := core.ValidateKey(key); err != nil {
		return bad("%s", detail(err))
	}
	if err := core.ValidateOwner(id); err != nil {
		return bad("%s", detail(err))
	}
	if lease < core.MinLease || lease > core.MaxLease {
		return bad("lease %v is outside [%v, %v]", lease, core.MinLease, core.MaxLease)
	}
	if _, err := newKeepAliveConfig(lease.Truncate(time.Millisecond), opts); err != nil {
		return bad("%v", err)
	}
	return &Election{c: c, key: key, id: id, lease: lease, keepAlive: opts}, nil
}

// Campaign waits in the key's queue until this candidate is elected, and
// then keeps its lease alive until Resign or until the term is lost
// (Lost, Context). It re-waits when a wait runs out (protocol.MaxWait) or
// the cluster is unavailable, and returns only when elected (nil), when
// ctx ends, or on an error that waiting again cannot fix (denied,
// permission_denied, ...). ctx bounds the campaign, not the term.
func (e *Election) Campaign(ctx context.Context) error {
	e.mu.Lock()
	leading := e.lock != nil && e.lock.Err() == nil
	e.mu.Unlock()
	if leading {
		return fmt.Errorf("ticketd: campaign %q: already the leader", e.key)
	}
	for n := 0; ; n++ {
		var l *Lock
		var err error
		if e.session != nil {
			l, err = e.session.Acquire(ctx, e.key, WithWait(protocol.MaxWait), WithOwner(e.id))
			if errors.Is(err, ErrNotFound) {
				return fmt.Errorf("ticketd: campaign %q: the session has ended: %w", e.key, err)
			}
		} else {
			l, err = e.c.Acquire(ctx, e.key, WithWait(protocol.MaxWait), WithLease(e.lease),
				WithOwner(e.id), WithAutoRenew(e.keepAlive...))
		}
		if err == nil {
			e.mu.Lock()
			e.lock = l
			e.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ticketd: campaign %q: %w", e.key, err)
		}
		switch {
		case errors.Is(err, ErrTimeout):
			continue // the longest wait ran out: queue again
		case errors.Is(err, ErrUnavailable), IsIndeterminate(err), errors.Is(err, ErrInternal),
			errors.Is(err, ErrResourceExhausted), errors.Is(err, ErrNotFound):
			// Not now. An indeterminate grant of ours (if any) is released
			// or expires within its lease; we queue behind it.
			e.c.cfg.logger.Debug("ticketd: campaign retrying", "key", e.key, "err", err)
			if err := sleepCtx(ctx, e.c.backoff(min(n, 10))); err != nil {
				return fmt.Errorf("ticketd: campaign %q: %w", e.key, err)
			}
		default:
			return err
		}
	}
}

// term is the lock of the current term, or nil.
func (e *Election) term() *Lock {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lock
}

// Token is the fencing token of the current term, or 0 if this candidate
// was never elected. It stays the last term's token after the term ended;
// check Lost or Context.
func (e *Election) Token() uint64 {
	if l := e.term(); l != nil {
		return l.Token
	}
	return 0
}

// Lock is the current term's lock (nil before the first election).
func (e *Election) Lock() *Lock { return e.term() }

// Context is cancelled when the current term ends (see Lock.Context); it
// is already cancelled when this candidate is not elected.
func (e *Election) Context() context.Context {
	if l := e.term(); l != nil {
		return l.Context()
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errNotLeader)
	return ctx
}

// Lost is closed when the current term ends (see Lock.Lost); it is
// already closed when this candidate is not elected.
func (e *Election) Lost() <-chan struct{} {
	if l := e.term(); l != nil {
		return l.Lost()
	}
	ch := make(chan struct{})
	close(ch)
	return ch
}

// Resign ends the current term and releases the key, so the next
// candidate in the queue is elected at once. It does nothing when this
// candidate does not lead.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	l := e.lock
	e.mu.Unlock()
	if l == nil || l.Err() != nil {
		return nil
	}
	err := l.Release(ctx)
	if errors.Is(err, ErrNotFound) {
		return nil // the term had ended on the server already
	}
	return err
}

// Leader reads the current leader: the key's holder (Held false when
// there is none); Owner is the leader's candidate id.
func (e *Election) Leader(ctx context.Context) (Holder, error) {
	return e.c.Get(ctx, e.key)
}

// Observe delivers the leader (as Leader reads it) now and after every
// change, until ctx ends; then it closes the channel. It follows the
// key's watch events and re-reads the key with get when an event does not
// follow from the last leader it knew and at least every lease (within
// [1s, 30s]), so a missed event delays a change, never loses it. Terms
// only move forward: a holder with a lower token than one already
// delivered is not delivered.
func (e *Election) Observe(ctx context.Context) (<-chan Holder, error) {
	events, err := e.c.Watch(ctx, e.key)
	if err != nil {
		return nil, err
	}
	o := &observer{e: e, ctx: ctx, out: make(chan Holder, 16)}
	go o.run(events)
	return o.out, nil
}

// observer is one Observe loop.
type observer struct {
	e     *Election
	ctx   context.Context
	out   chan Holder
	cur   Holder
	known bool
}

func (o *observer) run(events <-chan WatchEvent) {
	defer close(o.out)
	tick := time.NewTicker(min(max(o.e.lease, minObserveResync), maxObserveResync))
	defer tick.Stop()
	if !o.resync() {
		return
	}
	for {
		ok := true
		select {
		case <-o.ctx.Done():
			return
		case ev, open := <-events:
			if !open {
				return
			}
			ok = o.apply(ev)
		case <-tick.C:
			ok = o.resync()
		}
		if !ok {
			return
		}
	}
}

// apply follows one event; it reports false when ctx ended.
func (o *observer) apply(ev WatchEvent) bool {
	if ev.Token == 0 && ev.Session != "" {
		// A session's close or expiry ended the lock, from a server
		// that sent token 0 for it (newer ones send the token): the
		// current holder's end if it is that session's, otherwise read
		// the key.
		if o.known && o.cur.Held && o.cur.Session == ev.Session {
			return o.emit(Holder{Key: ev.Key, Token: o.cur.Token})
		}
		return o.resync()
	}
	if o.known && ev.Token < o.cur.Token {
		return true // older than what we know
	}
	switch ev.Type {
	case protocol.EventGrant:
		return o.emit(Holder{Key: ev.Key, Held: true, Token: ev.Token, Owner: ev.Owner, Lease: eventLease(ev), Session: ev.Session})
	case protocol.EventRelease, protocol.EventExpire:
		if o.known && o.cur.Held && o.cur.Token == ev.Token {
			return o.emit(Holder{Key: ev.Key, Token: ev.Token})
		}
	case protocol.EventRenew:
		if o.known && o.cur.Held && o.cur.Token == ev.Token {
			return true
		}
	}
	return o.resync() // an event we cannot place: read the key
}

// resync reads the key; it reports false when ctx ended.
func (o *observer) resync() bool {
	h, err := o.e.c.Get(o.ctx, o.e.key)
	if err != nil {
		return o.ctx.Err() == nil // try again at the next event or tick
	}
	if o.known && h.Held && h.Token < o.cur.Token {
		return true
	}
	return o.emit(h)
}

// emit delivers h if it differs from the last delivered leader.
func (o *observer) emit(h Holder) bool {
	if o.known && h.Held == o.cur.Held && (h.Token == o.cur.Token || !h.Held) {
		return true
	}
	o.cur, o.known = h, true
	select {
	case o.out <- h:
		return true
	case <-o.ctx.Done():
		return false
	}
}
