package natsapi

import (
	"context"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/transports/protocol"
)

// The endpoints that let a protected resource tell a current token from a
// superseded one (issue 23): check and fence_keys. Like get they are
// served by the leader after a ReadIndex and forwarded by a follower.

// check answers whether a token is its key's current one
// (lockservice.Service.Check).
func (s *Service) check(req *request) {
	cr, err := protocol.DecodeCheck(req.data)
	if err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	if !s.owns(req, cr.Key) {
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	c, err := s.cfg.Locks.Check(ctx, cr.Key, cr.Token)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	s.reply(req, protocol.CheckReply{Key: cr.Key, Current: c.Current, Token: c.Token})
}

// fenceKeys answers the fence public keys (lockservice.Service.FenceKeys).
func (s *Service) fenceKeys(req *request) {
	if _, err := protocol.DecodeFenceKeys(req.data); err != nil {
		s.replyErr(req, toProtocolError(err))
		return
	}
	ctx, cancel := context.WithTimeout(req.context(s.ctx), protocol.DefaultReplyMargin*2)
	defer cancel()
	fk, err := s.cfg.Locks.FenceKeys(ctx)
	if err != nil {
		s.replyLockErr(req, err)
		return
	}
	out := protocol.FenceKeysReply{ClusterID: fence.FormatClusterID(fk.ClusterID), Keys: make([]string, 0, len(fk.Keys))}
	for _, k := range fk.Keys {
		pk, err := fence.NewPublicKey(k.Key)
		if err != nil {
			s.replyErr(req, protocol.Errorf(protocol.CodeInternal, "fence key %s: %v", k.ID, err))
			return
		}
		out.Keys = append(out.Keys, pk.String())
	}
	if n := len(out.Keys); n > 0 {
		out.Current = out.Keys[n-1]
	}
	s.reply(req, out)
}
