package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/transports/protocol"
)

// ErrWipedMember: a member of a multi-node static cluster found its data
// directory empty and was not told the cluster is new.
var ErrWipedMember = errors.New("daemon: refusing to bootstrap a static member on an empty data directory")

// ErrForeignCluster: a new static member found another ticketd cluster's
// leader serving the lock subjects of its NATS mesh.
var ErrForeignCluster = errors.New("daemon: refusing to bootstrap a second cluster on this NATS mesh")

// settleClusterID decides which cluster this node belongs to, refuses to
// start a static member on an empty data directory unless the cluster is
// new (and, told it is new, when the running cluster shows it is not:
// refuseExistingCluster), and records the ID in the store. The ID comes from, in order: the
// store; the admission reply of a join; for a store about to bootstrap,
// the member list and InitialClusterToken. A store that already holds raft
// state but no ID was created before cluster IDs and stays at 0.
func (d *Daemon) settleClusterID(ctx context.Context, m membership, join *control.Reply) (uint64, error) {
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
		if len(m.peers) > 1 {
			if err := d.refuseExistingCluster(ctx, id); err != nil {
				return 0, err
			}
		}
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

// Asking a running cluster before bootstrapping a static member.
const (
	// existingProbeTimeout bounds the whole question: reaching the other
	// members' NATS servers, their answers included.
	existingProbeTimeout = 5 * time.Second
	// existingDialTimeout bounds the check that another member's NATS
	// route port listens at all (none listening: no member runs).
	existingDialTimeout = 500 * time.Millisecond
	// existingProbeRetry spaces status requests that met no responder,
	// at most existingNoResponderTries more of them.
	existingProbeRetry       = 50 * time.Millisecond
	existingNoResponderTries = 20
)

// refuseExistingCluster is the last check before a member told
// --initial-cluster-state new bootstraps an empty data directory: it asks,
// over NATS, whether this cluster (cluster ID id) already runs with a
// leader that knows this member as one that had data: the leader lists it
// with a match index above zero (it acknowledged entries: its data was
// lost), or no longer lists it (it was removed). Either way bootstrapping
// again would let it vote twice in a term, and a leader that remembers
// its old log would make raft panic ("tocommit is out of range"), so the
// start is refused. No other member listening, no answer, or no leader is
// no evidence, and the start goes on: a leader elected after the member
// died does not know it had data, so this catches most wiped members, not
// all.
//
// A leader of another cluster answering (another token, or a data folder
// bootstrapped as a single node and started again among members that are
// new) refuses the start too (ErrForeignCluster): the lock subjects of a
// NATS mesh (of one group, when partitioned) have one queue group, so two
// clusters on it would each grant the same keys to clients that cannot
// tell them apart.
func (d *Daemon) refuseExistingCluster(ctx context.Context, id uint64) error {
	// none logs why the start goes on.
	none := func(why string) error {
		d.log.Info("no running member says this member had data; bootstrapping it", "checked", why)
		return nil
	}
	if d.cfg.NATSURL == "" && d.cfg.NATSRoutes != "" && !d.otherRouteListens() {
		return none("no other member's NATS route port listens")
	}
	if err := d.startNATS(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, existingProbeTimeout)
	defer cancel()
	pause := func(dt time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(dt):
			return true
		}
	}
	if d.ns != nil && d.cfg.NATSRoutes != "" {
		for d.ns.NumRoutes() == 0 {
			if !pause(existingProbeRetry) {
				return none("no NATS route to another member connected")
			}
		}
	}
	ask := func(subject string) (*protocol.StatusReply, error) {
		msg, err := d.nc.RequestWithContext(ctx, subject, []byte("{}"))
		if err != nil {
			return nil, err
		}
		var st protocol.StatusReply
		if err := protocol.ParseReply(msg.Data, &st); err != nil {
			return nil, err
		}
		return &st, nil
	}
	// No responder at all once the routes are up: the others are starting
	// too (nothing serves status before it has settled its own cluster
	// ID), or none runs: a new cluster. Status subscriptions cross a new
	// route a moment after it connects, hence a few tries.
	first, err := ask(d.statusSubject())
	for tries := existingNoResponderTries; errors.Is(err, nats.ErrNoResponders) && tries > 0 && pause(existingProbeRetry); tries-- {
		first, err = ask(d.statusSubject())
	}
	switch {
	case err != nil:
		return none(fmt.Sprintf("status: %v", err))
	case first.Leader == 0:
		return none(fmt.Sprintf("node %d knows no leader", first.ID))
	}
	l := first
	if first.ID != first.Leader {
		if l, err = ask(d.cfg.Partition().NodeStatusSubject(first.Leader)); err != nil {
			return none(fmt.Sprintf("status of leader %d: %v", first.Leader, err))
		}
	}
	if l.ID != first.Leader {
		return none(fmt.Sprintf("node %d answered for leader %d", l.ID, first.Leader))
	}
	if l.ClusterID != fmt.Sprintf("%016x", id) {
		return fmt.Errorf("%w: node %d leads cluster %s on this member's NATS mesh, and this member would bootstrap cluster %016x: both would serve the same lock subjects and grant the same keys. Give each cluster NATS routes of its own (--nats-routes), stop the other cluster, or start this member with the token and members of the running one (a running cluster, a single node included, grows by --join: README, \"Control plane\")",
			ErrForeignCluster, l.ID, l.ClusterID, id)
	}
	next := fmt.Sprintf("A member that lost its data must be replaced, not bootstrapped again: start a new node with --join CONTROL_URLS --replace %d (docs/operations.md, \"Replacing a failed node\")", d.cfg.ID)
	for _, mb := range l.Members {
		if mb.ID != d.cfg.ID {
			continue
		}
		if mb.Match == 0 {
			return none(fmt.Sprintf("leader %d has not heard from this member yet", l.ID))
		}
		return fmt.Errorf("%w: %s holds no raft state, but the cluster runs and its leader, node %d, has node %d's log up to index %d: this member's data was lost. %s",
			ErrWipedMember, d.cfg.Data, l.ID, d.cfg.ID, mb.Match, next)
	}
	return fmt.Errorf("%w: the cluster runs and its leader, node %d, does not list node %d among its members: it was removed or replaced. %s",
		ErrWipedMember, l.ID, d.cfg.ID, next)
}

// otherRouteListens reports whether another member's embedded NATS server
// accepts connections on its route port: whether any other member runs.
func (d *Daemon) otherRouteListens() bool {
	for _, r := range strings.Split(d.cfg.NATSRoutes, ",") {
		r = strings.TrimSpace(r)
		if r == "" || r == d.cfg.NATSClusterListen {
			continue
		}
		if c, err := net.DialTimeout("tcp", r, existingDialTimeout); err == nil {
			_ = c.Close()
			return true
		}
	}
	return false
}
