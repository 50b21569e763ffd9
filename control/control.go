package control

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/connlimit"
	"github.com/ticketd/ticketd/raftstore"
)

// Control plane limits and defaults.
const (
	// MaxBody bounds a control request body.
	MaxBody = 4 << 10
	// TimeoutDefault bounds one control request on the leader.
	TimeoutDefault = 10 * time.Second
	// PromoteLagDefault: a learner within this many entries of the commit
	// index counts as caught up (promotion, replacement completion).
	PromoteLagDefault = 64
	// ReconcileIntervalDefault is how often the leader aligns the raft
	// membership with the replicated control state.
	ReconcileIntervalDefault = 100 * time.Millisecond
	// shutdownTimeout bounds Close's wait for control requests in flight.
	shutdownTimeout = 2 * time.Second
)

// Node is the raft node as the control plane uses it. *raftstore.Node
// satisfies it. Every method is called concurrently, from the HTTP
// handlers and the reconcile loop.
type Node interface {
	// Leader is the raft id of the leader as this node knows it (0: none).
	Leader() uint64
	// View runs f on the applied state machine (the replicated control
	// state: members, credentials, a pending replacement).
	View(f func(m *core.Machine))
	// ConfState is the raft membership as last applied.
	ConfState() raftpb.ConfState
	// Status carries, on the leader, each follower's progress.
	Status() raft.Status
	// Propose proposes a control command and waits for its result.
	Propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error)
	// ProposeConfChange proposes a raft membership change.
	ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeV2) error
	// ReadIndex returns once the applied state holds every write committed
	// before the call (on the leader).
	ReadIndex(ctx context.Context) error
	// ViewIndexed is View with the log index of the state f reads (the
	// node's applied index may still be below it: raftstore.Node.ViewIndexed).
	ViewIndexed(f func(m *core.Machine, index uint64))
	// Term is the current raft term.
	Term() uint64
}

// Leadership says whether this node is the ready leader: leader of the
// current term with every earlier entry applied and the lock service
// serving. *lockservice.Service satisfies it. raftstore.Node.IsLeader does not
// (it is true from the election on, before earlier terms are applied),
// and raftstore.Node.LeaderReady is not quite it either: it turns true
// just before the lock service has re-armed its leases, and false at the
// start of the Ready that demotes the node rather than at its end.
type Leadership interface {
	IsLeader() bool
}

// Peers is the raft peer transport's address book. *peer.Transport
// satisfies it. Calls are serialised by the Plane.
type Peers interface {
	AddPeer(id uint64, addr string)
	RemovePeer(id uint64)
}

var _ Node = (*raftstore.Node)(nil)

// Config configures a Plane.
type Config struct {
	// ID is this node's raft id.
	ID         uint64
	Node       Node
	Leadership Leadership
	// Peers, if not nil, is made to dial exactly the members of the
	// replicated control state. Leave it nil (not a nil pointer in an
	// interface) for a node without a peer transport.
	Peers Peers
	// Addresses are the peer addresses known at start, by raft id; the
	// Plane keeps them current with the control state (Address).
	Addresses map[uint64]string
	// ClusterID is this node's cluster ID, handed to the nodes it admits
	// (0: a cluster created before cluster IDs).
	ClusterID uint64
	// Listen is the control API's listen address; "" serves no API (the
	// reconcile loop runs anyway).
	Listen string
	// TLS, if set, serves the API over TLS with it (set ClientCAs and
	// ClientAuth for mutual TLS). Without it, Start refuses a Listen
	// address that is not loopback: the API carries credentials.
	TLS *tls.Config
	// MaxConns and MaxConnsPerSource bound open API connections, in all
	// and from one address; HandshakeTimeout bounds a TLS handshake.
	// FailureBurst and FailureRefill bound failed attempts per source
	// address, and FailureDelay paces a source beyond them (limits.go).
	// Zero means the ...Default constant.
	MaxConns, MaxConnsPerSource int
	HandshakeTimeout            time.Duration
	FailureBurst                int
	FailureRefill, FailureDelay time.Duration
	// Credential is the cluster-control credential every admin request
	// must carry; with none set every admin request is refused.
	Credential string
	// BootstrapCredential is the one-shot credential /v1/bootstrap
	// consumes ("" refuses bootstrap on this node).
	BootstrapCredential string
	// DataDir holds the identity file that bootstrap writes.
	DataDir string
	// PeerListen is the configured peer listen address and PeerAddr the
	// bound one ("" without a peer transport). Bootstrap records
	// PeerListen unless its port is 0.
	PeerListen string
	PeerAddr   string
	Logger     *slog.Logger
}

// Plane is one node's control plane: the control API (when it listens)
// and the reconcile loop.
type Plane struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex        // guards addrs and serialises Peers calls
	addrs map[uint64]string // peer addresses, as the transport knows them

	// membership serialises this node's membership changes: the reconcile
	// loop's conf changes and promotions, and a static cluster's adoption
	// (static.go), so the loop never acts on a state adoption is half way
	// through.
	membership sync.Mutex

	versionProbe VersionProbe // set before Start
	failures     *failureLimiter
	failureDelay time.Duration
	conns        *connlimit.Table // the API listener's connections
	backupKey    BackupKey        // seals the backups /v1/snapshot answers

	srv  *http.Server
	ln   net.Listener
	wg   sync.WaitGroup
	stop chan struct{}
	once sync.Once
}

// New returns a Plane; nothing runs before Start.
func New(cfg Config) *Plane {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	addrs := make(map[uint64]string, len(cfg.Addresses))
	for id, a := range cfg.Addresses {
		addrs[id] = a
	}
	return &Plane{cfg: cfg, log: log, addrs: addrs, stop: make(chan struct{}),
		failures:     newFailureLimiter(cfg.FailureBurst, cfg.FailureRefill, nil),
		failureDelay: orDefault(cfg.FailureDelay, FailureDelayDefault),
		backupKey:    NewBackupKey(cfg.Credential),
		conns: connlimit.New(connlimit.Limits{
			Total:     orDefault(cfg.MaxConns, MaxConnsDefault),
			PerSource: orDefault(cfg.MaxConnsPerSource, MaxConnsPerSourceDefault),
		})}
}

// Start listens for the control API (if Config.Listen is set) and starts
// the reconcile loop. The API is never reachable through the client NATS
// port.
func (p *Plane) Start() error {
	if p.cfg.Listen != "" {
		if err := p.listen(); err != nil {
			return err
		}
	}
	p.wg.Add(1)
	go p.reconcileLoop()
	return nil
}

// Close stops the reconcile loop, then the control API. It is safe to call
// more than once and on a Plane that was never started.
func (p *Plane) Close() {
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
		if p.srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			_ = p.srv.Shutdown(ctx)
			cancel()
		}
	})
}

// Addr is the bound control listener address ("" if none).
func (p *Plane) Addr() string {
	if p.ln == nil {
		return ""
	}
	return p.ln.Addr().String()
}

// Address is the peer address of member id as the transport knows it
// ("" if unknown).
func (p *Plane) Address(id uint64) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addrs[id]
}

// Members lists the members of the replicated control state as this node
// has applied it.
func (p *Plane) Members() []Member {
	var out []Member
	p.cfg.Node.View(func(m *core.Machine) {
		for _, mb := range m.Members() {
			out = append(out, Member{NodeID: mb.NodeID, Incarnation: mb.Incarnation, Address: mb.Address, Role: mb.Role.String()})
		}
	})
	return out
}
