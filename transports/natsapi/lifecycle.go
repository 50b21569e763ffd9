package natsapi

import (
	"context"
	"encoding/json"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// The lock lifecycle endpoints of issue 12: renew, list and withdraw. Like
// release and get they are served by the leader; a follower forwards them
// (service.go forward).

// renew lengthens a held lock's lease (lockservice.Service.Renew).
func (s *Service) renew(req *request) {
	rr, err := protocol.DecodeRenew(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	if !s.owns(req, rr.Key) {
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	r, err := s.cfg.Locks.Renew(ctx, rr.Key, rr.Token, time.Duration(rr.LeaseMS)*time.Millisecond)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	s.reply(req, protocol.RenewReply{Key: r.Key, Token: r.Token, LeaseMS: r.Lease.Milliseconds(), Index: r.Index})
}

// list answers one page of held locks under a prefix, read linearizably
// (lockservice.Service.List).
func (s *Service) list(req *request) {
	lr, err := protocol.DecodeList(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	limit, _ := lr.Validate()
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	p, err := s.cfg.Locks.List(ctx, lr.Prefix, lr.After, lr.AfterToken, limit)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	out := protocol.ListReply{Locks: make([]protocol.GetReply, len(p.Locks)), More: p.More, Index: p.Index}
	for i, h := range p.Locks {
		out.Locks[i] = holderReply(h.Lock.Key, h)
	}
	body, err := fitListPage(out, int(s.cfg.Conn.MaxPayload())-listReplyHeadroom)
	if err != nil {
		s.replyErr(req, protocol.Errorf(protocol.CodeInternal, "encode reply: %v", err))
		return
	}
	if err := req.ok(body); err != nil {
		s.log.Debug("reply not written", "op", req.op, "err", err)
	}
}

// listReplyHeadroom is kept free of a list reply's body under the
// server's maximum payload, for the reply's headers.
const listReplyHeadroom = 4 << 10

// fitListPage encodes out, dropping locks from the end of the page (and
// setting More) until the body fits in max bytes. Keys and owners may hold
// control characters, which JSON escapes to six bytes each, so a page of
// protocol.MaxListLimit locks can far exceed NATS's maximum payload; one
// lock always fits. It cuts between keys where it can, so that a client
// that knows only after (the last key) loses nothing; a page that is one
// key's holders alone is cut between them, and NextAfterToken (the last
// lock's token) tells the client to resume inside that key.
func fitListPage(out protocol.ListReply, max int) ([]byte, error) {
	for {
		body, err := json.Marshal(out)
		if err != nil || len(body) <= max || len(out.Locks) <= 1 {
			return body, err
		}
		n := len(out.Locks) / 2
		k := n
		for k > 0 && out.Locks[k-1].Key == out.Locks[n].Key {
			k--
		}
		if k > 0 {
			n = k
		}
		out.NextAfterToken = 0
		if out.Locks[n-1].Key == out.Locks[n].Key {
			out.NextAfterToken = out.Locks[n-1].Token
		}
		out.Locks, out.More = out.Locks[:n], true
	}
}

// withdraw takes the requester's own wait out of its key's queue, or
// releases the grant that raced it (lockservice.Service.Withdraw).
func (s *Service) withdraw(req *request) {
	wr, err := protocol.DecodeWithdraw(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	w, err := s.cfg.Locks.Withdraw(ctx, wr.Key, wr.WaitID, wr.RequestID)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	s.reply(req, protocol.WithdrawReply{Key: wr.Key, Withdrawn: w.Withdrawn, ReleasedToken: w.ReleasedToken, EndedToken: w.EndedToken, NotGranted: w.NotGranted})
}
