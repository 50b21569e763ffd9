package natsapi

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// The session endpoints (docs/protocol.md §11): open, keepalive and close,
// served by the leader like the lock endpoints (a follower forwards them).
// A partitioned node does not serve them: a session lives in one group's
// state while its keys would spread over every group, so sessions are
// refused there for now (docs/scaling.md), and so is an acquire that
// names one.

// sessionOps are the session endpoints' op names.
var sessionOps = []string{protocol.SessionOpOpen, protocol.SessionOpKeepAlive, protocol.SessionOpClose}

// sessionsRefused is the error of a session request on a partitioned node.
func (s *Service) sessionsRefused() *protocol.Error {
	return protocol.Errorf(protocol.CodeUnsupported, "sessions are not served by a partitioned deployment (group %d of %d): hold the locks with leases, or run an unpartitioned cluster (docs/scaling.md)",
		s.cfg.Partition.Group, s.cfg.Partition.Groups)
}

func (s *Service) sessionOpen(req *request) {
	r, err := protocol.DecodeSessionOpen(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	si, err := s.cfg.Locks.OpenSession(ctx, time.Duration(r.TTLMS)*time.Millisecond, time.Duration(r.LockDelayMS)*time.Millisecond)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	s.reply(req, protocol.SessionOpenReply{Session: protocol.FormatSessionID(si.ID), TTLMS: si.TTL.Milliseconds(), LockDelayMS: si.LockDelay.Milliseconds()})
}

func (s *Service) sessionKeepAlive(req *request) {
	r, id, err := protocol.DecodeSession(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	ttl, err := s.cfg.Locks.KeepAlive(ctx, id)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	if err := req.ok(keepAliveReply(r.Session, ttl.Milliseconds())); err != nil {
		s.log.Debug("reply not written", "op", req.op, "err", err)
	}
}

// keepAliveReply is json.Marshal(protocol.SessionKeepAliveReply{...}),
// byte for byte, without reflection: keepalives are the requests a node
// serves most often when idle (one per session every TTL/3). A session ID
// that DecodeSession accepted is decimal digits, which need no escaping;
// anything else takes json.Marshal.
func keepAliveReply(session string, ttlMS int64) []byte {
	for i := 0; i < len(session); i++ {
		if session[i] < '0' || session[i] > '9' {
			b, _ := json.Marshal(protocol.SessionKeepAliveReply{Session: session, TTLMS: ttlMS})
			return b
		}
	}
	b := make([]byte, 0, len(`{"session":"","ttl_ms":}`)+len(session)+20)
	b = append(b, `{"session":"`...)
	b = append(b, session...)
	b = append(b, `","ttl_ms":`...)
	b = strconv.AppendInt(b, ttlMS, 10)
	return append(b, '}')
}

func (s *Service) sessionClose(req *request) {
	r, id, err := protocol.DecodeSession(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	n, err := s.cfg.Locks.CloseSession(ctx, id)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	s.reply(req, protocol.SessionCloseReply{Session: r.Session, Released: n})
}

// session serves one session request (handle's dispatch).
func (s *Service) session(req *request) {
	if s.cfg.Partition.Partitioned() {
		s.replyErr(req, s.sessionsRefused())
		return
	}
	switch req.op {
	case protocol.SessionOpOpen:
		s.sessionOpen(req)
	case protocol.SessionOpKeepAlive:
		s.sessionKeepAlive(req)
	case protocol.SessionOpClose:
		s.sessionClose(req)
	}
}
