package lockservice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
)

// Defaults of Config; tests shorten them.
const (
	// RearmChunkDefault is how many of the table's positions a new leader
	// re-arms per step, holding the machine's read lock (and so holding
	// up the raft loop's next apply) for about 10 ms on a loaded machine.
	RearmChunkDefault = 1 << 15
	// ExpireRetryDefault is how long the leader waits for a proposed Expire
	// to apply before proposing it again.
	ExpireRetryDefault = time.Second
	// ReplyMarginDefault is taken off a requester's declared timeout, so a
	// reply written just before the deadline still has time to travel.
	ReplyMarginDefault = 50 * time.Millisecond
	// BackgroundProposeTimeoutDefault bounds Expire and lost-reply Release
	// proposals.
	BackgroundProposeTimeoutDefault = 5 * time.Second
)

// Node is what the service needs from the raft node (raftstore.Node).
type Node interface {
	ID() uint64
	Leader() uint64
	Propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error)
	ReadIndex(ctx context.Context) error
	// ReadIndexWithin is ReadIndex whose raft round may start up to hold
	// later, shared with the reads arriving meanwhile.
	ReadIndexWithin(ctx context.Context, hold time.Duration) error
	View(f func(m *core.Machine))
	// ScanLocks reads a page of held locks in key order from the
	// node's durable view (raftstore.Store.ScanLocks), resuming inside
	// key after when afterToken is not 0.
	ScanLocks(prefix, after string, afterToken uint64, limit int) (raftstore.LockPage, error)
	// ClusterVersion is the applied cluster version, read without waiting
	// for the raft loop.
	ClusterVersion() uint64
}

var _ Node = (*raftstore.Node)(nil)

// Config configures a Service.
type Config struct {
	Logger  *slog.Logger
	Metrics *Metrics
	// Policy, if set, is asked before every Grant is proposed.
	Policy plugins.Policy
	// ACL, if set, is checked before every operation against the identity
	// the transport put in the request context (WithIdentity); nil allows
	// everything (development).
	ACL *ACL
	// Now is the local monotonic clock that times leases; nil means
	// time.Now.
	Now func() time.Time
	// WallClockMS stamps Grant.GrantedAtMS (information only); nil means
	// time.Now().UnixMilli.
	WallClockMS func() uint64
	// ClusterID is signed into every fence (fence.go; 0: a cluster
	// created before cluster IDs).
	ClusterID uint64
	// Limits bounds the locks and waiters clients can make the leader
	// hold (quota.go).
	Limits Limits
	// StorageAlarm, if set, is asked before every Grant is admitted: a
	// non-nil error (the storage is low on space) refuses the Grant with
	// ErrResourceExhausted. Releases and expiries are never refused.
	StorageAlarm func() error
	// ExpireWorkers bounds the Expire proposals in flight
	// (ExpireWorkersDefault).
	ExpireWorkers int
	// RearmChunk is how many table positions a new leader re-arms at a
	// time off the raft loop (RearmChunkDefault; tests shorten it): a
	// table of at most that many locks is re-armed at once
	// (OnLeaderReady).
	RearmChunk int
	// OnReady, if set, is called when the service becomes ready to serve
	// as leader (its timers re-armed).
	OnReady                  func()
	ExpireRetry              time.Duration
	ReplyMargin              time.Duration
	BackgroundProposeTimeout time.Duration
	// SettleWindow is how long a grant handed out to a requester that
	// waited counts as settling (settle.go; default SettleWindowDefault).
	SettleWindow time.Duration
	// MaxProposing bounds the proposals in raft at once while more than
	// one identity proposes; more wait their identity's turn
	// (admission.go; default MaxProposingDefault). ContentionWindow is
	// how long after the last change of proposing identity the bound
	// holds (ContentionWindowDefault).
	MaxProposing     int
	ContentionWindow time.Duration
}

// AcquireParams is one acquire request.
type AcquireParams struct {
	Key   string
	Owner string
	Lease time.Duration
	// Wait is 0 to try once, or how long to wait in the key's queue.
	Wait time.Duration
	// Received is when the request arrived (local monotonic clock) and
	// Timeout how long its requester waits for the reply from sending it.
	Received time.Time
	Timeout  time.Duration
	// WaitID, if set, names the request so that its requester can
	// withdraw it (Withdraw) while it waits or just after its grant.
	WaitID string
	// Parked, if set, is called once the acquire waits in its key's queue,
	// where the waiter limits bound it: the transport stops counting it
	// as a request in progress (BeginRequest, fair.go).
	Parked func()
	// RequestID, if set, makes the acquire retry-safe (requests.go): the
	// client's id for it, scoped to the caller's identity (cluster
	// version 3).
	RequestID string
	// Session, if not 0, binds the lock to that session of the caller
	// instead of a lease (Lease is then 0); LockDelay is a plain lock's
	// lock-delay (cluster version 4, sessions.go and delay.go).
	Session   uint64
	LockDelay time.Duration
	// Limit and Mode name the lock's kind (kinds.go; cluster version 5):
	// Limit 2..core.MaxSemaphoreLimit a semaphore slot, Mode shared a
	// shared hold of a read/write lock; 0 (or 1) and exclusive a mutex.
	Limit uint32
	Mode  core.Mode

	// attempt is the request's attempt in progress (requests.go).
	attempt *reqAttempt
}

// Grant is an issued lock.
type Grant struct {
	Key   string
	Token uint64
	Lease time.Duration
	Index uint64
	// Queued is set when the request waited in the key's queue before its
	// Grant: its requester may have left meanwhile, so the transport
	// delivers such a grant in a way that tells it whether anyone
	// listened (natsapi delivery.go).
	Queued bool
	// Fence is the grant's signed fence (fence.go); "" before the cluster
	// has a fence key.
	Fence string
	// Repeated: an earlier attempt with the same request id produced this
	// grant (requests.go); Remaining is its lease left on this leader's
	// timer. Such a grant is never released on a lost reply: the earlier
	// attempt may have received it. Owner is then the lock's owner (the
	// first attempt's, which a repeat may not share).
	Repeated  bool
	Remaining time.Duration
	Owner     string
	// Limit and Mode are the granted holder's kind (kinds.go): Limit N
	// for a slot of a semaphore of N, Mode shared for a shared hold; zero
	// for a mutex or an exclusive lock. A repeated grant has the kind it
	// was granted with, whatever the retry asked for.
	Limit uint32
	Mode  core.Mode
}

// Holder is the current holder of a key.
type Holder struct {
	Lock      core.Lock
	Held      bool
	Remaining time.Duration
	// Limit and Mode are a multi-holder key's kind (kinds.go; Limit 1 for
	// shared holds), All its holders in token order; zero for a mutex or
	// exclusive lock (Lock.Limit and Lock.Mode then say so too).
	Limit uint32
	Mode  core.Mode
	All   []Holder
}

// Service is the leader-side lock service. It implements
// raftstore.Observer; register it on the node and call Attach before
// serving.
type Service struct {
	cfg  Config
	log  *slog.Logger
	node Node

	ctx    context.Context // ends when the service closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // the expiry loop, its workers and background proposals
	// timersChanged wakes the expiry loop when the earliest deadline may
	// have moved; sessChanged the session loop (delay.go).
	timersChanged chan struct{}
	sessChanged   chan struct{}
	// expireq carries due leases from the expiry loop to its workers.
	expireq chan leaseItem

	lead leaderState
	// inflight counts each identity's requests in progress (fair.go).
	inflight inflight
	// admission bounds the proposals in raft and queues the rest by
	// identity (admission.go).
	admission *admission
	// signer signs fences with the current fence key, prepared once per
	// key (fence.go).
	signer atomic.Pointer[fence.Signer]
}

// leaderState is valid only while this node is the ready leader; it is
// rebuilt from the applied lock table each time the node becomes one.
type leaderState struct {
	mu    sync.Mutex // guards every field below
	ready bool
	// rearming is set from OnLeaderReady until rearm has armed every
	// held lock (observer.go); OnApplied keeps the timers in step
	// meanwhile.
	rearming bool
	leases   *leaseTable
	// sess are the session and lock-delay timers (sesstimers.go).
	sess *sessionTimers
	// epoch counts leadership changes; reserved maps a key with a Grant in
	// flight to the epoch that proposed it (and the identity it counts
	// against), so work left over from an earlier leadership never clears
	// a later one's reservation. reservedBy counts reservations per
	// identity (quota.go).
	epoch      uint64
	reserved   map[string]reservation
	reservedBy map[string]int
	// multi is the view of each multi-holder key, multiRes the Grants of
	// a multi-holder kind in flight by key, multiResN their number
	// (kinds.go).
	multi     map[string]*kindView
	multiRes  map[string][]multiReservation
	multiResN int
	queues    map[string]*waitQueue
	waiters   int
	waitersBy map[string]int // waiters by identity (quota.go)
	// waits are the acquires with a wait id in progress (queued or with
	// their Grant in flight); recent the grants of such acquires that
	// completed lately (withdraw.go).
	waits  map[waitRef]*waiter
	recent recentGrants
	// requests are the acquires with a request id in progress, by
	// core.RequestKey (requests.go).
	requests map[[32]byte]*reqAttempt
	// settling are grants whose delivery or lost-reply release is under
	// way (settle.go).
	settling map[settleRef]*settleMark
}

var _ raftstore.Observer = (*Service)(nil)

// New creates a Service. Call Attach, then the node's events drive it.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.WallClockMS == nil {
		cfg.WallClockMS = func() uint64 { return uint64(time.Now().UnixMilli()) }
	}
	if cfg.RearmChunk <= 0 {
		cfg.RearmChunk = RearmChunkDefault
	}
	if cfg.ExpireRetry <= 0 {
		cfg.ExpireRetry = ExpireRetryDefault
	}
	if cfg.ReplyMargin <= 0 {
		cfg.ReplyMargin = ReplyMarginDefault
	}
	if cfg.SettleWindow <= 0 {
		cfg.SettleWindow = SettleWindowDefault
	}
	if cfg.BackgroundProposeTimeout <= 0 {
		cfg.BackgroundProposeTimeout = BackgroundProposeTimeoutDefault
	}
	if cfg.ExpireWorkers <= 0 {
		cfg.ExpireWorkers = ExpireWorkersDefault
	}
	if cfg.MaxProposing <= 0 {
		cfg.MaxProposing = MaxProposingDefault
	}
	if cfg.ContentionWindow <= 0 {
		cfg.ContentionWindow = ContentionWindowDefault
	}
	cfg.Limits.withDefaults()
	if cfg.Metrics.quota != nil {
		cfg.Metrics.quota.setLimits(cfg.Limits)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{
		cfg:           cfg,
		log:           cfg.Logger,
		ctx:           ctx,
		cancel:        cancel,
		timersChanged: make(chan struct{}, 1),
		sessChanged:   make(chan struct{}, 1),
		expireq:       make(chan leaseItem, expireBatch),
		inflight:      inflight{by: make(map[string]int)},
		admission:     newAdmission(cfg.MaxProposing, cfg.ContentionWindow),
		lead: leaderState{
			leases:     newLeaseTable(),
			sess:       newSessionTimers(),
			reserved:   make(map[string]reservation),
			reservedBy: make(map[string]int),
			multi:      make(map[string]*kindView),
			multiRes:   make(map[string][]multiReservation),
			queues:     make(map[string]*waitQueue),
			waitersBy:  make(map[string]int),
			waits:      make(map[waitRef]*waiter),
			requests:   make(map[[32]byte]*reqAttempt),
			settling:   make(map[settleRef]*settleMark),
		},
	}
}

// Attach binds the service to its node and starts the expiry loop.
func (s *Service) Attach(n Node) {
	s.node = n
	s.startExpiry()
}

// Close stops background work and fails queued waiters.
func (s *Service) Close() {
	s.cancel()
	s.OnLeadershipLost()
	s.wg.Wait()
}

// IsLeader reports whether this node is the ready leader.
func (s *Service) IsLeader() bool {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	return s.lead.ready
}

// Leader is the raft id of the leader as this node knows it (0: none).
func (s *Service) Leader() uint64 { return s.node.Leader() }

// ID is this node's raft id.
func (s *Service) ID() uint64 { return s.node.ID() }

func (s *Service) notLeader() error {
	return &NotLeaderError{Node: s.node.ID(), Leader: s.node.Leader()}
}

// Acquire takes a lock for p, waiting in the key's queue when p.Wait > 0.
// The caller's identity (IdentityFrom(ctx)) is what the quotas count.
func (s *Service) Acquire(ctx context.Context, p AcquireParams) (Grant, error) {
	if p.Received.IsZero() {
		p.Received = s.cfg.Now()
	}
	deadline := p.Received.Add(p.Timeout - s.cfg.ReplyMargin)
	identity := IdentityFrom(ctx)
	cmd := core.Grant(p.Key, p.Owner, uint64(p.Lease/time.Millisecond), 0)
	version := s.node.ClusterVersion()
	if version >= 2 {
		// Recorded in the lock, so that any later leader counts it
		// against the same identity. Before version 2 no replica could
		// apply it (core.CommandVersion).
		cmd.Identity = identity
	}
	cmd.RequestID = p.RequestID
	if p.Session != 0 {
		cmd = cmd.InSession(p.Session)
	}
	cmd = cmd.WithLockDelay(uint64(p.LockDelay/time.Millisecond)).WithKind(p.Limit, p.Mode)
	p.Limit = cmd.Limit
	if err := cmd.Validate(); err != nil {
		return Grant{}, err
	}
	if err := s.authorize(ctx, OpAcquire, p.Key); err != nil {
		return Grant{}, err
	}
	if !s.IsLeader() {
		return Grant{}, s.notLeader()
	}
	if need := core.CommandVersion(cmd); version < need {
		return Grant{}, fmt.Errorf("%w: %s needs cluster version %d, the cluster runs version %d (a member runs an older binary, or the new leader has not raised it yet); send the acquire without it, or retry later",
			ErrUnsupported, acquireFeature(cmd), need, version)
	}
	policyLease := cmd.LeaseMS
	if p.Session != 0 {
		ttl, err := s.checkSessionAcquire(ctx, p.Session)
		if err != nil {
			return Grant{}, err
		}
		policyLease = ttl
	}
	if p.RequestID != "" {
		return s.acquireRequest(ctx, p, cmd, deadline, identity)
	}
	if err := s.checkPolicy(ctx, p, policyLease); err != nil {
		return Grant{}, err
	}
	return s.acquireLoop(ctx, p, cmd, deadline, identity)
}

// acquireLoop looks at the key until it is granted, queued or refused.
func (s *Service) acquireLoop(ctx context.Context, p AcquireParams, cmd core.Command, deadline time.Time, identity string) (Grant, error) {
	// confirmed: a ReadIndex since the key was last seen busy says this
	// node is still the leader and its table is current.
	for confirmed := false; ; confirmed = true {
		g, retry, err := s.acquireOnce(ctx, p, cmd, deadline, identity, confirmed)
		if !retry {
			return g, err
		}
		// "held" is read from this node's own table, and a leader that was
		// deposed (paused, cut off) still sees the holder it knew: only a
		// node still leader may say it. ReadIndex confirms the leadership
		// and that the table includes every earlier commit; then look again.
		if err := s.node.ReadIndex(ctx); err != nil {
			return Grant{}, s.nodeErr(err)
		}
	}
}

// acquireOnce is one look at the key: the grant path if it is free, the
// queue if p waits, held if it does not (retry: confirm the leadership
// first, unless confirmed already).
func (s *Service) acquireOnce(ctx context.Context, p AcquireParams, cmd core.Command, deadline time.Time, identity string, confirmed bool) (_ Grant, retry bool, _ error) {
	s.lead.mu.Lock()
	if !s.lead.ready {
		s.lead.mu.Unlock()
		return Grant{}, false, s.notLeader()
	}
	ref := waitRef{key: p.Key, identity: identity, waitID: p.WaitID}
	if p.WaitID != "" && s.lead.waits[ref] != nil {
		s.lead.mu.Unlock()
		return Grant{}, false, &core.Error{Code: core.CodeInvalidArgument, Detail: fmt.Sprintf("wait_id %q is already in use for %q", p.WaitID, p.Key)}
	}
	free, err := s.admitKind(p.Key, p.Limit, p.Mode)
	if err != nil {
		s.lead.mu.Unlock()
		return Grant{}, false, err
	}
	if free {
		if err := s.admitGrant(identity); err != nil {
			s.lead.mu.Unlock()
			return Grant{}, false, err
		}
		epoch := s.lead.epoch
		s.reserveKind(p.Key, p.Limit, p.Mode, epoch, identity)
		w := s.trackWait(ref, &waiter{handedOff: true, epoch: epoch, identity: identity, limit: p.Limit, mode: p.Mode})
		s.lead.mu.Unlock()
		g, err := s.grant(p, cmd, deadline, epoch, identity)
		g, err = s.endWait(w, g, err)
		return g, false, err
	}
	if p.Wait <= 0 {
		err := s.heldErr(p.Key, p.Limit, p.Mode)
		s.lead.mu.Unlock()
		return Grant{}, !confirmed, err
	}
	if err := s.admitWaiter(p.Key, identity); err != nil {
		s.lead.mu.Unlock()
		return Grant{}, false, err
	}
	w := s.trackWait(ref, s.enqueue(p.Key, identity, p.Limit, p.Mode))
	s.lead.mu.Unlock()
	if p.Parked != nil {
		p.Parked()
	}
	if err := s.await(ctx, p, w, deadline); err != nil {
		g, err := s.endWait(w, Grant{}, err)
		return g, false, err
	}
	// The key is reserved for us now, in the epoch that handed it over
	// (written before the turn was sent), unless the wait was withdrawn
	// meanwhile.
	if err := s.unlessWithdrawn(w); err != nil {
		g, err := s.endWait(w, Grant{}, err)
		return g, false, err
	}
	g, err := s.grant(p, cmd, deadline, w.epoch, identity)
	g.Queued = err == nil
	g, err = s.endWait(w, g, err)
	return g, false, err
}

// checkPolicy asks the Grant policy; a failing policy denies (fail closed).
// The policy sees the caller's identity even when the cluster version is
// too old to record it on the lock.
func (s *Service) checkPolicy(ctx context.Context, p AcquireParams, leaseMS uint64) error {
	if s.cfg.Policy == nil {
		return nil
	}
	v, err := s.cfg.Policy.ValidateGrant(ctx, plugins.Grant{Key: p.Key, Owner: p.Owner, Identity: IdentityFrom(ctx), LeaseMS: leaseMS, Limit: p.Limit, Mode: p.Mode})
	if err == nil && v.Allow {
		return nil
	}
	if lerr := s.policyLimit(err); lerr != nil {
		return lerr
	}
	s.cfg.Metrics.Denied.Inc()
	reason := v.Reason
	if err != nil {
		reason = fmt.Sprintf("policy failed (fail closed): %v", err)
	}
	return &DeniedError{Reason: reason}
}

// grant proposes the Grant for a key already reserved in epoch, once
// identity's turn admits it (admission.go) before the deadline, and
// applies the lost-reply rule to its outcome.
func (s *Service) grant(p AcquireParams, cmd core.Command, deadline time.Time, epoch uint64, identity string) (Grant, error) {
	cmd.GrantedAtMS = s.cfg.WallClockMS()
	s.lead.mu.Lock()
	current := s.lead.ready && s.lead.epoch == epoch
	s.lead.mu.Unlock()
	if !current {
		// Leadership changed since the key was reserved for us: that
		// reservation is gone, and proposing now could race a newer one.
		return Grant{}, s.notLeader()
	}
	// The proposal is not bound to the request's context: if the entry
	// applies after the requester gave up we must still learn its token to
	// release it. Node.Propose returns when it applies, or indeterminate
	// when leadership is lost. Only the wait for a place in raft, before
	// anything is proposed, ends at the requester's deadline.
	a, err := s.proposeGrant(cmd, deadline, identity)
	if err != nil {
		s.lead.mu.Lock()
		s.unreserveKind(p.Key, p.Limit, p.Mode, epoch, identity)
		s.lead.mu.Unlock()
		return Grant{}, err
	}
	switch a.Result.Kind {
	case core.ResultGranted:
		if s.cfg.Now().After(deadline) && !s.heirWaiting(p.attempt) {
			s.ReleaseUndelivered(p.Key, a.Result.Token)
			return Grant{}, fmt.Errorf("%w: granted token %d after the requester's deadline; released", ErrTimeout, a.Result.Token)
		}
		return Grant{Key: p.Key, Token: a.Result.Token, Lease: p.Lease, Index: a.Index, Fence: s.fence(p.Key, a.Result.Token), Limit: cmd.Limit, Mode: cmd.Mode}, nil
	case core.ResultGrantRejected:
		return Grant{}, fmt.Errorf("%w: %q", ErrHeld, p.Key)
	}
	if err, ok := s.sessionGrantErr(p, a.Result); ok {
		return Grant{}, err
	}
	if err, ok := s.kindGrantErr(p, a.Result); ok {
		return Grant{}, err
	}
	return s.appliedRequest(p, a.Result)
}

// heirWaiting reports whether a later attempt of a's request waits for
// its grant (requests.go).
func (s *Service) heirWaiting(a *reqAttempt) bool {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	return a.heirWaiting(s.cfg.Now())
}

// ReleaseUndelivered proposes Release with the exact token of a Grant whose
// reply could not reach its requester (SPEC §4.4): nobody can hold that
// token. It does not wait.
func (s *Service) ReleaseUndelivered(key string, token uint64) {
	s.cfg.Metrics.Abandoned.Inc()
	s.markSettling(key, token, 0)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.endSettling(key, token)
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
		defer cancel()
		a, err := s.propose(ctx, core.Release(key, token))
		if err != nil {
			s.log.Warn("lost-reply release failed; the lock will expire with its lease", "key", key, "token", token, "err", err)
			return
		}
		s.log.Info("released a grant whose reply was lost", "key", key, "token", token, "result", a.Result.String())
	}()
}

// propose proposes cmd once its turn admits it (admission.go: the
// client identity in ctx, or the cluster's own) and waits for its result.
func (s *Service) propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error) {
	leave, err := s.admitProposal(ctx)
	if err != nil {
		return raftstore.Applied{}, err
	}
	defer leave()
	return s.proposeAdmitted(ctx, cmd)
}

// proposeAdmitted hands an admitted cmd to the node and waits for its
// result.
func (s *Service) proposeAdmitted(ctx context.Context, cmd core.Command) (raftstore.Applied, error) {
	km := s.cfg.Metrics.forKind(cmd.Kind)
	km.proposals.Inc()
	start := time.Now()
	a, err := s.node.Propose(ctx, cmd)
	if err != nil {
		err = s.nodeErr(err)
		s.cfg.Metrics.ProposalFails.WithLabelValues(cmd.Kind.String(), failureClass(err)).Inc()
		return a, err
	}
	km.time.Observe(time.Since(start).Seconds())
	return a, nil
}

// nodeErr turns the raft node's errors into the service's own. An entry
// that may have been taken by raft is indeterminate even when the node is
// also stopping, so that check comes first.
func (s *Service) nodeErr(err error) error {
	switch {
	case errors.Is(err, raftstore.ErrNotLeader):
		return s.notLeader()
	case errors.Is(err, raftstore.ErrIndeterminate):
		return fmt.Errorf("%w: %w", ErrIndeterminate, err)
	case errors.Is(err, raftstore.ErrStopped):
		return fmt.Errorf("%w: %w", ErrShuttingDown, err)
	}
	return err
}

// failureClass labels a failed proposal in metrics.
func failureClass(err error) string {
	var nl *NotLeaderError
	var ce *core.Error
	switch {
	case errors.As(err, &nl):
		return "not_leader"
	case errors.Is(err, ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, ErrShuttingDown):
		return "shutting_down"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	case errors.As(err, &ce):
		return "invalid_argument"
	}
	return "internal"
}
