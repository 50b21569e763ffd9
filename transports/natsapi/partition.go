package natsapi

import (
	"fmt"

	"github.com/ticketd/ticketd/transports/protocol"
)

// A group of a partitioned deployment (docs/scaling.md) serves only the
// keys that hash to it. The NATS mapping delivers only those, but the
// subject a request arrives on was computed by its sender: a request for
// key K sent on another key's subject, or a mapping whose group count the
// nodes do not share, would let two groups grant the same key, each with
// tokens of its own. So the leader checks every acquire, renew, get and
// check against the key itself and answers wrong_group, having done nothing.
// Releases and withdrawals are not checked: they only end what this group
// granted or queued (which passed the check when it did), and while a key
// moves to a new group its holders must still be able to let it go here.

// owns reports whether this node's group serves key, and answers
// wrong_group when it does not.
func (s *Service) owns(req *request, key string) bool {
	p := s.cfg.Partition
	if p.Owns(key) {
		return true
	}
	s.replyErr(req, p.WrongGroup(key))
	return false
}

// group is the group for replies that name it (acquire, status): nil when
// the node is not partitioned.
func (s *Service) group() *uint32 {
	if !s.cfg.Partition.Partitioned() {
		return nil
	}
	g := s.cfg.Partition.Group
	return &g
}

// serviceMetadata is what $SRV.INFO says of the node: its raft id and, when
// partitioned, its group (raft ids repeat across groups).
func serviceMetadata(id uint64, p protocol.Partition) map[string]string {
	md := map[string]string{"node_id": fmt.Sprint(id)}
	if p.Partitioned() {
		md["group"] = fmt.Sprint(p.Group)
		md["groups"] = fmt.Sprint(p.Groups)
	}
	return md
}
