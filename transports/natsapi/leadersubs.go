package natsapi

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// LeaderCheckInterval is how often a node re-checks whether it should
// serve the lock subjects, besides being told at once (LeadershipChanged).
const LeaderCheckInterval = 100 * time.Millisecond

// DeposedSubsGrace is how long a node that lost leadership keeps its
// lock subscriptions, forwarding what NATS still hands it, before it
// leaves the queue group.
const DeposedSubsGrace = time.Second

// Leader-only lock subjects.
//
// Only the ready leader subscribes to the lock subjects (acquire, release,
// get, ...): a request sent to a follower would only be forwarded to the
// leader over one more NATS hop, which cost a third of the cluster's CPU
// under load. Status, node status and the control refusal stay on every
// node, and so does each node's forward subject: the forward path is the
// fallback for the hand-over window.
//
// Why this is safe:
//   - The lock subjects are in one queue group: NATS gives each request to
//     at most one subscribed node, whoever is subscribed.
//   - Whether a node answers is still decided per request, in handle, by
//     lockservice.IsLeader, never by the subscription. A deposed leader
//     still subscribed (DeposedSubsGrace) forwards a client request
//     to the leader it knows, or answers unavailable, and answers a
//     forwarded one not_leader — exactly what every follower did before.
//   - A node subscribes only after the lock service is ready, i.e. this
//     node leads and has applied every entry before its term; until then
//     nobody may be subscribed, and clients get NATS "no responders",
//     which says nobody received the request: retryable, nothing happened
//     (the SDK retries it within its budget; docs/protocol.md §4 tells
//     plain clients to).
//   - Subscribing and unsubscribing never touch the Ready loop: the
//     leadership observer only kicks reconcile, which runs on its own
//     goroutine and reads the lock service's state afresh each time, so
//     a missed or reordered kick is corrected by the next check.

// leaderSubs are the lock endpoints this node serves only while it is the
// ready leader, and their subscriptions while it does.
type leaderSubs struct {
	nc   *nats.Conn
	kick chan struct{}

	mu        sync.Mutex // guards eps, subs, drained and closed
	eps       []leaderEndpoint
	subs      []*nats.Subscription // nil while not serving
	drained   []*nats.Subscription // subs drained on a lost leadership, for Stop to wait on
	closed    bool                 // Stop ran: never subscribe again
	deposedAt time.Time            // when reconcile first found subs without leadership
	serving   atomic.Bool
	forwarded atomic.Uint64 // client lock requests this node forwarded
}

type leaderEndpoint struct {
	ep      *endpoint
	subject string
	queue   string
	cb      nats.MsgHandler
}

func newLeaderSubs(nc *nats.Conn) *leaderSubs {
	return &leaderSubs{nc: nc, kick: make(chan struct{}, 1)}
}

// addLockEndpoint lists a lock endpoint in the micro service (INFO and
// STATS show it on every node) and leaves its subscription to reconcile.
func (s *Service) addLockEndpoint(op, subject, queue string, h func(*endpoint, *nats.Msg)) {
	e := &endpoint{}
	e.info.Name, e.info.Subject, e.info.QueueGroup = op, subject, queue
	s.svc.mu.Lock()
	s.svc.endpoints = append(s.svc.endpoints, e)
	s.svc.mu.Unlock()
	s.lead.mu.Lock()
	s.lead.eps = append(s.lead.eps, leaderEndpoint{ep: e, subject: subject, queue: queue, cb: func(m *nats.Msg) { h(e, m) }})
	s.lead.mu.Unlock()
}

// LeadershipChanged tells the service that this node may have become, or
// stopped being, the ready leader; it never blocks (raftstore calls it
// from its Ready loop through an Observer).
func (s *Service) LeadershipChanged() {
	select {
	case s.lead.kick <- struct{}{}:
	default:
	}
}

// Serving reports whether this node is subscribed to the lock subjects.
func (s *Service) Serving() bool { return s.lead.serving.Load() }

// Forwarded counts the client lock requests this node forwarded to the
// leader; in steady state, with leader-only subscriptions, it stays 0.
func (s *Service) Forwarded() uint64 { return s.lead.forwarded.Load() }

// runLeaderSubs keeps the lock subscriptions in step with leadership
// until the service stops.
func (s *Service) runLeaderSubs() {
	defer s.wg.Done()
	t := time.NewTicker(LeaderCheckInterval)
	defer t.Stop()
	for {
		if err := s.reconcileLeaderSubs(s.cfg.Locks.IsLeader()); err != nil {
			s.log.Warn("lock subscriptions not updated; retrying", "err", err)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.lead.kick:
		case <-t.C:
		}
	}
}

// reconcileLeaderSubs subscribes the lock endpoints when lead and they
// are not, and unsubscribes them when not lead and they are.
func (s *Service) reconcileLeaderSubs(lead bool) error {
	l := s.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case lead && l.subs == nil && !l.closed:
		subs := make([]*nats.Subscription, 0, len(l.eps))
		for _, e := range l.eps {
			sub, err := l.nc.QueueSubscribe(e.subject, e.queue, e.cb)
			if err != nil {
				err = fmt.Errorf("natsapi: subscribe %s: %w", e.subject, err)
				return errors.Join(err, unsubscribeAll(subs))
			}
			subs = append(subs, sub)
		}
		l.subs = subs
		l.serving.Store(true)
		s.log.Info("serving the lock subjects as leader", "subjects", len(subs))
	case lead:
		l.deposedAt = time.Time{}
	case !lead && l.subs != nil && !l.closed:
		// Keep serving (forwarding) for DeposedSubsGrace first: NATS
		// re-routes a queue message that reaches a server without a
		// local member to another member it knows, so once the next
		// leader's subscription has spread, nothing sent towards this
		// node's server is lost when it finally leaves the group.
		if l.deposedAt.IsZero() {
			l.deposedAt = time.Now()
		}
		if time.Since(l.deposedAt) < DeposedSubsGrace {
			return nil
		}
		l.deposedAt = time.Time{}
		// Drain, not unsubscribe: requests NATS already handed to this
		// node are still handled (forwarded to the new leader, or
		// answered not_leader), instead of vanishing without a reply
		// that the client would have to call indeterminate.
		err := drainAll(l.subs)
		l.drained = append(stillDraining(l.drained), l.subs...)
		l.subs = nil
		l.serving.Store(false)
		s.log.Info("stopped serving the lock subjects: not the leader")
		return err
	}
	return nil
}

// stopLeaderSubs drains the lock subscriptions for good (Stop) and
// returns every lock subscription still draining, so that Stop can wait
// until the requests NATS already handed to this node are handled.
func (s *Service) stopLeaderSubs() ([]*nats.Subscription, error) {
	l := s.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	var err error
	if l.subs != nil {
		err = drainAll(l.subs)
		l.drained = append(l.drained, l.subs...)
		l.subs = nil
		l.serving.Store(false)
		s.log.Info("stopped serving the lock subjects: stopping")
	}
	return stillDraining(l.drained), err
}

// stillDraining is the subscriptions of subs that are still draining.
func stillDraining(subs []*nats.Subscription) []*nats.Subscription {
	kept := subs[:0]
	for _, sub := range subs {
		if sub.IsDraining() {
			kept = append(kept, sub)
		}
	}
	return kept
}

// StopDrainTimeout bounds how long Stop waits for the requests already
// delivered to this node to be handed to their handlers.
const StopDrainTimeout = 2 * time.Second

// noneDraining reports whether none of subs is draining any more.
func noneDraining(subs []*nats.Subscription) bool {
	for _, sub := range subs {
		if sub.IsDraining() {
			return false
		}
	}
	return true
}

func drainAll(subs []*nats.Subscription) error {
	var err error
	for _, sub := range subs {
		if derr := sub.Drain(); derr != nil && !errors.Is(derr, nats.ErrConnectionClosed) && !errors.Is(derr, nats.ErrBadSubscription) {
			err = errors.Join(err, fmt.Errorf("natsapi: drain %s: %w", sub.Subject, derr))
		}
	}
	return err
}

func unsubscribeAll(subs []*nats.Subscription) error {
	var err error
	for _, sub := range subs {
		if uerr := sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) && !errors.Is(uerr, nats.ErrBadSubscription) {
			err = errors.Join(err, uerr)
		}
	}
	return err
}
