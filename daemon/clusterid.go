package daemon

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ticketd/ticketd/control"
)

// ErrWipedMember: a member of a multi-node static cluster found its data
// directory empty and was not told the cluster is new.
var ErrWipedMember = errors.New("daemon: refusing to bootstrap a static member on an empty data directory")

// settleClusterID decides which cluster this node belongs to, refuses to
// start a static member on an empty data directory unless the cluster is
// new, and records the ID in the store. The ID comes from, in order: the
// store; the admission reply of a join; for a store about to bootstrap,
// the member list and InitialClusterToken. A store that already holds raft
// state but no ID was created before cluster IDs and stays at 0.
func (d *Daemon) settleClusterID(m membership, join *control.Reply) (uint64, error) {
	if id, ok, err := d.store.ClusterID(); err != nil || ok {
		return id, err
	}
	last, err := d.store.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("daemon: read the raft log: %w", err)
	}
	var id uint64
	switch {
	case join != nil:
		id = join.ClusterID
	case last > 0:
		return 0, nil
	case len(m.peers) > 1 && d.cfg.InitialClusterState != ClusterStateNew:
		return 0, fmt.Errorf("%w: %s holds no raft state and initial-cluster-state is %q. Start every member with --initial-cluster-state new only when creating the cluster; a member that lost its data must be replaced, not bootstrapped again (it could vote twice in a term)",
			ErrWipedMember, d.cfg.Data, d.cfg.InitialClusterState)
	default:
		id = deriveClusterID(d.cfg.InitialClusterToken, m.peers)
	}
	if id == 0 {
		return 0, nil
	}
	if err := d.store.SetClusterID(id); err != nil {
		return 0, fmt.Errorf("daemon: %w", err)
	}
	return id, nil
}

// deriveClusterID is the ID every member of a new static cluster computes
// alike, without talking to the others: from the token and the member ids.
// Not from their addresses, which members may legitimately know under
// different names (a proxy, NAT, a DNS name for an IP).
func deriveClusterID(token string, members []Member) uint64 {
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, strconv.FormatUint(m.ID, 10))
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte("ticketd cluster id\x00" + token + "\x00" + strings.Join(ids, ",")))
	return max(1, binary.BigEndian.Uint64(sum[:8]))
}
