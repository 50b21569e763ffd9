package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Sessions (docs/protocol.md §11; cluster version 4): one keepalive for
// many locks. NewSession opens one and keeps it alive in the background;
// Session.Acquire takes locks that last until released or until the
// session ends. The keepalive gives the guarantee WithAutoRenew gives a
// lock: Done is closed before Deadline (by the safety margin) when
// keepalives keep failing, so a holder that stops when Done closes never
// acts past the server's expiry of its session; a keepalive answered
// not_found (the session has ended) closes it at once.

// DefaultSessionTTL is the TTL of a NewSession without WithSessionTTL.
const DefaultSessionTTL = 10 * time.Second

// ErrSessionClosed: Close was called (Session.Err, and the Err of its
// locks).
var ErrSessionClosed = errors.New("ticketd: session closed")

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl, lockDelay time.Duration
	keepAlive      []KeepAliveOption
}

// WithSessionTTL sets the session's TTL (default DefaultSessionTTL),
// between core.MinSessionTTL and core.MaxSessionTTL: how long the
// session lives on the server without a keepalive.
func WithSessionTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// WithSessionLockDelay sets the lock-delay of the session's locks (default
// 0, at most core.MaxLockDelay): when the session expires, each of its
// keys stays unavailable that long, so that work the failed holder left
// in flight drains first. A Close frees them at once.
func WithSessionLockDelay(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.lockDelay = d }
}

// WithSessionKeepAlive sets the keepalive's options (WithSafetyMargin),
// as for a lock's KeepAlive, with the TTL as the lease.
func WithSessionKeepAlive(opts ...KeepAliveOption) SessionOption {
	return func(o *sessionOptions) { o.keepAlive = opts }
}

// Session is an open session and its background keepalive. Its fields are
// read-only.
type Session struct {
	// ID is the session's ID, assigned by the cluster, never reused.
	ID        string
	TTL       time.Duration
	LockDelay time.Duration

	client *Client
	ka     keepAliveConfig
	stop   context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	deadline time.Time // the send of the open or the last acknowledged keepalive, plus TTL
	sentAt   time.Time // that send
	lastErr  error
	err      error
}

// NewSession opens a session of the client's identity and keeps it alive
// until Close, or until it cannot: then Done is closed (before Deadline)
// and Err says why. A partitioned client (WithPartitioned) gets
// ErrUnsupported: partitioned deployments do not serve sessions
// (docs/scaling.md). The open is not retried after a lost reply (the
// error is then indeterminate: a session may have been opened, and it
// expires after its TTL since nobody keeps it alive).
func NewSession(ctx context.Context, c *Client, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: DefaultSessionTTL}
	for _, opt := range opts {
		opt(&o)
	}
	bad := func(format string, args ...any) error {
		return &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: protocol.SessionOpOpen}
	}
	ttl, delay := o.ttl.Truncate(time.Millisecond), o.lockDelay.Truncate(time.Millisecond)
	if ttl < core.MinSessionTTL || ttl > core.MaxSessionTTL {
		return nil, bad("session TTL %v is outside [%v, %v]", o.ttl, core.MinSessionTTL, core.MaxSessionTTL)
	}
	if delay < 0 || delay > core.MaxLockDelay {
		return nil, bad("lock delay %v is outside [0, %v]", o.lockDelay, core.MaxLockDelay)
	}
	ka, err := newKeepAliveConfig(ttl, o.keepAlive)
	if err != nil {
		return nil, bad("%v", err)
	}
	if c.bg.isClosed() {
		return nil, fmt.Errorf("ticketd: %s: %w", protocol.SessionOpOpen, ErrClientClosed)
	}
	if c.cfg.partitioned {
		return nil, &Error{Code: protocol.CodeUnsupported, Op: protocol.SessionOpOpen,
			Message: "a partitioned deployment does not serve sessions (docs/scaling.md): hold locks with leases"}
	}
	body, _ := json.Marshal(protocol.SessionOpenRequest{TTLMS: ttl.Milliseconds(), LockDelayMS: delay.Milliseconds()})
	r := &request{op: protocol.SessionOpOpen, subject: protocol.SubjectSessionOpen}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	var or protocol.SessionOpenReply
	if err := json.Unmarshal(rep.data, &or); err != nil || or.TTLMS <= 0 {
		return nil, c.indeterminate(r, fmt.Sprintf("invalid session open reply %.200q", rep.data), err)
	}
	if _, err := protocol.ParseSessionID(or.Session); err != nil {
		return nil, c.indeterminate(r, fmt.Sprintf("invalid session ID in %.200q", rep.data), nil)
	}
	granted := min(ttl, time.Duration(or.TTLMS)*time.Millisecond)
	kctx, stop := context.WithCancel(context.Background())
	s := &Session{ID: or.Session, TTL: granted, LockDelay: delay, client: c, ka: ka, stop: stop, done: make(chan struct{}),
		deadline: rep.sent.Add(granted), sentAt: rep.sent}
	if err := c.bg.addSession(s); err != nil {
		// Closed while the open was in flight: nobody keeps it alive.
		stop()
		return nil, fmt.Errorf("ticketd: %s: session %s was opened, and expires within its TTL (%v): %w", protocol.SessionOpOpen, s.ID, granted, err)
	}
	s.wg.Add(1)
	go s.keepAlive(kctx)
	return s, nil
}

// Deadline is the local moment after which the session must be assumed
// ended: the send time of the open or of the last acknowledged keepalive
// plus the TTL (the server restarted its timer after that send). It
// never moves back.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Done is closed when the session can no longer be assumed alive (a
// keepalive found it ended, or none succeeded before Deadline minus the
// safety margin), or when Close is called. It is closed before Deadline.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then an error matching ErrLost or
// ErrSessionClosed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// end ends the session locally for why (the first reason wins).
func (s *Session) end(why error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = why
	s.stop()
	close(s.done)
	s.mu.Unlock()
	s.client.bg.dropSession(s)
}

// keepAliveAlign is the grid a client's session keepalives go out on:
// each is sent at the last multiple of it (counted from the client's
// creation) before it is due, less than one step and at most a twentieth
// of the interval early. A client that holds many sessions then sends the
// keepalives that fall due close together at the same moment, and they
// share what a lone keepalive pays alone: the client's and the NATS
// servers' writes and goroutine wake-ups, the node's and the client's
// (BenchmarkSessionKeepAlives: 500 sessions at about 500 keepalives a
// second cost the process about a quarter less CPU per keepalive than
// with each sent exactly when due). Early is always safe: a keepalive
// only ever moves the session's deadline later. It adds at most about a
// twentieth to the keepalive rate, and at a 60 s TTL (one every 19.7 s)
// at most 0.1%. 20 ms is also how long the node holds a keepalive's
// ReadIndex for others to share its round (lockservice keepAliveReadHold).
const keepAliveAlign = 20 * time.Millisecond

// alignKeepAlive is when to send a keepalive due at next: next moved back
// to the client's keepalive grid, by less than one step of it and at most
// interval/20.
func (c *Client) alignKeepAlive(next time.Time, interval time.Duration) time.Time {
	step := min(c.cfg.keepAliveAlign, interval/20)
	since := next.Sub(c.epoch)
	if step <= 0 || since < 0 {
		return next
	}
	return next.Add(-(since % step))
}

// keepAlive sends a keepalive every interval after the last acknowledged
// one (on the client's keepalive grid: alignKeepAlive), within the
// client's bound of keepalives in flight (WithKeepAlivesInFlight); it
// ends the session when one is refused or Deadline minus the margin comes
// without one.
func (s *Session) keepAlive(ctx context.Context) {
	defer s.wg.Done()
	c := s.client
	for n := 0; ; {
		s.mu.Lock()
		next, lost := s.sentAt.Add(s.ka.interval), s.deadline.Add(-s.ka.margin)
		s.mu.Unlock()
		now := c.cfg.clock.Now()
		if !now.Before(lost) {
			s.mu.Lock()
			last := s.lastErr
			s.mu.Unlock()
			s.end(fmt.Errorf("%w: session %s not kept alive %v before its deadline (last error: %v)", ErrLost, s.ID, s.ka.margin, last))
			return
		}
		wait := c.alignKeepAlive(next, s.ka.interval).Sub(now)
		if n > 0 {
			wait = c.backoff(n)
		}
		t := time.NewTimer(max(0, min(wait, lost.Sub(now))))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !c.cfg.clock.Now().Before(lost) {
			continue // the check above ends it
		}
		// At most the client's bound of keepalives in flight: one that
		// finds them all taken waits its turn until lost, no longer.
		if !c.keepAliveSlots.take(ctx, lost.Sub(c.cfg.clock.Now())) {
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			s.lastErr = errNoSlot("session keepalives", c.cfg.keepAlivesInFlight)
			s.mu.Unlock()
			continue // lost has come: the check above ends it
		}
		rctx, cancel := context.WithTimeout(ctx, min(lost.Sub(c.cfg.clock.Now()), max(s.ka.interval, MinRequestTimeout)))
		err := s.keepAliveOnce(rctx)
		cancel()
		c.keepAliveSlots.give()
		switch {
		case err == nil:
			n = 0
		case ctx.Err() != nil:
			return
		case renewalRefused(err):
			s.end(fmt.Errorf("%w: session %s: keepalive refused: %w", ErrLost, s.ID, err))
			return
		default:
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			n++
		}
	}
}

// keepAliveOnce sends one keepalive; on success the deadline moves to its
// send time plus the TTL.
func (s *Session) keepAliveOnce(ctx context.Context) error {
	c := s.client
	body, _ := json.Marshal(protocol.SessionRequest{Session: s.ID})
	// A keepalive only restarts a timer: sending it again after a lost
	// reply is harmless (readOnly's retry rule).
	r := &request{op: protocol.SessionOpKeepAlive, subject: protocol.SubjectSessionKeepAlive, readOnly: true}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	var kr protocol.SessionKeepAliveReply
	if err := json.Unmarshal(rep.data, &kr); err != nil || kr.TTLMS <= 0 {
		return c.newError(r, protocol.CodeMalformed, fmt.Sprintf("invalid keepalive reply %.200q", rep.data), err)
	}
	ttl := min(s.TTL, time.Duration(kr.TTLMS)*time.Millisecond)
	s.mu.Lock()
	if d := rep.sent.Add(ttl); d.After(s.deadline) {
		s.deadline, s.sentAt = d, rep.sent
	}
	s.mu.Unlock()
	return nil
}

// Close stops the keepalive and closes the session, releasing every lock
// of it in one command; it returns how many. Done is closed and Err is
// ErrSessionClosed, even when the close fails (then the session expires
// after its TTL, and its locks with it). A session that had already
// ended gives ErrNotFound.
func (s *Session) Close(ctx context.Context) (int, error) {
	s.end(ErrSessionClosed)
	s.wg.Wait()
	c := s.client
	body, _ := json.Marshal(protocol.SessionRequest{Session: s.ID})
	r := &request{op: protocol.SessionOpClose, subject: protocol.SubjectSessionClose}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return 0, err
	}
	var cr protocol.SessionCloseReply
	if err := json.Unmarshal(rep.data, &cr); err != nil {
		return 0, c.indeterminate(r, fmt.Sprintf("invalid session close reply %.200q", rep.data), err)
	}
	return cr.Released, nil
}

// Acquire takes the lock on key in the session: it is held until
// released or until the session ends (no lease of its own; WithLease and
// WithAutoRenew do not apply). The Lock's Deadline is the session's, and
// its Lost and Context end when the session's Done closes. Everything
// else is Client.Acquire's (waits, retry-safety, the lost-reply rules).
func (s *Session) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	select {
	case <-s.done:
		return nil, &Error{Code: protocol.CodeNotFound, Op: "acquire", Key: key, Message: fmt.Sprintf("session %s has ended: %v", s.ID, s.Err()), Err: s.Err()}
	default:
	}
	o := acquireOptions{lease: core.MinLease}
	for _, opt := range opts {
		opt(&o)
	}
	if o.autoRenew {
		return nil, &Error{Code: protocol.CodeInvalidArgument, Op: "acquire", Key: key, Message: "a lock in a session has no lease to renew: the session's keepalive holds it"}
	}
	if err := o.validate(key, core.MinLease); err != nil {
		return nil, err
	}
	o.session = s
	l, err := s.client.acquire(ctx, key, 0, o)
	if err != nil {
		return nil, err
	}
	l.session, l.Lease = s, 0
	return l, nil
}

// followSession ends the lock when its session ends (or the lock ends
// first: lost is closed).
func (l *Lock) followSession(lost <-chan struct{}) {
	select {
	case <-l.session.Done():
		err := l.session.Err()
		if errors.Is(err, ErrSessionClosed) {
			l.end(fmt.Errorf("%w: its session %s was closed: %w", ErrReleased, l.session.ID, err))
			return
		}
		l.end(fmt.Errorf("%w: its session %s ended: %w", ErrLost, l.session.ID, err))
	case <-lost:
	}
}

func errSessionLock(key string) error {
	return &Error{Code: protocol.CodeInvalidArgument, Op: "renew", Key: key, Message: "a lock in a session has no lease of its own: its session's keepalive holds it"}
}

// NewElection prepares candidate id for the election on key (as
// NewElection) with its terms held in the session: the leader's lock is
// kept by the session's keepalive, with the session's other locks, and a
// leader whose session ends loses its term (Lost, Context). Campaign
// returns once the session has ended.
func (s *Session) NewElection(key, id string) (*Election, error) {
	e, err := NewElection(s.client, key, id, core.MinLease)
	if err != nil {
		return nil, err
	}
	e.session = s
	return e, nil
}
