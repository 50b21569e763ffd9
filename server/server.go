package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Defaults of Config; tests shorten them.
const (
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

// Node is what the server needs from the raft node (raftstore.Node).
type Node interface {
	ID() uint64
	Leader() uint64
	Propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error)
	ReadIndex(ctx context.Context) error
	View(f func(m *core.Machine))
}

var _ Node = (*raftstore.Node)(nil)

// Verdict is a policy decision on a Grant.
type Verdict struct {
	Allow  bool
	Reason string
}

// Policy decides whether a Grant may be proposed (plugins implement it).
// An error means the policy failed; the server then denies (fail closed).
type Policy interface {
	ValidateGrant(ctx context.Context, key, owner string, leaseMS uint64) (Verdict, error)
}

// Config configures a Server.
type Config struct {
	Logger  *slog.Logger
	Metrics *Metrics
	Policy  Policy
	// Now is the local monotonic clock; nil means time.Now.
	Now func() time.Time
	// WallClockMS stamps Grant.GrantedAtMS (information only); nil means
	// time.Now().UnixMilli.
	WallClockMS              func() uint64
	ExpireRetry              time.Duration
	ReplyMargin              time.Duration
	BackgroundProposeTimeout time.Duration
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
}

// Grant is an issued lock.
type Grant struct {
	Key   string
	Token uint64
	Lease time.Duration
	Index uint64
}

// Holder is the current holder of a key.
type Holder struct {
	Lock      core.Lock
	Held      bool
	Remaining time.Duration
}

// Server is the leader-side lock service. It implements
// raftstore.Observer; attach it to the node with Attach before serving.
type Server struct {
	cfg  Config
	log  *slog.Logger
	node Node

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}

	mu     sync.Mutex
	leader bool // ready leader: lease and queue state below are valid
	leases *leaseHeap
	// epoch counts leadership changes; pending maps a key with a Grant in
	// flight to the epoch that proposed it, so work left over from an
	// earlier leadership never clears a later one's bookkeeping.
	epoch   uint64
	pending map[string]uint64
	queues  map[string]*waitQueue
	waiters int
}

var _ raftstore.Observer = (*Server)(nil)

// New creates a Server. Call Attach, then the node's events drive it.
func New(cfg Config) *Server {
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
	if cfg.ExpireRetry <= 0 {
		cfg.ExpireRetry = ExpireRetryDefault
	}
	if cfg.ReplyMargin <= 0 {
		cfg.ReplyMargin = ReplyMarginDefault
	}
	if cfg.BackgroundProposeTimeout <= 0 {
		cfg.BackgroundProposeTimeout = BackgroundProposeTimeoutDefault
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		ctx:     ctx,
		cancel:  cancel,
		kick:    make(chan struct{}, 1),
		leases:  newLeaseHeap(),
		pending: make(map[string]uint64),
		queues:  make(map[string]*waitQueue),
	}
}

// Attach binds the server to its node and starts the lease loop.
func (s *Server) Attach(n Node) {
	s.node = n
	s.wg.Add(1)
	go s.leaseLoop()
}

// Close stops background work and fails queued waiters.
func (s *Server) Close() {
	s.cancel()
	s.OnLeadershipLost()
	s.wg.Wait()
}

// IsLeader reports whether this node is the ready leader.
func (s *Server) IsLeader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leader
}

// Leader is the raft id of the leader as this node knows it (0: none).
func (s *Server) Leader() uint64 { return s.node.Leader() }

// ID is this node's raft id.
func (s *Server) ID() uint64 { return s.node.ID() }

// Metrics returns the server's collectors.
func (s *Server) Metrics() *Metrics { return s.cfg.Metrics }

func (s *Server) notLeader() *protocol.Error {
	e := protocol.Errorf(protocol.CodeNotLeader, "node %d is not the leader", s.node.ID())
	e.Leader = s.node.Leader()
	return e
}

// Acquire takes a lock for p, waiting in the key's queue when p.Wait > 0.
// Errors are *protocol.Error.
func (s *Server) Acquire(ctx context.Context, p AcquireParams) (Grant, error) {
	if p.Received.IsZero() {
		p.Received = s.cfg.Now()
	}
	deadline := p.Received.Add(p.Timeout - s.cfg.ReplyMargin)
	cmd := core.Grant(p.Key, p.Owner, uint64(p.Lease/time.Millisecond), 0)
	if err := cmd.Validate(); err != nil {
		return Grant{}, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	if !s.IsLeader() {
		return Grant{}, s.notLeader()
	}
	if s.cfg.Policy != nil {
		v, err := s.cfg.Policy.ValidateGrant(ctx, p.Key, p.Owner, cmd.LeaseMS)
		if err != nil || !v.Allow {
			s.cfg.Metrics.Denied.Inc()
			reason := v.Reason
			if err != nil {
				reason = fmt.Sprintf("policy failed (fail closed): %v", err)
			}
			return Grant{}, protocol.Errorf(protocol.CodeDenied, "%s", reason)
		}
	}

	s.mu.Lock()
	if !s.leader {
		s.mu.Unlock()
		return Grant{}, s.notLeader()
	}
	if s.busy(p.Key) {
		if p.Wait <= 0 {
			s.mu.Unlock()
			return Grant{}, protocol.Errorf(protocol.CodeHeld, "key %q is held", p.Key)
		}
		w := &waiter{turn: make(chan struct{}, 1), lost: make(chan struct{})}
		q := s.queues[p.Key]
		if q == nil {
			q = &waitQueue{}
			s.queues[p.Key] = q
		}
		q.push(w)
		s.waiters++
		s.cfg.Metrics.Waiters.Set(float64(s.waiters))
		s.mu.Unlock()
		if err := s.await(ctx, p, w, deadline); err != nil {
			return Grant{}, err
		}
		// The key is pending on our behalf now, in the epoch that
		// signalled us (written before the turn was sent).
		return s.grant(p, cmd, deadline, w.epoch)
	}
	epoch := s.epoch
	s.pending[p.Key] = epoch
	s.mu.Unlock()
	return s.grant(p, cmd, deadline, epoch)
}

// await blocks until w's turn, its wait runs out, ctx ends or leadership
// is lost.
func (s *Server) await(ctx context.Context, p AcquireParams, w *waiter, deadline time.Time) error {
	waitUntil := p.Received.Add(p.Wait)
	if deadline.Before(waitUntil) {
		waitUntil = deadline
	}
	timer := time.NewTimer(waitUntil.Sub(s.cfg.Now()))
	defer timer.Stop()
	var cause error
	select {
	case <-w.turn:
		return nil
	case <-w.lost:
		return s.notLeader()
	case <-timer.C:
		cause = protocol.Errorf(protocol.CodeTimeout, "key %q still held after waiting %v", p.Key, p.Wait)
	case <-ctx.Done():
		cause = protocol.Errorf(protocol.CodeTimeout, "request abandoned while waiting: %v", ctx.Err())
	case <-s.ctx.Done():
		cause = protocol.Errorf(protocol.CodeShuttingDown, "server stopping")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.signaled {
		// Our turn came as we gave up: hand the key to the next waiter.
		s.clearPending(p.Key, w.epoch)
		return cause
	}
	if q := s.queues[p.Key]; q != nil {
		if w.elem != nil {
			q.remove(w)
			s.waiters--
			s.cfg.Metrics.Waiters.Set(float64(s.waiters))
		}
		if q.len() == 0 {
			delete(s.queues, p.Key)
		}
	}
	return cause
}

// grant proposes the Grant for a key already marked pending and applies
// the lost-reply rule to its outcome.
func (s *Server) grant(p AcquireParams, cmd core.Command, deadline time.Time, epoch uint64) (Grant, error) {
	cmd.GrantedAtMS = s.cfg.WallClockMS()
	s.mu.Lock()
	current := s.leader && s.epoch == epoch
	s.mu.Unlock()
	if !current {
		// Leadership changed since the key was reserved for us: that
		// reservation is gone, and proposing now could race a newer one.
		return Grant{}, s.notLeader()
	}
	// The proposal is not bound to the request's context: if the entry
	// applies after the requester gave up we must still learn its token to
	// release it. Node.Propose returns when it applies, or indeterminate
	// when leadership is lost.
	a, err := s.propose(s.ctx, cmd)
	if err != nil {
		s.mu.Lock()
		s.clearPending(p.Key, epoch)
		s.mu.Unlock()
		return Grant{}, err
	}
	switch a.Result.Kind {
	case core.ResultGranted:
		if s.cfg.Now().After(deadline) {
			s.cfg.Metrics.Abandoned.Inc()
			s.ReleaseAbandoned(p.Key, a.Result.Token)
			return Grant{}, protocol.Errorf(protocol.CodeTimeout,
				"granted token %d after the requester's deadline; released", a.Result.Token)
		}
		return Grant{Key: p.Key, Token: a.Result.Token, Lease: p.Lease, Index: a.Index}, nil
	case core.ResultGrantRejected:
		return Grant{}, protocol.Errorf(protocol.CodeHeld, "key %q is held", p.Key)
	}
	return Grant{}, protocol.Errorf(protocol.CodeInternal, "grant applied as %v", a.Result)
}

// ReleaseAbandoned proposes Release with the exact token of a grant whose
// reply could not be delivered (SPEC §4.4). It does not wait.
func (s *Server) ReleaseAbandoned(key string, token uint64) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
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

// Release gives back key if token is the token it is held with.
func (s *Server) Release(ctx context.Context, key string, token uint64) error {
	cmd := core.Release(key, token)
	if err := cmd.Validate(); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	if !s.IsLeader() {
		return s.notLeader()
	}
	a, err := s.propose(ctx, cmd)
	if err != nil {
		return err
	}
	switch a.Result.Kind {
	case core.ResultReleased:
		return nil
	case core.ResultNotFound:
		return protocol.Errorf(protocol.CodeNotFound, "no lock on %q with token %d", key, token)
	}
	return protocol.Errorf(protocol.CodeInternal, "release applied as %v", a.Result)
}

// Get returns the current holder of key, read linearizably (ReadIndex).
func (s *Server) Get(ctx context.Context, key string) (Holder, error) {
	if err := core.ValidateKey(key); err != nil {
		return Holder{}, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	if !s.IsLeader() {
		return Holder{}, s.notLeader()
	}
	if err := s.node.ReadIndex(ctx); err != nil {
		return Holder{}, s.mapErr(err)
	}
	var h Holder
	s.node.View(func(m *core.Machine) { h.Lock, h.Held = m.Get(key) })
	if !h.Held {
		return h, nil
	}
	h.Remaining = time.Duration(h.Lock.LeaseMS) * time.Millisecond
	s.mu.Lock()
	if it, ok := s.leases.get(key); ok && it.token == h.Lock.Token {
		h.Remaining = max(0, it.deadline.Sub(s.cfg.Now()))
	}
	s.mu.Unlock()
	return h, nil
}

func (s *Server) propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error) {
	kind := cmd.Kind.String()
	s.cfg.Metrics.Proposals.WithLabelValues(kind).Inc()
	start := time.Now()
	a, err := s.node.Propose(ctx, cmd)
	if err != nil {
		perr := s.mapErr(err)
		s.cfg.Metrics.ProposalFails.WithLabelValues(kind, string(perr.Code)).Inc()
		return a, perr
	}
	s.cfg.Metrics.ProposeTime.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	return a, nil
}

// mapErr turns node errors into protocol errors.
func (s *Server) mapErr(err error) *protocol.Error {
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, raftstore.ErrNotLeader):
		return s.notLeader()
	case errors.Is(err, raftstore.ErrIndeterminate):
		return protocol.Errorf(protocol.CodeIndeterminate, "outcome unknown: %v", err)
	case errors.Is(err, raftstore.ErrStopped):
		return protocol.Errorf(protocol.CodeShuttingDown, "node stopping")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return protocol.Errorf(protocol.CodeTimeout, "%v", err)
	}
	var ce *core.Error
	if errors.As(err, &ce) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%s", ce.Detail)
	}
	return protocol.Errorf(protocol.CodeInternal, "%v", err)
}

// busy reports whether key is held or has a Grant in flight. s.mu held.
func (s *Server) busy(key string) bool {
	if _, ok := s.pending[key]; ok {
		return true
	}
	_, held := s.leases.get(key)
	return held
}

// clearPending drops key's reservation if epoch made it, and hands the key
// on. s.mu held.
func (s *Server) clearPending(key string, epoch uint64) {
	if e, ok := s.pending[key]; ok && e == epoch {
		delete(s.pending, key)
		s.promote(key)
	}
}

// promote hands a free key to the head of its queue. s.mu held.
func (s *Server) promote(key string) {
	if s.busy(key) {
		return
	}
	q := s.queues[key]
	if q == nil {
		return
	}
	if w := q.pop(); w != nil {
		s.waiters--
		s.cfg.Metrics.Waiters.Set(float64(s.waiters))
		w.signaled = true
		w.epoch = s.epoch
		s.pending[key] = s.epoch
		w.turn <- struct{}{}
	}
	if q.len() == 0 {
		delete(s.queues, key)
	}
}

// OnApplied implements raftstore.Observer. The leader tracks lease timers
// and frees keys for waiters; followers keep no state.
func (s *Server) OnApplied(a raftstore.Applied) {
	switch a.Result.Kind {
	case core.ResultGranted:
		s.cfg.Metrics.Grants.Inc()
		s.cfg.Metrics.HeldLocks.Inc()
	case core.ResultReleased:
		s.cfg.Metrics.Releases.Inc()
		s.cfg.Metrics.HeldLocks.Dec()
	case core.ResultExpired:
		s.cfg.Metrics.Expiries.WithLabelValues(fmt.Sprint(a.Result.Existed)).Inc()
		if a.Result.Existed {
			s.cfg.Metrics.HeldLocks.Dec()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leader {
		return
	}
	key := a.Command.Key
	switch a.Result.Kind {
	case core.ResultGranted:
		delete(s.pending, key)
		s.leases.arm(key, a.Result.Token, time.Duration(a.Command.LeaseMS)*time.Millisecond, s.cfg.Now())
		s.wake()
	case core.ResultGrantRejected:
		delete(s.pending, key)
	case core.ResultReleased:
		s.leases.remove(key, a.Command.Token)
		s.promote(key)
	case core.ResultExpired:
		if a.Result.Existed {
			s.leases.remove(key, a.Command.Token)
			s.promote(key)
		}
	}
}

// OnLeaderReady implements raftstore.Observer: re-arm every held lock with
// its full lease (never shorter than what its holder may assume) and start
// serving.
func (s *Server) OnLeaderReady(term uint64) {
	now := s.cfg.Now()
	var locks []core.Lock
	s.node.View(func(m *core.Machine) { locks = m.Locks() })
	s.mu.Lock()
	s.leases.reset()
	for _, l := range locks {
		s.leases.arm(l.Key, l.Token, time.Duration(l.LeaseMS)*time.Millisecond, now)
	}
	s.pending = make(map[string]uint64)
	s.epoch++
	s.leader = true
	s.wake()
	s.mu.Unlock()
	s.cfg.Metrics.HeldLocks.Set(float64(len(locks)))
	s.cfg.Metrics.LeaderChanges.Inc()
	s.cfg.Metrics.IsLeader.Set(1)
	s.log.Info("leader ready; lease timers re-armed", "term", term, "locks", len(locks))
}

// OnLeadershipLost implements raftstore.Observer: every queued waiter gets
// a retryable not_leader error at once.
func (s *Server) OnLeadershipLost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.leader
	s.leader = false
	s.epoch++
	for key, q := range s.queues {
		for w := q.pop(); w != nil; w = q.pop() {
			close(w.lost)
		}
		delete(s.queues, key)
	}
	s.waiters = 0
	s.cfg.Metrics.Waiters.Set(0)
	s.pending = make(map[string]uint64)
	s.leases.reset()
	if was {
		s.cfg.Metrics.LeaderChanges.Inc()
		s.cfg.Metrics.IsLeader.Set(0)
		s.log.Info("leadership lost; waiters failed")
	}
}

// OnRestored implements raftstore.Observer.
func (s *Server) OnRestored(index uint64) {
	var n int
	s.node.View(func(m *core.Machine) { n = m.Len() })
	s.cfg.Metrics.HeldLocks.Set(float64(n))
}

// OnConfChange implements raftstore.Observer.
func (s *Server) OnConfChange(cc raftpb.ConfChangeV2, cs raftpb.ConfState) {}

func (s *Server) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// leaseLoop proposes Expire for every lease that runs out on this
// leader's clock.
func (s *Server) leaseLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		next, ok := s.leases.next()
		leader := s.leader
		s.mu.Unlock()
		wait := time.Hour
		if ok && leader {
			wait = max(0, next.Sub(s.cfg.Now()))
		}
		timer.Reset(wait)
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
			// Go ≥1.23 timers: Stop then Reset never delivers a stale tick.
			timer.Stop()
			continue
		case <-timer.C:
		}
		s.mu.Lock()
		var due []leaseItem
		if s.leader {
			due = s.leases.due(s.cfg.Now(), s.cfg.ExpireRetry)
		}
		s.mu.Unlock()
		for _, it := range due {
			s.wg.Add(1)
			go s.expire(it.key, it.token)
		}
	}
}

func (s *Server) expire(key string, token uint64) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.BackgroundProposeTimeout)
	defer cancel()
	a, err := s.propose(ctx, core.Expire(key, token))
	if err != nil {
		s.log.Debug("expire proposal failed; will retry while leader", "key", key, "token", token, "err", err)
		return
	}
	s.log.Debug("lease expired", "key", key, "token", token, "existed", a.Result.Existed, "index", a.Index)
}
