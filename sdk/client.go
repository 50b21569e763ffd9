package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Defaults of the client options.
const (
	// DefaultRequestTimeout is how long one request waits for its reply
	// (for an acquire that waits in the queue: on top of the wait).
	DefaultRequestTimeout = 5 * time.Second
	// MinRequestTimeout is the shortest request timeout New accepts.
	MinRequestTimeout = 10 * time.Millisecond
	// DefaultBackoffMin and DefaultBackoffMax bound the pause between two
	// attempts of a retried request.
	DefaultBackoffMin = 25 * time.Millisecond
	DefaultBackoffMax = time.Second
	// DefaultRetryBudget bounds how long an operation keeps retrying when
	// its context has no deadline.
	DefaultRetryBudget = 30 * time.Second
)

// replyGrace is how much longer than the timeout_ms it declares the SDK
// waits for an acquire reply, so that a grant applied just before the
// server's deadline still reaches us (capped at half the request timeout).
const replyGrace = 100 * time.Millisecond

// minReplyMargin is the least time between the end of the wait and the
// reply deadline that the SDK leaves the server for committing a grant
// (capped just below half the request timeout). When the context deadline is too
// close for the requested wait plus this margin, the wait is shortened.
const minReplyMargin = 250 * time.Millisecond

// Clock tells the time. Lock uses it for Deadline, Valid and Remaining;
// tests may replace it with WithClock. Its Now must carry a monotonic
// reading (time.Now does) for deadlines to be immune to wall-clock jumps.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

type config struct {
	requestTimeout time.Duration
	backoffMin     time.Duration
	backoffMax     time.Duration
	retryBudget    time.Duration
	logger         *slog.Logger
	clock          Clock
	natsOpts       []nats.Option
	auth           Auth
	// partitioned: keyed requests go on the key's hashed subject and lists
	// ask every group (partition.go).
	partitioned bool
	// attemptHook, when set, is called after every attempt (tests).
	attemptHook func(op string, attempt int, err error)
	// keepAliveAlign is the grid session keepalives are sent on
	// (session.go alignKeepAlive); 0 sends each exactly when due (tests
	// and benchmarks compare the two).
	keepAliveAlign time.Duration
	// keepAlivesInFlight bounds session keepalives, and separately
	// background renewals, in flight (inflight.go).
	keepAlivesInFlight int
}

// Option configures a Client.
type Option func(*config)

// WithRequestTimeout sets how long one request waits for its reply
// (default DefaultRequestTimeout, at least MinRequestTimeout). For an acquire with WithWait(w) the SDK
// waits w plus this for the reply, and declares slightly less than that
// as timeout_ms. A context deadline that comes earlier wins.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) { c.requestTimeout = d }
}

// WithRetryBackoff sets the bounds of the exponential backoff between two
// attempts of a retried request: the n-th pause is drawn uniformly from
// [min, min(max, min·2ⁿ)].
func WithRetryBackoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// WithRetryBudget bounds how long one operation keeps retrying when its
// context has no deadline (default DefaultRetryBudget; 0 means retry
// until the context is done). With a context deadline, the deadline alone
// bounds the retries.
func WithRetryBudget(d time.Duration) Option {
	return func(c *config) { c.retryBudget = d }
}

// WithLogger sets the logger for retries (Debug) and indeterminate
// outcomes (Warn). The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithClock replaces the clock behind Lock.Deadline, Valid and Remaining.
func WithClock(clk Clock) Option {
	return func(c *config) { c.clock = clk }
}

// WithNATSOptions passes options to nats.Connect; only Connect uses them.
func WithNATSOptions(opts ...nats.Option) Option {
	return func(c *config) { c.natsOpts = append(c.natsOpts, opts...) }
}

// Auth is how Connect authenticates to NATS and verifies it: a
// credentials file, an nkey seed file, or a user and password; a CA for
// the server's TLS certificate and a client certificate; an inbox prefix
// that the user's subscribe permission names. It is the same setting the
// ticketd CLI takes as --nats-creds, --nats-nkey, --nats-user (password
// from TICKETD_NATS_PASSWORD or --nats-password-file), --nats-tls-ca,
// --nats-tls-cert, --nats-tls-key and --nats-inbox-prefix.
type Auth = natsclient.Auth

// WithAuth makes Connect authenticate with a (see Auth). Only Connect
// uses it; with New, configure the connection yourself.
func WithAuth(a Auth) Option {
	return func(c *config) { c.auth = a }
}

// withAttemptHook observes every attempt; for tests.
func withAttemptHook(f func(op string, attempt int, err error)) Option {
	return func(c *config) { c.attemptHook = f }
}

// Client talks to a ticketd cluster over NATS. It is safe for concurrent
// use.
type Client struct {
	nc        *nats.Conn
	owned     bool
	cfg       config
	perms     *permWatch
	closeOnce sync.Once
	// epoch is when the client was made: the origin of the keepalive grid
	// (session.go alignKeepAlive).
	epoch time.Time
	// keepAliveSlots and renewSlots bound the session keepalives and the
	// background lock renewals in flight (WithKeepAlivesInFlight).
	keepAliveSlots, renewSlots *inflightSlots
	// bg holds the keepalives Close ends (background.go).
	bg *background
}

// New returns a client that sends its requests over nc. The caller keeps
// ownership of nc: Close does not close it.
//
// New wraps nc's asynchronous error handler (the one set before keeps
// being called) to learn at once of the requests the NATS server refuses
// for lack of permission, which then fail with ErrPermissionDenied
// instead of waiting for a reply that cannot come. A handler set on nc
// after New replaces the wrapper: refused requests then fail only when
// their reply times out.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, errors.New("ticketd: nil NATS connection")
	}
	cfg := config{
		requestTimeout: DefaultRequestTimeout,
		backoffMin:     DefaultBackoffMin,
		backoffMax:     DefaultBackoffMax,
		retryBudget:    DefaultRetryBudget,
		clock:          realClock{},
		keepAliveAlign: keepAliveAlign,

		keepAlivesInFlight: DefaultKeepAlivesInFlight,
	}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.requestTimeout < MinRequestTimeout:
		return nil, fmt.Errorf("ticketd: request timeout must be at least %v, got %v", MinRequestTimeout, cfg.requestTimeout)
	case cfg.backoffMin <= 0 || cfg.backoffMax < cfg.backoffMin:
		return nil, fmt.Errorf("ticketd: retry backoff needs 0 < min <= max, got %v, %v", cfg.backoffMin, cfg.backoffMax)
	case cfg.retryBudget < 0:
		return nil, fmt.Errorf("ticketd: retry budget must not be negative, got %v", cfg.retryBudget)
	case cfg.clock == nil:
		return nil, errors.New("ticketd: nil clock")
	case cfg.keepAlivesInFlight < 1 || cfg.keepAlivesInFlight > MaxKeepAlivesInFlight:
		return nil, fmt.Errorf("ticketd: keepalives in flight must be between 1 and %d, got %d", MaxKeepAlivesInFlight, cfg.keepAlivesInFlight)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return &Client{nc: nc, cfg: cfg, perms: newPermWatch(nc), epoch: cfg.clock.Now(),
		keepAliveSlots: newInflightSlots(cfg.keepAlivesInFlight), renewSlots: newInflightSlots(cfg.keepAlivesInFlight),
		bg: newBackground()}, nil
}

// Connect dials NATS at url (a comma-separated list is allowed) and
// returns a client that owns the connection: Close closes it.
func Connect(url string, opts ...Option) (*Client, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	auth, err := cfg.auth.Options()
	if err != nil {
		return nil, fmt.Errorf("ticketd: %w", err)
	}
	logger := cfg.logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// nats.go's default handler prints every asynchronous error on
	// stderr; the SDK reports the ones a request meets in its error
	// (permissions.go), and logs them all (WithNATSOptions may set another).
	quiet := nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		logger.Warn("ticketd: NATS reported an error", "err", err, "subscription", subject)
	})
	natsOpts := append(append([]nats.Option{nats.Name("ticketd-sdk"), quiet}, auth...), cfg.natsOpts...)
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		// The URL may carry user:password; errors get logged.
		return nil, fmt.Errorf("ticketd: connect to %s: %w", natsclient.Redact(url), err)
	}
	c, err := New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.owned = true
	return c, nil
}

// Conn returns the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Close stops everything the client keeps alive and closes the NATS
// connection if the client owns it (Connect; a connection passed to New
// stays open). Its sessions and kept-alive locks (WithAutoRenew,
// Lock.KeepAlive) end at once, with an error matching ErrLost and
// ErrClientClosed: nothing renews them any more. Close releases nothing on
// the cluster: locks and sessions still held there end within their
// leases and TTLs (close a session first, Session.Close, to release its
// locks at once). NewSession and KeepAlive on a closed client fail with
// ErrClientClosed.
func (c *Client) Close() error {
	c.bg.close()
	c.perms.close()
	if c.owned {
		c.closeOnce.Do(c.nc.Close)
	}
	return nil
}

// request is one logical operation, sent as one or more attempts.
type request struct {
	op, key, subject string
	// group is the group a list request goes to (partition.go); nil
	// otherwise.
	group *uint32
	// readOnly operations (get, status) may be retried after a lost reply.
	readOnly bool
	// once: a single attempt, never retried (a request to one named node).
	once bool
	// retrySafe: the request carries a request_id (an acquire, lock.go), so
	// an attempt whose outcome is unknown is sent again as it is: the
	// server answers a repeat with the first outcome.
	retrySafe bool
	// settleID is the current attempt's request_id when the SDK made it
	// (an abandoned wait's withdrawal may then settle the request by it,
	// withdraw.go); settleAsked: that withdrawal was answered, without a
	// definite outcome.
	settleID    string
	settleAsked bool
	// build returns the body of attempt n (0-based), prepared at now, and
	// how long to wait for its reply; ok is false when the context leaves
	// no time for another attempt.
	build func(n int, now time.Time) (body []byte, wait time.Duration, ok bool)
	// exchange, if set, sends one attempt instead of RequestWithContext
	// (a waiting acquire, withdraw.go). It may return a *settled error:
	// the attempt's outcome is known, and do returns its error as is.
	exchange func(ctx context.Context, subject string, body []byte) (*nats.Msg, error)
}

// settled is an exchange error whose outcome is known; do returns err
// unchanged and makes no further attempt.
type settled struct{ err error }

func (s *settled) Error() string { return s.err.Error() }
func (s *settled) Unwrap() error { return s.err }

// reply is the body of a successful reply and when its request was sent.
type reply struct {
	data []byte
	sent time.Time
}

// do runs r until it gets a definite reply, a non-retryable failure or the
// context (or retry budget) runs out. It retries only when the previous
// attempt certainly had no effect, or when r is read-only. See the package
// documentation for the rules.
func (c *Client) do(ctx context.Context, r *request) (*reply, error) {
	var retryUntil time.Time
	if _, ok := ctx.Deadline(); !ok && c.cfg.retryBudget > 0 {
		retryUntil = time.Now().Add(c.cfg.retryBudget)
	}
	var last *Error // the last failure after which a retry is safe
	// uncertain: an attempt of a retry-safe request whose outcome is
	// unknown. Until a definite answer settles it, giving up is
	// indeterminate, whatever the later attempts said.
	var uncertain *Error
	giveUp := func(why error) error {
		if uncertain != nil {
			return c.giveUp(r, uncertain, why)
		}
		return c.giveUp(r, last, why)
	}
	var lc leaderCheck
	for n := 0; ; n++ {
		if n > 0 && r.once {
			return nil, last
		}
		if n > 0 {
			pause := c.backoff(n - 1)
			if !retryUntil.IsZero() && time.Now().Add(pause).After(retryUntil) {
				return nil, giveUp(errRetryBudget)
			}
			c.cfg.logger.Debug("ticketd: retrying", "op", r.op, "key", r.key, "attempt", n+1, "after", pause, "err", last)
			if err := sleepCtx(ctx, pause); err != nil {
				return nil, giveUp(err)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, giveUp(err)
		}
		if c.nc.IsClosed() {
			return nil, c.newError(r, protocol.CodeUnavailable, "the NATS connection is closed", nats.ErrConnectionClosed)
		}
		if c.nc.IsDraining() {
			return nil, c.newError(r, protocol.CodeUnavailable, "the NATS connection is draining", nats.ErrConnectionDraining)
		}
		if !c.nc.IsConnected() {
			// Nothing is published while we are not connected, so a
			// request buffered for reconnection cannot surprise us later.
			last = c.newError(r, protocol.CodeUnavailable, "not connected to NATS: "+c.nc.Status().String(), nil)
			c.hook(r.op, n, last)
			continue
		}
		body, wait, ok := r.build(n, time.Now())
		if !ok {
			return nil, giveUp(context.DeadlineExceeded)
		}
		sent := c.cfg.clock.Now()
		msg, err := c.send(ctx, r, body, wait)
		if s, ok := err.(*settled); ok {
			return nil, s.err
		}
		if err != nil {
			retry, ferr := c.classifySendError(ctx, r, err, &lc)
			c.hook(r.op, n, ferr)
			if ferr.Code == protocol.CodeIndeterminate && r.retrySafe {
				uncertain, retry = ferr, true
			}
			if !retry {
				return nil, ferr
			}
			last = ferr
			continue
		}
		perr, bad := parseReply(msg)
		switch {
		case bad != nil && r.readOnly:
			e := c.newError(r, protocol.CodeMalformed, "unreadable reply: "+bad.Error(), nil)
			c.hook(r.op, n, e)
			return nil, e
		case bad != nil:
			e := c.indeterminate(r, "unreadable reply: "+bad.Error(), nil)
			c.hook(r.op, n, e)
			if r.retrySafe {
				uncertain, last = e, e
				c.cfg.logger.Debug("ticketd: outcome unknown; retrying with the same request_id", "op", r.op, "key", r.key, "err", e)
				continue
			}
			c.cfg.logger.Warn("ticketd: outcome indeterminate", "op", r.op, "key", r.key, "err", e)
			return nil, e
		case perr != nil:
			e := c.fromProtocol(r, perr)
			c.hook(r.op, n, e)
			unknown := perr.Code == protocol.CodeIndeterminate || perr.Code == protocol.CodeInternal
			if unknown && r.retrySafe {
				uncertain, last = e, e
				c.cfg.logger.Debug("ticketd: outcome unknown; retrying with the same request_id", "op", r.op, "key", r.key, "err", e)
				continue
			}
			if perr.Code == protocol.CodeIndeterminate {
				c.cfg.logger.Warn("ticketd: outcome indeterminate", "op", r.op, "key", r.key, "err", e)
			}
			if !perr.Code.Retryable() {
				return nil, e
			}
			last = e
			continue
		}
		c.hook(r.op, n, nil)
		return &reply{data: msg.Data, sent: sent}, nil
	}
}

var errRetryBudget = errors.New("retry budget exhausted")

// send makes one attempt: the request to r.subject, and its reply within
// wait. A refusal by the NATS server (permissions.go) ends it at once as a
// *settled error.
func (c *Client) send(ctx context.Context, r *request, body []byte, wait time.Duration) (*nats.Msg, error) {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if r.exchange != nil {
		// It listens on an inbox of its own and watches for refusals itself.
		return r.exchange(actx, r.subject, body)
	}
	if v := c.perms.checkMux(actx); v != nil {
		return nil, &settled{c.deniedError(r, v, false)}
	}
	w := c.perms.watch(r.subject, c.perms.muxSubject(), func(error) { cancel() })
	msg, err := c.nc.RequestWithContext(actx, r.subject, body)
	if v := c.perms.stop(w); v != nil && err != nil {
		return nil, &settled{c.deniedError(r, v, true)}
	}
	return msg, err
}

// classifySendError decides what a failed RequestWithContext means: retry
// reports whether the request certainly had no effect (or is read-only)
// and may be sent again.
func (c *Client) classifySendError(ctx context.Context, r *request, err error, lc *leaderCheck) (retry bool, _ *Error) {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// Nobody was subscribed: no node, no leader, or the leader a
		// follower forwarded to is gone. Nothing received the request.
		return true, c.noResponders(ctx, r, err, lc)
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		// Rejected before it was written anywhere.
		return true, c.newError(r, protocol.CodeUnavailable, "not connected to NATS", err)
	case errors.Is(err, nats.ErrMaxPayload):
		return false, c.newError(r, protocol.CodeTooLarge, "request exceeds the NATS max payload", err)
	case errors.Is(err, nats.ErrConnectionDraining):
		return false, c.newError(r, protocol.CodeUnavailable, "the NATS connection is draining", err)
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrInvalidConnection),
		errors.Is(err, nats.ErrHeadersNotSupported), errors.Is(err, nats.ErrInvalidContext):
		return false, c.newError(r, protocol.CodeInternal, "request not sent", err)
	}
	// Anything else (reply timeout, context done, disconnect or close
	// while waiting, a write error) happened after the request may have
	// been published: its outcome is unknown.
	if r.readOnly {
		return true, c.newError(r, protocol.CodeUnavailable, "no reply", err)
	}
	e := c.indeterminate(r, "no reply received; the request may have taken effect", err)
	if r.retrySafe {
		c.cfg.logger.Debug("ticketd: no reply; retrying with the same request_id", "op", r.op, "key", r.key, "err", e)
		return true, e
	}
	c.cfg.logger.Warn("ticketd: outcome indeterminate", "op", r.op, "key", r.key, "err", e, "parent_ctx_err", ctx.Err())
	return false, e
}

// giveUp is the error when no further attempt is made: the last retryable
// failure (which had no effect) joined with why we stopped, or, if no
// attempt was made, the reason itself.
func (c *Client) giveUp(r *request, last *Error, why error) error {
	if last == nil {
		if r.key != "" {
			return fmt.Errorf("ticketd: %s %q: %w", r.op, r.key, why)
		}
		return fmt.Errorf("ticketd: %s: %w", r.op, why)
	}
	e := *last
	e.Err = errors.Join(last.Err, fmt.Errorf("gave up: %w", why))
	return &e
}

func (c *Client) newError(r *request, code protocol.Code, msg string, cause error) *Error {
	return &Error{Code: code, Message: msg, Op: r.op, Key: r.key, Err: cause}
}

func (c *Client) indeterminate(r *request, msg string, cause error) *Error {
	return c.newError(r, protocol.CodeIndeterminate, msg, cause)
}

func (c *Client) fromProtocol(r *request, pe *protocol.Error) *Error {
	return &Error{Code: pe.Code, Message: pe.Message, Op: r.op, Key: r.key, Leader: pe.Leader, Token: pe.Token,
		Delay: time.Duration(pe.DelayMS) * time.Millisecond}
}

func (c *Client) hook(op string, n int, err *Error) {
	if c.cfg.attemptHook == nil {
		return
	}
	if err == nil {
		c.cfg.attemptHook(op, n, nil) // not a typed nil
		return
	}
	c.cfg.attemptHook(op, n, err)
}

// backoff is the pause before retry n+1: uniform in [min, min(max, min·2ⁿ)].
func (c *Client) backoff(n int) time.Duration {
	lo, hi := c.cfg.backoffMin, c.cfg.backoffMax
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	if d > hi {
		d = hi
	}
	if d <= lo {
		return lo
	}
	return lo + rand.N(d-lo+1)
}

// requestWait is how long a non-acquire attempt waits for its reply:
// the request timeout, cut by the context deadline.
func (c *Client) requestWait(ctx context.Context, now time.Time) (time.Duration, bool) {
	w := c.cfg.requestTimeout
	if dl, ok := ctx.Deadline(); ok {
		if rem := dl.Sub(now); rem < w {
			w = rem
		}
	}
	return w, w >= time.Millisecond
}

// acquireTimes computes one acquire attempt prepared at now with a wanted
// queue wait: the wait to ask for, the timeout_ms to declare, and how long
// the SDK waits for the reply. Always wait <= timeout < replyWait. ok is
// false when the context leaves no time.
func (c *Client) acquireTimes(ctx context.Context, now time.Time, want time.Duration) (wait, timeout, replyWait time.Duration, ok bool) {
	rt := c.cfg.requestTimeout
	margin := min(minReplyMargin, rt/2-time.Millisecond)
	total := want + rt
	if dl, has := ctx.Deadline(); has {
		if rem := dl.Sub(now) - time.Millisecond; rem < total {
			total = rem
		}
	}
	grace := min(replyGrace, rt/2, total/2)
	timeout = (total - grace).Truncate(time.Millisecond)
	timeout = min(timeout, protocol.MaxTimeout)
	if timeout < time.Millisecond {
		return 0, 0, 0, false
	}
	wait = min(want, timeout-margin)
	wait = max(wait, 0).Truncate(time.Millisecond)
	return wait, timeout, timeout + grace, true
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Header names the server sets on an error reply (NATS micro convention).
const (
	HeaderServiceError     = "Nats-Service-Error"
	HeaderServiceErrorCode = "Nats-Service-Error-Code"
)

// parseReply reads a reply: perr is the server's error if the reply is
// one; bad is non-nil when the body is not a JSON object we can read (so
// its meaning is unknown, unlike a server's "malformed" code, which
// speaks about the request).
func parseReply(m *nats.Msg) (perr *protocol.Error, bad error) {
	hdrCode := protocol.Code(m.Header.Get(HeaderServiceErrorCode))
	var probe struct {
		Error *protocol.Error `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &probe); err != nil {
		if hdrCode != "" {
			return &protocol.Error{Code: hdrCode, Message: m.Header.Get(HeaderServiceError)}, nil
		}
		return nil, err
	}
	if probe.Error != nil {
		if probe.Error.Code == "" {
			probe.Error.Code = hdrCode
		}
		if probe.Error.Code == "" {
			probe.Error.Code = protocol.CodeInternal
		}
		return probe.Error, nil
	}
	if hdrCode != "" {
		// An error header on a body without an error: trust the header.
		return &protocol.Error{Code: hdrCode, Message: m.Header.Get(HeaderServiceError)}, nil
	}
	return nil, nil
}
