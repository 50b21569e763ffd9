package natsapi

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ticketd/ticketd/transports/protocol"
)

// MaxForwardHops bounds how many leaders in turn a forwarded request is
// sent to while leadership keeps moving.
const MaxForwardHops = 3

// forward proxies a request to the leader and relays its reply. The
// follower never answers from its own state: it relays what the leader
// said, or says why it could not reach it.
func (s *Service) forward(req *request) { s.forwardTo(req, 0) }

// forwardTo forwards req to the leader, once one other than notFrom (a
// node that just answered not_leader) is known or LeaderWaitMax passed,
// or serves it here if this node leads by then. A request goes through at
// most MaxForwardHops forwards.
func (s *Service) forwardTo(req *request, notFrom uint64) {
	srv := s.cfg.Locks
	if req.hops >= MaxForwardHops {
		s.replyErr(req, protocol.Errorf(protocol.CodeUnavailable, "leadership kept moving while the request was forwarded; retry"))
		return
	}
	req.hops++
	s.await(time.Now().Add(LeaderWaitMax), func() bool {
		l := srv.Leader()
		return l != 0 && l != notFrom && (l != srv.ID() || srv.IsLeader())
	})
	leader := srv.Leader()
	if leader == srv.ID() && srv.IsLeader() {
		s.handle(req, req.forwarded) // this node leads now
		return
	}
	if leader == 0 || leader == srv.ID() {
		s.replyErr(req, protocol.Errorf(protocol.CodeUnavailable, "no leader is known; retry"))
		return
	}
	s.lead.forwarded.Add(1)
	timeout := ForwardTimeoutDefault
	if req.op == "acquire" {
		ar, err := protocol.DecodeAcquire(req.data)
		if err != nil {
			s.replyErr(req, toProtocolError(err))
			return
		}
		_, _, timeout, _ = ar.Validate()
	}
	ctx, cancel := context.WithDeadline(s.ctx, req.received.Add(timeout+ForwardGraceDefault))
	defer cancel()
	m, err := s.cfg.Conn.RequestMsgWithContext(ctx, &nats.Msg{Subject: s.cfg.Partition.ForwardSubject(leader, req.op), Data: req.data, Header: forwardHeader(req.header, req.identity)})
	if err == nil && m.Header.Get(micro.ErrorCodeHeader) == string(protocol.CodeNotLeader) && time.Since(req.received) < LeaderWaitMax {
		// The node asked did nothing (it never forwards again) and
		// leadership has moved on: ask whoever leads now (only a young
		// request, as in replyLockErr).
		cancel()
		s.forwardTo(req, leader)
		return
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// Nobody received it: certainly no effect.
		s.replyErr(req, protocol.Errorf(protocol.CodeUnavailable, "leader %d is not reachable; retry", leader))
		return
	case err != nil && readOnlyOp(req.op):
		s.replyErr(req, protocol.Errorf(protocol.CodeUnavailable, "leader %d did not answer: %v", leader, err))
		return
	case err != nil:
		// The leader may have applied it: do not guess.
		s.replyErr(req, protocol.Errorf(protocol.CodeIndeterminate, "leader %d did not answer in time: %v", leader, err))
		return
	}
	var onLost func()
	if req.op == "acquire" && m.Header.Get(HeaderQueued) != "" {
		// The requester waited: it may be gone (delivery.go).
		m.Header.Del(HeaderQueued)
		onLost = func() { s.releaseUndelivered(leader, req.identity, m.Data) }
	}
	if err := req.relay(m.Data, m.Header, onLost); err != nil {
		s.log.Debug("relayed reply not written", "op", req.op, "err", err)
		if req.op == "acquire" {
			s.releaseUndelivered(leader, req.identity, m.Data)
		}
	}
}

// releaseUndelivered asks the leader to release a grant whose reply this
// follower could not relay: nobody can hold that token (SPEC §4.4), unless
// it is a repeated grant, which an earlier attempt of its request id may
// have received: that one is left to its lease, as the leader does. It is
// the cluster's own request (HeaderLostReply): the requester's access list
// entry may allow acquire and not release, and the grant must go anyway.
func (s *Service) releaseUndelivered(leader uint64, identity string, reply []byte) {
	var ar protocol.AcquireReply
	if protocol.ParseReply(reply, &ar) != nil || ar.Token == 0 || ar.Repeated {
		return
	}
	body, _ := json.Marshal(protocol.ReleaseRequest{Key: ar.Key, Token: ar.Token})
	ctx, cancel := context.WithTimeout(s.ctx, ForwardTimeoutDefault)
	defer cancel()
	h := forwardHeader(nil, identity)
	h.Set(HeaderLostReply, "1")
	if _, err := s.cfg.Conn.RequestMsgWithContext(ctx, &nats.Msg{Subject: s.cfg.Partition.ForwardSubject(leader, "release"), Data: body, Header: h}); err != nil {
		s.log.Warn("release of an undelivered grant failed; it will expire with its lease", "key", ar.Key, "token", ar.Token, "err", err)
	}
}

// readOnlyOp reports whether op changes nothing, so a leader that did not
// answer a forward of it leaves nothing indeterminate.
func readOnlyOp(op string) bool {
	switch op {
	case "get", "list", "check", "fence_keys":
		return true
	}
	return false
}
