package natsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/transports/protocol"
)

// MaxInflightDefault bounds the requests handled at once by one node,
// acquires and the rest apart (fair.go); parked waits are not counted.
const MaxInflightDefault = 10000

// ForwardTimeoutDefault bounds a follower's wait for the leader's answer
// to a forwarded release or get.
const ForwardTimeoutDefault = 5 * time.Second

// ForwardGraceDefault is how much longer than the requester a follower
// waits for the leader: the leader counts its deadline from its own, later
// receipt, and a grant it answers in that gap must reach the follower,
// which can still relay it or, failing that, release it.
const ForwardGraceDefault = time.Second

// Config configures the service.
type Config struct {
	Conn  *nats.Conn
	Locks *lockservice.Service
	// Node, MemberAddr and Plugins are what the status endpoints report.
	Node StatusNode
	// MemberAddr names a member's peer address ("" when unknown).
	MemberAddr func(id uint64) string
	// ClusterID is reported in status (0: a cluster created before
	// cluster IDs).
	ClusterID uint64
	// Disk, if set, is the store's disk guard: status reports its free
	// space and alarm.
	Disk        DiskStatus
	Plugins     *plugins.Set
	Logger      *slog.Logger
	MaxInflight int
	// ReplyInterest, if set, tells whether the requesters of parked waits
	// are still there; the waits of those gone end within about
	// ParkSweep (fair.go). nil: they end at their wait_ms.
	ReplyInterest ReplyInterest
	ParkSweep     time.Duration // ParkSweepDefault when 0
	// Now is the lock service's lease clock (lockservice.Config.Now), used
	// only to stamp requests for it; context deadlines use the real clock.
	// nil means time.Now.
	Now func() time.Time
	// Identity says whether requests' Nats-Request-Info can name who is
	// asking (identity.go); the zero value makes every request anonymous.
	Identity IdentityTrust
	// Partition is the node's group in a partitioned deployment
	// (docs/scaling.md): it serves the group's subjects and only its keys
	// (partition.go). The zero value serves the classic subjects.
	Partition protocol.Partition
	// MaxClusterVersion is the newest cluster version status reports
	// this node reads; 0 is core.MaxClusterVersion. Only tests set it
	// lower (daemon.Options.MaxClusterVersion: a member acting as an older
	// binary in an upgrade test).
	MaxClusterVersion uint64
}

// Service is the running NATS endpoint set of one node.
type Service struct {
	cfg Config
	log *slog.Logger
	svc *microService
	fwd *nats.Subscription
	// delivery publishes grants to requesters that waited (delivery.go).
	delivery *deliveryWatch
	// lead holds the lock subscriptions, served only by the leader
	// (leadersubs.go).
	lead *leaderSubs
	// origins samples where the requests served as leader come from
	// (origins.go).
	origins originSampler
	// workers run requests, reusing idle goroutines (workers.go).
	workers *workers
	// acqSem bounds acquires in progress; sem bounds the rest, so a burst
	// of acquires can never starve the releases that would free their
	// keys. An acquire waiting in a key's queue is parked and counted by
	// neither (fair.go).
	acqSem chan struct{}
	sem    chan struct{}
	// parked are the acquires waiting in a key's queue (fair.go).
	parked parkedWaits
	// mu guards refusing and stopped; dispatch and background add to wg
	// under it, so Stop's waits never race a late message. refusing: no
	// new requests (Stop is waiting for the ones in flight); stopped: no
	// new background work either.
	mu       sync.Mutex
	refusing bool
	stopped  bool
	wg       sync.WaitGroup
	// requests counts the request goroutines (also in wg), which Stop
	// lets finish, for a while, before it cancels their context.
	requests sync.WaitGroup
	ctx      context.Context
	stop     context.CancelFunc
}

// request abstracts a micro request and a forwarded *nats.Msg.
type request struct {
	op     string
	data   []byte
	reply  string
	header nats.Header
	// identity is who the requester is (identity.go): from
	// Nats-Request-Info on a client subject, from HeaderIdentity on the
	// forward subject. nodeAuthority marks a follower's own lost-reply
	// release (HeaderLostReply, forward subject only).
	identity      string
	nodeAuthority bool
	// forwarded: a follower sent it on the forward subject.
	forwarded bool
	// hops counts the times this node forwarded it (forwardTo); noted: it
	// is in the origin sample (origins.go) already.
	hops  int
	noted bool
	// admitSem is the budget admit took a place in (nil: admit did not
	// admit it), identityDone ends its place in its identity's share (nil
	// for the cluster's own); left is set when leaveAdmission gave both
	// back (fair.go).
	admitSem     chan struct{}
	identityDone func()
	left         atomic.Bool
	// received is when the request arrived on the real clock, for context
	// deadlines; receivedLease is the same moment on the lock service's lease
	// clock (Config.Now), which may be skewed or jumped in tests.
	received      time.Time
	receivedLease time.Time
	ok            func(body []byte) error
	fail          func(e *protocol.Error) error
	// okWatched is ok with a delivery watch: onLost runs if NATS reports
	// that nobody received the reply (delivery.go).
	okWatched func(body []byte, hdr nats.Header, onLost func()) error
	// relay copies the leader's reply; onLost, if set, is a delivery
	// watch as for okWatched.
	relay func(body []byte, hdr nats.Header, onLost func()) error
}

// answered records, once, that req's reply went out (or could not): the
// endpoint's request count, processing time and error. ep is nil for a
// forwarded request, which no client sent to a micro endpoint.
func (s *Service) answered(ep *endpoint, req *request, sent error, errText string) {
	if ep == nil {
		return
	}
	if sent != nil {
		errText = "reply not written: " + sent.Error()
	}
	s.svc.record(ep, time.Since(req.received), errText)
}

// Start registers the service on cfg.Conn.
func Start(cfg Config) (*Service, error) {
	if cfg.Conn == nil || cfg.Locks == nil || cfg.Node == nil {
		return nil, errors.New("natsapi: Conn, Locks and Node are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = MaxInflightDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ParkSweep <= 0 {
		cfg.ParkSweep = ParkSweepDefault
	}
	if cfg.MaxClusterVersion == 0 || cfg.MaxClusterVersion > core.MaxClusterVersion {
		cfg.MaxClusterVersion = core.MaxClusterVersion
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, log: cfg.Logger, acqSem: make(chan struct{}, cfg.MaxInflight), sem: make(chan struct{}, cfg.MaxInflight), ctx: ctx, stop: cancel,
		lead: newLeaderSubs(cfg.Conn), workers: newWorkers(ctx)}
	if err := cfg.Partition.Validate(); err != nil {
		cancel()
		return nil, fmt.Errorf("natsapi: %w", err)
	}
	id := cfg.Locks.ID()
	s.svc = newMicroService(cfg.Conn, protocol.ServiceName, protocol.ServiceVersion, "ticketd distributed lock service", serviceMetadata(id, cfg.Partition))
	fail := func(err error) (*Service, error) {
		_ = s.svc.stop()
		cancel()
		return nil, err
	}
	for _, op := range []string{"acquire", "release", "get", "renew", "list", "withdraw", "check", "fence_keys"} {
		// Subscribed only while this node is the ready leader (leadersubs.go).
		s.addLockEndpoint(op, cfg.Partition.LockSubject(op), protocol.QueueGroup, s.microHandler(op))
	}
	if !cfg.Partition.Partitioned() {
		for _, op := range sessionOps {
			s.addLockEndpoint(op, protocol.SessionSubject(op), protocol.QueueGroup, s.microHandler(op))
		}
	}
	if err := s.svc.addEndpoint("status", protocol.SubjectStatus, protocol.QueueGroup, s.microHandler("status")); err != nil {
		return fail(err)
	}
	if cfg.Partition.Partitioned() {
		if err := s.svc.addEndpoint("group_status", protocol.GroupStatusSubject(cfg.Partition.Group), protocol.QueueGroup, s.microHandler("status")); err != nil {
			return fail(err)
		}
	}
	if err := s.svc.addEndpoint("node_status", cfg.Partition.NodeStatusSubject(id), "", s.microHandler("status")); err != nil {
		return fail(err)
	}
	if err := s.svc.addEndpoint("control_refused", protocol.SubjectPrefix+".control.>", protocol.QueueGroup, func(ep *endpoint, m *nats.Msg) {
		req := s.newRequest(ep, "control", m.Data, m.Reply, m.Header)
		_ = req.fail(protocol.Errorf(protocol.CodeControlRefused, "control requests are not accepted on the client port"))
	}); err != nil {
		return fail(err)
	}
	if err := s.svc.startVerbs(); err != nil {
		return fail(err)
	}
	d, err := newDeliveryWatch(cfg.Conn, s.log, s.background)
	if err != nil {
		return fail(err)
	}
	s.delivery = d
	fwd, err := cfg.Conn.Subscribe(cfg.Partition.ForwardSubject(id, "*"), s.forwardHandler)
	if err != nil {
		return fail(fmt.Errorf("natsapi: subscribe forward subject: %w", err))
	}
	s.fwd = fwd
	if err := s.reconcileLeaderSubs(cfg.Locks.IsLeader()); err != nil {
		return fail(err)
	}
	s.wg.Add(1)
	go s.runLeaderSubs()
	if cfg.ReplyInterest != nil {
		s.wg.Add(1)
		go s.runParkSweep(cfg.ReplyInterest, cfg.ParkSweep)
	}
	return s, nil
}

// Stop unregisters the endpoints and waits for in-flight requests; a
// message that still arrives is answered shutting_down.
func (s *Service) Stop() error {
	// Drained, not unsubscribed: a request NATS already handed to this
	// node is still handled and answered, instead of vanishing without a
	// reply that its client would have to call indeterminate.
	drained, err := s.stopLeaderSubs()
	err = errors.Join(err, s.svc.stop())
	if derr := s.fwd.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) && !errors.Is(derr, nats.ErrBadSubscription) {
		err = errors.Join(err, derr)
	}
	drained = append(drained, s.fwd)
	done := func() bool { return noneDraining(drained) }
	if s.await(time.Now().Add(StopDrainTimeout), done); !done() {
		s.log.Warn("stopping with lock requests still queued", "waited", StopDrainTimeout)
	}
	s.mu.Lock()
	s.refusing = true
	s.mu.Unlock()
	// Requests already taken (a forward to the new leader after a
	// hand-over, a proposal about to apply) get their answer unless they
	// wait for longer (a queued acquire): those end with the context. The
	// lost-reply paths (delivery, background releases) stay on meanwhile.
	if !waitGroupTimeout(&s.requests, StopDrainTimeout) {
		s.log.Warn("stopping with lock requests in flight", "waited", StopDrainTimeout)
	}
	err = errors.Join(err, s.delivery.stop())
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
	return err
}

// waitGroupTimeout waits for wg, for at most timeout; false if it timed out.
func waitGroupTimeout(wg *sync.WaitGroup, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// microHandler hands a client request to dispatch, with the identity
// nats-server wrote (identity.go). The reply is written later, from the
// request's own goroutine; the endpoint's figures are recorded then
// (micro.go).
func (s *Service) microHandler(op string) func(*endpoint, *nats.Msg) {
	return func(ep *endpoint, m *nats.Msg) {
		req := s.newRequest(ep, op, m.Data, m.Reply, m.Header)
		id, ok := s.cfg.Identity.clientIdentity(req.header, req.reply)
		if !ok {
			s.replyErr(req, protocol.Errorf(protocol.CodePermissionDenied,
				"the request's header block hides the Nats-Request-Info that nats-server wrote on it (an empty line, a bare CR or a line without a colon before its end): send well-formed headers"))
			return
		}
		req.identity = id
		s.dispatch(req, false)
	}
}

// forwardHandler serves requests a follower forwarded. Only ticketd's own
// NATS user may publish on the forward subject, so the identity the
// follower read, and its lost-reply mark, are trusted here and only here.
func (s *Service) forwardHandler(m *nats.Msg) {
	op := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	req := s.newRequest(nil, op, m.Data, m.Reply, m.Header)
	req.identity = s.cfg.Identity.forwardedIdentity(m.Header)
	req.nodeAuthority = op == "release" && m.Header.Get(HeaderLostReply) != ""
	req.forwarded = true
	s.dispatch(req, true)
}

// context is the lock service's context for req: the service's lifetime,
// the requester's identity and, for a node's own request, its authority.
func (req *request) context(parent context.Context) context.Context {
	ctx := lockservice.WithIdentity(parent, req.identity)
	if req.nodeAuthority {
		ctx = lockservice.WithNodeAuthority(ctx)
	}
	return ctx
}

// newRequest wraps one received message. Its reply functions publish to
// the reply subject and record the answer on ep (nil: forwarded).
func (s *Service) newRequest(ep *endpoint, op string, data []byte, reply string, hdr nats.Header) *request {
	publish := func(body []byte, h nats.Header, onLost func()) error {
		m := &nats.Msg{Subject: reply, Data: body, Header: h}
		if onLost != nil {
			return s.delivery.publish(m, onLost)
		}
		return s.cfg.Conn.PublishMsg(m)
	}
	req := &request{
		op:            op,
		data:          data,
		reply:         reply,
		header:        hdr,
		received:      time.Now(),
		receivedLease: s.cfg.Now(),
	}
	req.ok = func(body []byte) error {
		err := publish(body, nil, nil)
		s.answered(ep, req, err, "")
		return err
	}
	req.okWatched = func(body []byte, h nats.Header, onLost func()) error {
		err := publish(body, h, onLost)
		s.answered(ep, req, err, "")
		return err
	}
	req.fail = func(e *protocol.Error) error {
		h := nats.Header{}
		h.Set(micro.ErrorHeader, oneLine(e.Message))
		h.Set(micro.ErrorCodeHeader, string(e.Code))
		err := publish(errorBody(e), h, nil)
		s.answered(ep, req, err, serviceErrorText(string(e.Code), oneLine(e.Message)))
		return err
	}
	req.relay = func(body []byte, h nats.Header, onLost func()) error {
		err := publish(body, h, onLost)
		errText := ""
		if code := h.Get(micro.ErrorCodeHeader); code != "" {
			errText = serviceErrorText(code, h.Get(micro.ErrorHeader))
		}
		s.answered(ep, req, err, errText)
		return err
	}
	return req
}

// dispatch runs a request on its own goroutine (acquires may wait) under
// the in-flight bounds (fair.go admit).
func (s *Service) dispatch(req *request, forwarded bool) {
	if req.reply == "" {
		// A publish without a reply subject asks nothing. micro counts it
		// as a request whose reply failed, and so does STATS here: the
		// publish to "" fails and is recorded.
		_ = req.ok(nil)
		return
	}
	if !s.admit(req) {
		return
	}
	s.mu.Lock()
	if s.refusing {
		s.mu.Unlock()
		req.leaveAdmission()
		_ = req.fail(protocol.Errorf(protocol.CodeShuttingDown, "node %d is shutting down", s.cfg.Locks.ID()))
		return
	}
	s.wg.Add(1)
	s.requests.Add(1)
	s.mu.Unlock()
	s.workers.spawn(func() {
		defer s.wg.Done()
		defer s.requests.Done()
		defer req.leaveAdmission()
		s.handle(req, forwarded)
	})
}

func (s *Service) handle(req *request, forwarded bool) {
	srv := s.cfg.Locks
	if req.op == "status" {
		s.reply(req, s.status())
		return
	}
	if !srv.IsLeader() && srv.Leader() == srv.ID() {
		// Elected, not yet caught up (a hand-over just made this node
		// leader): wait a moment rather than send the request away.
		s.await(req.received.Add(LeaderWaitMax), srv.IsLeader)
	}
	if !srv.IsLeader() {
		if forwarded {
			// Never forward twice: the sender believed we lead, we do not.
			s.replyErr(req, protocol.Errorf(protocol.CodeNotLeader, "node %d is not the leader", srv.ID()))
			return
		}
		s.forward(req)
		return
	}
	if req.reply != "" && !req.noted {
		req.noted = true
		s.origins.note(req.reply)
	}
	switch req.op {
	case "acquire":
		s.acquire(req)
	case "release":
		s.release(req)
	case "get":
		s.get(req)
	case "renew":
		s.renew(req)
	case "list":
		s.list(req)
	case "withdraw":
		s.withdraw(req)
	case "check":
		s.check(req)
	case "fence_keys":
		s.fenceKeys(req)
	case protocol.SessionOpOpen, protocol.SessionOpKeepAlive, protocol.SessionOpClose:
		s.session(req)
	default:
		s.replyErr(req, protocol.Errorf(protocol.CodeInvalidArgument, "unknown operation %q", req.op))
	}
}

// background runs f on its own goroutine until Stop (which waits for it);
// after Stop it does nothing.
func (s *Service) background(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

func (s *Service) acquire(req *request) {
	ar, err := protocol.DecodeAcquire(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	if !s.owns(req, ar.Key) {
		return
	}
	lease, wait, timeout, _ := ar.Validate()
	limit, mode := ar.Kind()
	if ar.Session != "" && s.cfg.Partition.Partitioned() {
		s.replyErr(req, s.sessionsRefused())
		return
	}
	ctx, cancel := context.WithDeadline(req.context(s.ctx), req.received.Add(timeout))
	defer cancel()
	unpark := func() {}
	defer func() { unpark() }()
	g, err := s.cfg.Locks.Acquire(ctx, lockservice.AcquireParams{
		Key: ar.Key, Owner: ar.Owner, Lease: lease, Wait: wait, Received: req.receivedLease, Timeout: timeout, WaitID: ar.WaitID, RequestID: ar.RequestID,
		Session: ar.SessionID(), LockDelay: time.Duration(ar.LockDelayMS) * time.Millisecond, Limit: limit, Mode: mode,
		// Called on this goroutine, inside Acquire.
		Parked: func() {
			req.leaveAdmission()
			unpark = s.parked.add(req.reply, cancel)
		},
	})
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	rep := protocol.AcquireReply{Key: g.Key, Token: g.Token, Owner: ar.Owner, LeaseMS: g.Lease.Milliseconds(), Index: g.Index, Group: s.group(), Fence: g.Fence}
	rep.Limit, rep.Mode = kindFields(g.Limit, g.Mode)
	if g.Repeated {
		rep.Repeated, rep.RemainingMS, rep.Owner = true, max(1, g.Remaining.Milliseconds()), g.Owner
	}
	body, _ := json.Marshal(rep)
	if g.Queued {
		// Its requester waited and may have left: learn it for certain
		// and release at once (delivery.go). Immediate grants skip this.
		var h nats.Header
		if req.forwarded {
			h = nats.Header{HeaderQueued: []string{"1"}}
		}
		onLost := func() {
			s.log.Info("the requester of a queued grant is gone; releasing", "key", g.Key, "token", g.Token)
			s.cfg.Locks.ReleaseUndelivered(g.Key, g.Token)
		}
		if err := req.okWatched(body, h, onLost); err != nil {
			s.log.Warn("acquire reply could not be written; releasing", "key", g.Key, "token", g.Token, "err", err)
			s.cfg.Locks.ReleaseUndelivered(g.Key, g.Token)
		}
		return
	}
	if err := req.ok(body); err != nil && !g.Repeated {
		// The reply never left this node: nobody can hold this token (a
		// repeated grant's earlier attempt may have received it).
		s.log.Warn("acquire reply could not be written; releasing", "key", g.Key, "token", g.Token, "err", err)
		s.cfg.Locks.ReleaseUndelivered(g.Key, g.Token)
	}
}

func (s *Service) release(req *request) {
	rr, err := protocol.DecodeRelease(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	if err := s.cfg.Locks.Release(ctx, rr.Key, rr.Token); err != nil {
		s.replyLockErr(req, err)
		return
	}
	s.reply(req, protocol.ReleaseReply{Key: rr.Key, Released: true})
}

func (s *Service) get(req *request) {
	gr, err := protocol.DecodeGet(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	if !s.owns(req, gr.Key) {
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	h, err := s.cfg.Locks.Get(ctx, gr.Key)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	body, err := fitHolders(getReply(gr.Key, h), int(s.cfg.Conn.MaxPayload())-listReplyHeadroom)
	if err != nil {
		s.replyErr(req, protocol.Errorf(protocol.CodeInternal, "encode reply: %v", err))
		return
	}
	if err := req.ok(body); err != nil {
		s.log.Debug("reply not written", "op", req.op, "err", err)
	}
}

func (s *Service) reply(req *request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.replyErr(req, protocol.Errorf(protocol.CodeInternal, "encode reply: %v", err))
		return
	}
	if err := req.ok(body); err != nil {
		s.log.Debug("reply not written", "op", req.op, "err", err)
	}
}

// LeaderWaitMax bounds how long a request waits for a leader to be known
// (to forward it there) or for this newly elected node to be ready: the
// moments of a leadership hand-over, not an election, which clients retry.
const LeaderWaitMax = 250 * time.Millisecond

// awaitPoll is how often await looks again: a hand-over takes a few
// milliseconds.
const awaitPoll = 2 * time.Millisecond

// await polls cond until it holds, deadline passes or the service stops.
func (s *Service) await(deadline time.Time, cond func() bool) {
	if cond() {
		return
	}
	t := time.NewTicker(awaitPoll)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if cond() {
			return
		}
	}
}

// replyLockErr answers a lock operation's error. A NotLeaderError says the
// lock service did nothing (every such error comes before a proposal, or
// from one raft never took): a client's request then goes on to the leader,
// as if NATS had handed it to this node just after it lost leadership
// (a hand-over between NATS's delivery and our proposal), instead of
// making every client retry.
func (s *Service) replyLockErr(req *request, err error) {
	var nl *lockservice.NotLeaderError
	// Only a request that met the hand-over soon after it came: the next
	// leader counts its wait and deadline from its own receipt, so an
	// acquire that had waited here long would get a fresh wait there, past
	// the time its requester gives it.
	if !req.forwarded && errors.As(err, &nl) && time.Since(req.received) < LeaderWaitMax {
		// Not back to this node at once: it may still lead, moving its
		// leadership elsewhere (raftstore's drain refuses proposals).
		s.forwardTo(req, s.cfg.Locks.ID())
		return
	}
	s.replyErr(req, toProtocolError(err))
}

func (s *Service) replyErr(req *request, e *protocol.Error) {
	if err := req.fail(e); err != nil {
		s.log.Debug("error reply not written", "op", req.op, "code", e.Code, "err", err)
	}
}

func errorBody(e *protocol.Error) []byte {
	b, _ := json.Marshal(protocol.ErrorReply{Error: e})
	return b
}

// oneLine keeps header values on one line.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\r", " ")
	s = strings.ReplaceAll(s, "\n", " ")
	if s == "" {
		s = "error"
	}
	return s
}
