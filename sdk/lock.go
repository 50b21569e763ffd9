package sdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// DefaultLease is the lease of an Acquire without WithLease.
const DefaultLease = 10 * time.Second

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	lease     time.Duration
	wait      time.Duration
	owner     string
	autoRenew bool
	keepAlive []KeepAliveOption
	requestID string
	lockDelay time.Duration
	// limit and shared are the lock's kind (kinds.go).
	limit  int
	shared bool
	// session is set by Session.Acquire (session.go).
	session *Session
}

// WithLease sets the lease (default DefaultLease), between core.MinLease
// and core.MaxLease; it is sent in whole milliseconds (rounded down).
func WithLease(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lease = d }
}

// WithOwner sets the owner, a correlation id of at most core.MaxOwnerLen
// bytes that ticketd records and reports (Get, audit) but never checks:
// it is not an authority, the token is.
func WithOwner(owner string) AcquireOption {
	return func(o *acquireOptions) { o.owner = owner }
}

// WithWait makes Acquire wait up to d (at most protocol.MaxWait) in the
// key's FIFO queue when the key is held. 0, the default, tries once and
// fails with ErrHeld if the key is held. A context deadline earlier than
// the wait plus the reply margin shortens the wait.
func WithWait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait = d }
}

// WithRequestID sets the acquire's request_id (docs/protocol.md §5.1),
// at most protocol.MaxRequestIDLen bytes of printable ASCII, instead of
// the random one Acquire makes. Use it to retry an acquire across process
// restarts: the same id from the same identity is answered with the grant
// it produced while that grant is held (Lock.Repeated), and with
// ErrGrantEnded (Error.Token) for a while after it ended; the same id with
// another key or kind (WithLimit, WithShared) than its grant's, or than
// its attempt still waiting on the leader, is ErrInvalidArgument and
// changes nothing. Use a new id for each acquire, unique to it (random): never one that competing clients
// can derive alike (a job name, a date). Two clients that send the same id
// from the same identity (anonymous clients share one) are both answered
// with the one grant, and both hold the lock.
func WithRequestID(id string) AcquireOption {
	return func(o *acquireOptions) { o.requestID = id }
}

// WithLockDelay sets the lock's lock-delay (default 0, at most
// core.MaxLockDelay; docs/protocol.md §11): if its lease runs out (the
// holder failed), the key is not granted again for d, so that work the
// failed holder left in flight drains first. A release frees it at once.
// It needs cluster version 4 (ErrUnsupported before).
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay = d }
}

// maxFreshRequests bounds the request ids one Acquire uses: it takes a new
// one only when a grant it never received ended (ErrGrantEnded).
const maxFreshRequests = 8

// newRequestID is a fresh random request_id: 128 bits, hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// Lock is a granted lock. Its fields are read-only.
type Lock struct {
	Key string
	// Token is the fencing token: strictly increasing per key for the
	// cluster's whole life. Pass it to the resource the lock protects,
	// which must reject a token lower than the highest it has seen.
	Token uint64
	Owner string
	// Lease is the granted lease.
	Lease time.Duration
	// Index is the raft log index of the Grant.
	Index uint64
	// Group is the group of a partitioned deployment that granted the
	// lock (WithPartitioned, docs/scaling.md): Token is that group's
	// token. nil when the cluster is not partitioned.
	Group *uint32
	// Fence is the grant's fence: its key, token and cluster ID signed
	// with the cluster's fence key (docs/fencing.md). Send it to the
	// protected resource instead of the bare token: one that verifies it
	// (package fence) cannot be poisoned by an invented token. "" when
	// the cluster has no fence key yet (cluster version below 3).
	Fence string
	// RequestID is the acquire's request_id ("" when the cluster did not
	// take one: below cluster version 3).
	RequestID string
	// Repeated: the grant was produced by an earlier attempt of the same
	// request (its reply was lost, or an earlier Acquire with the same
	// WithRequestID); Index is then 0. Deadline is the later of the first
	// attempt this Acquire sent plus the lease and the repeat's send plus
	// the lease the leader reported left; with WithRequestID's id, which
	// an earlier process may have used, only the latter.
	Repeated bool
	// Limit is the key's limit as this lock was granted: 1 for a mutex
	// or a read/write lock, N for a slot of a semaphore (WithLimit); Shared
	// tells a shared hold of a read/write lock (WithShared). Both come
	// from the grant's reply (a Repeated grant is the request's, and a
	// leader refuses a retry that asks for another kind); from a leader
	// too old to name them, from the options. The other holders of such
	// a key are in Get's Holder.Holders.
	Limit  int
	Shared bool

	client *Client
	// session is the session that holds the lock (Session.Acquire); nil
	// for a leased lock.
	session *Session

	// mu guards deadline, renewedAt, lease and the lifecycle state of
	// keepalive.go; Renew and the keepalive goroutine write them while the
	// holder reads.
	mu        sync.Mutex
	deadline  time.Time
	renewedAt time.Time     // send time of the acquire or of the last renewal
	lease     time.Duration // the lease as of the last renewal
	life      lifecycle
}

// Deadline is the local moment after which the holder must assume it has
// lost the lock: the time the successful request was sent plus the lease,
// on the monotonic clock (for a Repeated grant, the send of the first
// attempt with its request id, or the reply's send plus the lease the
// leader reports left, whichever is later; only the latter for
// WithRequestID's id, which an earlier process may have sent). The server's lease started no earlier than that
// send, so the lock cannot have expired before Deadline (apart from clock
// rate drift, which is tiny against any sane lease). Time spent queued
// with WithWait counts against it. A successful Renew moves it to the
// renew request's send time plus the lease in its reply; nothing else
// moves it, and it never moves back.
func (l *Lock) Deadline() time.Time {
	if l.session != nil {
		return l.session.Deadline()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Valid reports whether Deadline has not yet passed.
func (l *Lock) Valid() bool { return l.now().Before(l.Deadline()) }

// Remaining is how long until Deadline, or 0 once it has passed.
func (l *Lock) Remaining() time.Duration {
	return max(l.Deadline().Sub(l.now()), 0)
}

func (l *Lock) now() time.Time {
	if l.client == nil {
		return time.Now()
	}
	return l.client.cfg.clock.Now()
}

// Release stops the keepalive, if any, ends Context and Lost (Err
// becomes ErrReleased), and releases the lock; see Client.Release. The
// lock is given up locally even when the release fails: a lock that was
// not released expires within its lease.
func (l *Lock) Release(ctx context.Context) error {
	if l.client == nil {
		return &Error{Code: protocol.CodeInvalidArgument, Message: "lock has no client", Op: "release", Key: l.Key}
	}
	l.end(ErrReleased)
	return l.client.Release(ctx, l.Key, l.Token)
}

func (l *Lock) String() string {
	return fmt.Sprintf("lock %q token %d owner %q lease %v", l.Key, l.Token, l.Owner, l.Lease)
}

// Acquire takes the lock on key. It returns the Lock, or an error
// matching one of the sentinels: ErrHeld (try-only, the key is held),
// ErrTimeout (the wait ran out), ErrDenied (a policy plugin said no),
// ErrInvalidArgument, ErrIndeterminate (the context, or without a
// deadline the retry budget, ended while an attempt's outcome was
// unknown: a grant may exist, and it expires within its lease), ErrUnavailable (no leader within the context or retry
// budget; nothing was granted), ErrGrantEnded (WithRequestID only), and
// others. The acquire carries a request_id, so not_leader, unavailable,
// shutting_down, "no responders" and not-connected failures, and also a
// lost or indeterminate reply, are retried with it until the context (or
// the retry budget) ends (the package documentation, "Retry semantics").
//
// A waiting acquire (WithWait) that is abandoned (the context ends, or
// no reply came in time) is withdrawn from the key's queue, and a grant
// that raced the withdrawal is released with its exact token. When that
// settles the outcome the error is the context's (errors.Is matches
// context.Canceled or context.DeadlineExceeded) and carries no code:
// nothing is held. Otherwise it is ErrIndeterminate as above.
//
// An acquire that sent more than one attempt of its request (a retry
// after a failover or a lost reply) and ends refused (ErrHeld, or
// ErrTimeout from the leader) settles the request before it returns,
// with a withdraw by request_id (at most withdrawTimeout, 2 s): an
// earlier attempt still in the network (held back by a paused server)
// is then refused when it reaches the leader (cluster version 6), and
// one that won meanwhile is released; the refusal is returned either
// way. If that withdraw fails, the error is ErrIndeterminate. A
// single-attempt acquire sends nothing more.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	o := acquireOptions{lease: DefaultLease}
	for _, opt := range opts {
		opt(&o)
	}
	lease := o.lease.Truncate(time.Millisecond)
	var ka keepAliveConfig
	if err := o.validate(key, lease); err != nil {
		return nil, err
	}
	if o.autoRenew {
		var err error
		if ka, err = newKeepAliveConfig(lease, o.keepAlive); err != nil {
			return nil, &Error{Code: protocol.CodeInvalidArgument, Message: err.Error(), Op: "acquire", Key: key}
		}
		if c.bg.isClosed() {
			// Nothing could renew the grant: ask for none.
			return nil, fmt.Errorf("ticketd: acquire %q with auto-renew: %w", key, ErrClientClosed)
		}
	}
	l, err := c.acquire(ctx, key, lease, o)
	if err != nil {
		return nil, err
	}
	if o.autoRenew {
		if err := l.startAutoRenew(ctx, ka); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// acquire runs the attempts of one Acquire: each request id until its
// outcome is known (retry-safe: client.go), a fresh one after a grant it
// never received ended, and none once the cluster refuses them.
func (c *Client) acquire(ctx context.Context, key string, lease time.Duration, o acquireOptions) (*Lock, error) {
	req := protocol.AcquireRequest{Key: key, Owner: o.owner, LeaseMS: lease.Milliseconds(), RequestID: o.requestID, LockDelayMS: o.lockDelay.Milliseconds()}
	o.setKind(&req)
	if o.session != nil {
		req.Session, req.LeaseMS, req.LockDelayMS = o.session.ID, 0, 0
	}
	ownID := req.RequestID == ""
	if ownID {
		req.RequestID = newRequestID()
	}
	r := &request{op: "acquire", key: key, subject: c.keyedSubject("acquire", key), retrySafe: true}
	if o.wait > 0 {
		req.WaitID = newWaitID()
		r.exchange = c.waitExchange(r, req.WaitID)
	}
	start, attempts := time.Now(), 0
	// idSince is when the first attempt with the current request id was
	// sent: a repeated grant was made after it. idSent counts the
	// attempts sent with it.
	var idSince time.Time
	idSent := 0
	r.build = func(n int, now time.Time) ([]byte, time.Duration, bool) {
		want := o.wait
		if attempts++; attempts > 1 {
			// Retries share the caller's wait: time spent on earlier
			// attempts is not waited again.
			want = max(want-now.Sub(start), 0)
		}
		wait, timeout, replyWait, ok := c.acquireTimes(ctx, now, want)
		if !ok {
			return nil, 0, false
		}
		req.WaitMS, req.TimeoutMS = wait.Milliseconds(), timeout.Milliseconds()
		body, err := json.Marshal(req)
		if err != nil { // cannot happen: plain strings and integers
			panic(err)
		}
		if idSince.IsZero() {
			idSince = c.cfg.clock.Now()
		}
		idSent++
		r.settleID, r.settleAsked = "", false
		if ownID && r.retrySafe {
			r.settleID = req.RequestID
		}
		return body, replyWait, true
	}
	for fresh := 1; ; fresh++ {
		rep, err := c.do(ctx, r)
		switch code := CodeOf(err); {
		case err == nil:
			if !ownID {
				// The caller's id may have been sent by an earlier
				// process: this call's first send bounds nothing.
				idSince = time.Time{}
			}
			return c.lockFromReply(r, rep, lease, o, req.RequestID, idSince)
		case code == protocol.CodeGrantEnded && ownID && fresh < maxFreshRequests:
			// Our own id: every attempt with it was this call's, and none
			// of their replies arrived, so its token was never used. Ask
			// again as a new request.
			c.cfg.logger.Debug("ticketd: a grant whose reply was lost has ended; acquiring with a new request_id", "key", key, "err", err)
			req.RequestID, idSince, idSent = newRequestID(), time.Time{}, 0
		case (code == protocol.CodeHeld || code == protocol.CodeTimeout) && ownID && r.retrySafe && idSent > 1:
			// A later attempt was refused, but an earlier one of the same
			// request may still be on its way to the leader (in a paused
			// node's NATS server, say) and would be granted to nobody.
			return nil, c.settleRefused(key, req.WaitID, req.RequestID, err)
		case code == protocol.CodeIndeterminate && ownID && r.retrySafe && !r.settleAsked:
			// The context ended while an attempt's outcome was unknown
			// (and no withdrawal of its wait asked already).
			return nil, c.settleRequest(ctx, key, req.WaitID, req.RequestID, err)
		case code == protocol.CodeUnsupported && ownID && r.retrySafe:
			// The cluster runs an older version (nothing was proposed):
			// acquire as before, without the retry safety.
			c.cfg.logger.Debug("ticketd: the cluster does not take request_id yet; acquiring without it", "key", key)
			req.RequestID, r.retrySafe = "", false
		default:
			return nil, err
		}
	}
}

// settleRequest asks the leader, after an Acquire with its own request id
// ended with an attempt's outcome unknown, to settle the request: withdraw
// its wait, or release its grant (none of its replies arrived, so nobody
// used it), or say it was never granted. A definite answer is returned as
// the reason Acquire gave up (the context's error, no code: nothing is
// held); otherwise err, indeterminate. It takes at most withdrawTimeout,
// like the withdrawal of a waiting acquire.
func (c *Client) settleRequest(ctx context.Context, key, waitID, requestID string, err error) error {
	wr, werr := c.withdraw(key, waitID, requestID)
	var what string
	switch {
	case werr != nil:
		return err
	case wr.Withdrawn:
		what = "wait withdrawn"
	case wr.ReleasedToken > 0:
		what = fmt.Sprintf("its grant (token %d), whose reply never arrived, was released", wr.ReleasedToken)
	case wr.EndedToken > 0:
		what = fmt.Sprintf("its grant (token %d), whose reply never arrived, had ended", wr.EndedToken)
	case wr.NotGranted:
		what = "the cluster says nothing was granted"
	default:
		return err
	}
	why := context.Cause(ctx)
	switch {
	case why != nil:
	case errors.Is(err, context.DeadlineExceeded):
		why = context.DeadlineExceeded // the deadline left no time for another attempt
	default:
		why = errRetryBudget
	}
	c.cfg.logger.Debug("ticketd: an acquire that gave up was settled", "key", key, "outcome", what)
	return fmt.Errorf("ticketd: acquire %q: gave up; %s: %w", key, what, why)
}

// settleRefused settles the request of an Acquire that sent more than
// one attempt and ends refused (held, or its wait timed out), so that no
// earlier attempt still in the network is granted after it returned: a
// withdraw by request_id, which from cluster version 6 leaves a record
// that refuses any later attempt, and releases a grant an earlier attempt
// won meanwhile (the caller still gets the refusal: nothing is held). It
// takes at most withdrawTimeout. If it fails, the outcome is unknown:
// indeterminate, as for an attempt whose reply was lost.
func (c *Client) settleRefused(key, waitID, requestID string, refusal error) error {
	wr, werr := c.withdraw(key, waitID, requestID)
	if werr != nil {
		r := &request{op: "acquire", key: key}
		return c.indeterminate(r, fmt.Sprintf("refused (%v), but settling its earlier attempts failed: one may still be granted, and it expires within its lease", refusal), werr)
	}
	if wr.ReleasedToken > 0 {
		c.cfg.logger.Debug("ticketd: an earlier attempt of a refused acquire had won; released", "key", key, "token", wr.ReleasedToken)
	}
	return refusal
}

func (o *acquireOptions) validate(key string, lease time.Duration) error {
	bad := func(format string, args ...any) error {
		return &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: "acquire", Key: key}
	}
	if err := core.ValidateKey(key); err != nil {
		return bad("%s", detail(err))
	}
	if err := core.ValidateOwner(o.owner); err != nil {
		return bad("%s", detail(err))
	}
	if lease < core.MinLease || lease > core.MaxLease {
		return bad("lease %v is outside [%v, %v]", o.lease, core.MinLease, core.MaxLease)
	}
	if o.wait < 0 || o.wait > protocol.MaxWait {
		return bad("wait %v is outside [0, %v]", o.wait, protocol.MaxWait)
	}
	if err := protocol.ValidateRequestID(o.requestID); err != nil {
		return bad("%s", err.(*protocol.Error).Message)
	}
	if o.lockDelay < 0 || o.lockDelay > core.MaxLockDelay {
		return bad("lock delay %v is outside [0, %v]", o.lockDelay, core.MaxLockDelay)
	}
	return o.validateKind(bad)
}

// lockFromReply checks a grant reply and builds its Lock. idSince is when
// the first attempt with requestID was sent (zero: unknown, the id is the
// caller's); o are the acquire's options (its owner and kind, the
// defaults of what the reply does not name).
func (c *Client) lockFromReply(r *request, rep *reply, lease time.Duration, o acquireOptions, requestID string, idSince time.Time) (*Lock, error) {
	owner := o.owner
	var ar protocol.AcquireReply
	if err := json.Unmarshal(rep.data, &ar); err != nil || ar.Token == 0 || (ar.Key != "" && ar.Key != r.key) {
		// A success reply we cannot trust: the server may have granted.
		msg := fmt.Sprintf("invalid acquire reply %.200q", rep.data)
		if err != nil {
			msg = fmt.Sprintf("%s: %v", msg, err)
		}
		e := c.indeterminate(r, msg, nil)
		c.cfg.logger.Warn("ticketd: outcome indeterminate", "op", r.op, "key", r.key, "err", e)
		return nil, e
	}
	granted := lease
	if ar.LeaseMS > 0 {
		granted = min(granted, time.Duration(ar.LeaseMS)*time.Millisecond)
	}
	if ar.Owner != "" {
		owner = ar.Owner
	}
	// The lease started when the grant applied: after the send of the
	// attempt that made it, so for a repeat after the first attempt with
	// this id, when this call sent it (idSince); and it ends no earlier
	// than the remaining lease the leader reported, counted from this
	// attempt's send. A repeat of a caller's id (idSince zero) may be of
	// a grant an earlier process took: only the remaining lease counts.
	since := rep.sent
	if ar.Repeated {
		since = idSince
		d := min(time.Duration(ar.RemainingMS)*time.Millisecond, granted)
		if idSince.IsZero() || rep.sent.Add(d).After(since.Add(granted)) {
			since = rep.sent.Add(d - granted)
		}
	}
	limit, shared := grantedKind(&ar, o)
	if limit != max(1, o.limit) || shared != o.shared {
		// A leader before the request_id kind check repeated a grant of
		// another kind: the lock is what it granted.
		c.cfg.logger.Warn("ticketd: the grant is of another kind than asked for (a repeat by an older leader)", "key", r.key, "token", ar.Token,
			"limit", limit, "shared", shared, "asked_limit", max(1, o.limit), "asked_shared", o.shared)
	}
	return &Lock{
		Key:       r.key,
		Token:     ar.Token,
		Limit:     limit,
		Shared:    shared,
		Owner:     owner,
		Lease:     granted,
		Index:     ar.Index,
		Group:     ar.Group,
		Fence:     ar.Fence,
		RequestID: requestID,
		Repeated:  ar.Repeated,
		client:    c,
		deadline:  since.Add(granted),
		renewedAt: since,
		lease:     granted,
	}, nil
}

// grantedKind is the kind of the grant ar (Lock.Limit, Lock.Shared): as
// the reply names it, or, from a leader older than the reply's limit and
// mode, which names neither, as o asked for. A reply of a mutex (or an
// exclusive hold) names neither too; a leader that names kinds answers a
// request_id retry that asks for another kind with invalid_argument, so
// the options then name a mutex as well.
func grantedKind(ar *protocol.AcquireReply, o acquireOptions) (limit int, shared bool) {
	if ar.Limit == 0 && ar.Mode == "" {
		return max(1, o.limit), o.shared
	}
	return max(1, int(ar.Limit)), ar.Mode == protocol.ModeShared
}

// Release releases key if it is held with token. It returns nil when the
// lock was released, ErrNotFound when no lock with that key and token
// exists (already released, expired, or a wrong token; nothing changed),
// and ErrIndeterminate when the reply was lost. Releasing again with the
// same token is harmless (it yields ErrNotFound), so a caller may retry
// after ErrIndeterminate; otherwise the lock expires within its lease.
// Like Acquire, only failures that certainly had no effect are retried
// automatically.
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	bad := func(format string, args ...any) error {
		return &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: "release", Key: key}
	}
	if err := core.ValidateKey(key); err != nil {
		return bad("%s", detail(err))
	}
	if token == 0 {
		return bad("token must be positive")
	}
	body, err := json.Marshal(protocol.ReleaseRequest{Key: key, Token: token})
	if err != nil {
		panic(err)
	}
	r := &request{op: "release", key: key, subject: c.keyedSubject("release", key)}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	var rr protocol.ReleaseReply
	if err := json.Unmarshal(rep.data, &rr); err != nil {
		return c.indeterminate(r, fmt.Sprintf("invalid release reply %.200q: %v", rep.data, err), nil)
	}
	if !rr.Released {
		return c.newError(r, protocol.CodeNotFound, fmt.Sprintf("no lock on the key with token %d", token), nil)
	}
	return nil
}

// Holder is the current state of a key as the leader sees it.
type Holder struct {
	Key   string
	Held  bool
	Token uint64
	Owner string
	Lease time.Duration
	// Remaining is the lease left on the leader's clock when it answered.
	// It is informational: only the holder's own Lock.Deadline is safe to
	// act on.
	Remaining time.Duration
	// GrantedAt is the leader's wall-clock time of the grant, for
	// information only (clocks never decide lock state).
	GrantedAt time.Time
	// Group is the group of a partitioned deployment whose list showed
	// the lock (List with WithPartitioned); nil otherwise.
	Group *uint32
	// Session is the session that holds the lock ("" for a leased lock;
	// then Lease is 0 and Remaining is the session's time left).
	Session string
	// Limit is the key's limit when it is a semaphore (N) or held shared
	// (1), Shared whether it is held shared; Limit 0 for a mutex or an
	// exclusive holder. Holders, from Get of such a key, are every holder
	// in token order (the fields above are the first one's; HoldersMore
	// when the reply left the last ones out to fit one message). List
	// shows one Holder per holder instead.
	Limit       int
	Shared      bool
	Holders     []Holder
	HoldersMore bool
}

// Get returns the current holder of key (Held is false if none). It is
// read-only, so a lost reply is retried too, within the context and the
// retry budget.
func (c *Client) Get(ctx context.Context, key string) (Holder, error) {
	if err := core.ValidateKey(key); err != nil {
		return Holder{}, &Error{Code: protocol.CodeInvalidArgument, Message: detail(err), Op: "get", Key: key}
	}
	body, err := json.Marshal(protocol.GetRequest{Key: key})
	if err != nil {
		panic(err)
	}
	r := &request{op: "get", key: key, subject: c.keyedSubject("get", key), readOnly: true}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return Holder{}, err
	}
	var gr protocol.GetReply
	if err := json.Unmarshal(rep.data, &gr); err != nil {
		return Holder{}, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("unreadable get reply: %v", err), nil)
	}
	return holderOf(key, gr), nil
}

// Status is one node's view of the cluster (docs/protocol.md, "status").
type Status = protocol.StatusReply

// Status asks one node (whichever the queue group picks) for its view of
// the cluster. It is read-only and retried like Get.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	return c.status(ctx, &request{op: "status", subject: protocol.SubjectStatus, readOnly: true})
}

// NodeStatus asks the node with the given raft id for its own view, in one
// attempt: a node that does not answer (down, or cut off from this NATS
// server) is an ErrUnavailable error at once, not retried.
func (c *Client) NodeStatus(ctx context.Context, id uint64) (*Status, error) {
	return c.status(ctx, &request{op: "status", subject: protocol.NodeStatusSubject(id), readOnly: true, once: true})
}

func (c *Client) status(ctx context.Context, r *request) (*Status, error) {
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return []byte("{}"), w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	var st protocol.StatusReply
	if err := json.Unmarshal(rep.data, &st); err != nil {
		return nil, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("unreadable status reply: %v", err), nil)
	}
	return &st, nil
}

// detail is a core validation error without its "core: code:" prefix.
func detail(err error) string {
	if ce, ok := err.(*core.Error); ok {
		return ce.Detail
	}
	return err.Error()
}
