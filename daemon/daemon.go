package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/plugins/audit"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/natsapi"
	"github.com/ticketd/ticketd/transports/peer"
)

// StoreDir is the raft store's directory inside a node's data directory
// (ticketd snapshot restore seeds it).
const StoreDir = "raft"

// StartTimeoutDefault bounds how long Start waits for the embedded NATS
// server and the NATS connection.
const StartTimeoutDefault = 10 * time.Second

// Options are in-process hooks that have no config-file form.
type Options struct {
	Logger *slog.Logger
	// Policy, if set, is asked before every Grant instead of the loaded
	// plugins.
	Policy plugins.Policy
	// Now overrides the lease clock (tests).
	Now func() time.Time
	// FS, if set, is the filesystem of the raft store (tests inject disk
	// faults with Pebble's vfs/errorfs).
	FS vfs.FS
	// OnStorageFailure, if set, is called after the one log line of a
	// storage failure the store cannot go on from; `ticketd serve` exits
	// the process there. Without it the node stops (fail-stop) when the
	// failure happens in its raft loop's write.
	OnStorageFailure func(error)
	// KeepLeftWaits turns off the sweep that ends the waits of requesters
	// that left (natsapi fair.go): tests of what happens to such a wait
	// when its turn comes use it.
	KeepLeftWaits bool
	// TuneGC bounds the garbage collector's headroom (gc.go) while the
	// node runs; only a process that is the node's own sets it.
	TuneGC bool
	// MaxClusterVersion, test-only (no flag sets it), makes this node act
	// as a binary of that older cluster version in an upgrade
	// (oldversion.go); 0 is core.MaxClusterVersion.
	MaxClusterVersion uint64
}

// Daemon is one running node.
type Daemon struct {
	// baseLog is the logger as given; log adds this node's id.
	baseLog *slog.Logger
	cfg     Config
	log     *slog.Logger
	store   *raftstore.Store
	node    *raftstore.Node
	locks   *lockservice.Service
	peers   *peer.Transport
	ns      *natsserver.Server
	nc      *nats.Conn
	api     *natsapi.Service
	// watch publishes every applied lock change on its key's watch
	// subject (natsapi/watch.go).
	watch *natsapi.WatchPublisher
	// apiKick is api once it runs, for the raft loop's leadership
	// observer, which starts before it.
	apiKick atomic.Pointer[natsapi.Service]
	http    *http.Server
	reg     *prometheus.Registry

	plugins *plugins.Set
	audit   *audit.Publisher
	ctl     *control.Plane
	// clusterID binds the peer handshake to this cluster (0: a cluster
	// created before cluster IDs).
	clusterID uint64
	// controlServerTLS serves the control API (nil: plain, loopback
	// only); controlClientTLS is how this node calls other nodes' API.
	controlServerTLS, controlClientTLS *tls.Config

	// removal records this node's removal from the cluster (removed.go);
	// done is closed when the node cannot go on: its raft loop stopped,
	// or it was removed. watching says the removal watcher runs.
	removal  *removal
	done     chan struct{}
	watching bool

	// placementStop stops the leader-placement loop (placement.go) and
	// waits for it, once (later calls return at once); nil when it does
	// not run.
	placementStop func()
	// gcStop ends tuneGC (gc.go), when Options.TuneGC started it.
	gcStop func()

	closeOnce sync.Once
}

// Start brings up a node. ctx bounds start-up only (joining, identity
// checks); the node runs until Close. On error everything already started
// is stopped.
func Start(ctx context.Context, cfg Config, opts Options) (_ *Daemon, err error) {
	if cfg, err = cfg.LoadSecretFiles(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Daemon{cfg: cfg, baseLog: log, log: startLogger(log, cfg), reg: prometheus.NewRegistry(),
		removal: newRemoval(), done: make(chan struct{})}
	// Every error return below leaves through here: undo what started.
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	raftMetrics := raftstore.NewMetrics(d.reg)
	if err := d.openStore(ctx, opts, raftMetrics); err != nil {
		return nil, err
	}
	m, err := d.resolveMembership(ctx)
	if err != nil {
		return nil, err
	}
	if err := d.startRaft(ctx, opts, m, raftMetrics); err != nil {
		return nil, err
	}
	if err := d.checkNotRemoved(ctx); err != nil {
		return nil, err
	}
	d.ctl = control.New(d.controlConfig(m.addrs))
	if err := d.startClientService(ctx, opts); err != nil {
		return nil, err
	}
	if d.cfg.MetricsListen != "" {
		if err := d.startHTTP(); err != nil {
			return nil, err
		}
	}
	d.ctl.SetVersionProbe(versionProbe(d.api.MemberVersion, opts.MaxClusterVersion))
	if err := d.ctl.Start(); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.watching = true
	go d.watchRemoval()
	go func() {
		select {
		case <-d.node.Done():
			close(d.done)
		case <-d.removal.done:
			close(d.done)
		case <-d.removal.stop:
		}
	}()
	if opts.TuneGC {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); tuneGC(ctx, gcTuneInterval, GCHeadroom) }()
		d.gcStop = func() { cancel(); <-done }
	}
	d.log.Info("node started", "data", d.cfg.Data, "nats", natsclient.Redact(d.ClientURL()), "members", len(m.peers), "acl", d.cfg.ACL != "", "partition", d.cfg.Partition().String())
	return d, nil
}

// startLogger is the node's logger until its identity is settled
// (resolveMembership): under the id of its identity file when it has one,
// under no id on a fresh join (the join assigns it), else under the
// configured id. The store opens before then, and a joined node started
// without --id must not log "raft storage opened node=1".
func startLogger(log *slog.Logger, cfg Config) *slog.Logger {
	if id, ok, err := control.ReadIdentity(cfg.Data); err == nil && ok {
		return log.With("node", id.NodeID)
	}
	if cfg.Join != "" {
		return log
	}
	return log.With("node", cfg.ID)
}

// openStore opens the raft store. It gives up when ctx ends (a signal
// during start-up must not wait for a store that cannot open).
func (d *Daemon) openStore(ctx context.Context, opts Options, metrics *raftstore.Metrics) error {
	if err := os.MkdirAll(d.cfg.Data, 0o750); err != nil {
		return fmt.Errorf("daemon: data dir: %w", err)
	}
	type opened struct {
		st  *raftstore.Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		st, err := raftstore.Open(filepath.Join(d.cfg.Data, StoreDir), raftstore.StoreOptions{
			NoSync:  d.cfg.NoSync,
			Logger:  d.log,
			Metrics: metrics,
			FS:      opts.FS,
			Disk:    raftstore.DiskOptions{AlarmBytes: d.cfg.DiskAlarmBytes, BallastBytes: d.cfg.DiskBallastBytes},
			OnFatal: opts.OnStorageFailure,
		})
		done <- opened{st, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return fmt.Errorf("daemon: open store: %w", o.err)
		}
		d.store = o.st
		return nil
	case <-ctx.Done():
		go func() { // close it if it ever opens
			if o := <-done; o.err == nil {
				_ = o.st.Close()
			}
		}()
		return fmt.Errorf("daemon: open store: %w", ctx.Err())
	}
}

// membership is who this node is and whom it talks to at start.
type membership struct {
	joining bool              // a fresh join: raft learns the members from the leader
	voters  []uint64          // initial raft voters (static or bootstrap), when not joining
	peers   []Member          // the other members the peer transport dials
	addrs   map[uint64]string // every known member's peer address
}

// resolveMembership settles the node's identity (from its identity file, a
// join through the control API, or --id) and its initial members.
func (d *Daemon) resolveMembership(ctx context.Context) (membership, error) {
	if err := d.loadControlTLS(); err != nil {
		return membership{}, err
	}
	ident, err := control.ResolveIdentity(ctx, control.StartConfig{
		DataDir:        d.cfg.Data,
		Join:           d.cfg.Join != "",
		JoinURLs:       d.cfg.JoinURLs(),
		JoinCredential: d.cfg.JoinCredential,
		Replace:        d.cfg.Replace,
		Credential:     d.cfg.ControlCredential,
		PeerListen:     d.cfg.PeerListen,
		Log:            d.store,
		Logger:         d.log,
		TLS:            d.controlClientTLS,
	})
	var refused *control.Error
	if errors.As(err, &refused) && refused.Reason == control.ReasonIdentityRefused {
		return membership{}, fmt.Errorf("%w: %w", ErrRemoved, err)
	}
	if err != nil {
		return membership{}, err
	}
	if ident.NodeID != 0 {
		// A control-plane identity names the node: log under it, not
		// under the configured id.
		d.cfg.ID = ident.NodeID
		d.log = d.baseLog.With("node", ident.NodeID)
	}
	m := membership{joining: ident.Join != nil, addrs: map[uint64]string{}}
	if m.joining {
		for _, jm := range ident.Join.Members {
			if jm.NodeID != d.cfg.ID {
				m.peers = append(m.peers, Member{ID: jm.NodeID, Addr: jm.Address})
				m.addrs[jm.NodeID] = jm.Address
			}
		}
	} else {
		if m.peers, err = d.cfg.Members(); err != nil {
			return membership{}, err
		}
		for _, mb := range m.peers {
			m.voters = append(m.voters, mb.ID)
			m.addrs[mb.ID] = mb.Addr
		}
		if ident.NodeID != 0 {
			// An issued identity in a static cluster: this node replaced a
			// static member, and took its peer address. That member is
			// retired; dialing it would dial this node itself.
			m.peers = slices.DeleteFunc(m.peers, func(mb Member) bool {
				if mb.ID != d.cfg.ID && mb.Addr == d.cfg.PeerListen {
					delete(m.addrs, mb.ID)
					return true
				}
				return false
			})
		}
	}
	if d.clusterID, err = d.settleClusterID(ctx, m, ident.Join); err != nil {
		return membership{}, err
	}
	return m, nil
}

// startRaft builds the peer transport, the plugins, the lock service and
// the raft node, and starts them.
func (d *Daemon) startRaft(ctx context.Context, opts Options, m membership, raftMetrics *raftstore.Metrics) error {
	var transport raftstore.Transport
	if len(m.peers) > 1 || d.cfg.PeerListen != "" && len(d.cfg.PeerSecret) >= MinPeerSecretLen {
		if err := d.newPeers(m.peers); err != nil {
			return err
		}
		transport = d.peers
	}
	if err := d.newLockService(ctx, opts); err != nil {
		return err
	}
	var observers []raftstore.Observer
	if d.audit != nil {
		// The auditor only queues each command, so it goes first and never
		// waits behind the lock service.
		observers = append(observers, raftstore.ObserverFuncs{Applied: d.audit.Offer})
	}
	// So does the watch publisher; it starts publishing once NATS is up.
	d.watch = natsapi.NewWatchPublisher(natsapi.WatchConfig{Node: d.cfg.ID, Logger: d.log.With("component", "watch"), Registerer: d.reg})
	// The leadership kick comes after the lock service, so it is ready
	// (or not) when the client service re-checks which subjects to serve.
	kick := func() {
		if api := d.apiKick.Load(); api != nil {
			api.LeadershipChanged()
		}
	}
	observers = append(observers, d.watch.Observer(), d.locks, raftstore.ObserverFuncs{
		LeaderReady: func(uint64) { kick() }, LeadershipLost: kick})
	var err error
	d.node, err = raftstore.NewNode(raftstore.Config{
		ID:              d.cfg.ID,
		Peers:           m.voters,
		Join:            m.joining,
		Store:           d.store,
		Transport:       transport,
		Observers:       observers,
		Logger:          d.log,
		TickInterval:    time.Duration(d.cfg.TickMS) * time.Millisecond,
		ElectionTicks:   d.cfg.ElectionTicks,
		HeartbeatTicks:  d.cfg.HeartbeatTicks,
		SnapshotEntries: d.cfg.SnapshotEntries,
		CompactKeep:     d.cfg.CompactKeep,
		Metrics:         raftMetrics,
		MaxEntryVersion: maxEntryVersion(opts.MaxClusterVersion),
	})
	if err != nil {
		return fmt.Errorf("daemon: start raft node: %w", err)
	}
	d.reg.MustRegister(raftstore.NodeCollector(d.node))
	if d.peers != nil {
		d.reg.MustRegister(peer.Collector(d.peers))
		// The transport lives until Close, not as long as Start's context: a
		// caller bounding start-up with a timeout must not cut the raft links.
		if err := d.peers.Start(context.Background(), d.node); err != nil {
			return fmt.Errorf("daemon: peer transport: %w", err)
		}
	}
	d.locks.Attach(d.node)
	d.node.Start()
	return nil
}

// newLockService loads the plugins and builds the lock service with them
// as its Grant policy (unless opts overrides it) and their audit publisher.
func (d *Daemon) newLockService(ctx context.Context, opts Options) error {
	lcfg := lockservice.Config{
		Logger:       d.log.With("component", "lockservice"),
		Metrics:      lockservice.NewMetrics(d.reg),
		Policy:       opts.Policy,
		Now:          opts.Now,
		StorageAlarm: d.store.Disk().Err,
		ClusterID:    d.clusterID,
		Limits: lockservice.Limits{
			MaxLocks:            d.cfg.MaxLocks,
			MaxLocksPerIdentity: d.cfg.MaxLocksPerIdentity,
			MaxWaitersPerKey:    d.cfg.MaxWaitersPerKey,
			MaxWaiters:          d.cfg.MaxWaiters,
			// Fair shares (issue 21).
			MaxWaitersPerIdentity:  d.cfg.MaxWaitersPerIdentity,
			MaxInflightPerIdentity: d.cfg.MaxInflightPerIdentity,
			// Sessions (issue 24).
			MaxSessions:            d.cfg.MaxSessions,
			MaxSessionsPerIdentity: d.cfg.MaxSessionsPerIdentity,
		},
	}
	var err error
	if d.cfg.ACL != "" {
		if lcfg.ACL, err = lockservice.LoadACL(d.cfg.ACL); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	if d.plugins, err = loadPlugins(ctx, d.cfg, d.log.With("component", "plugins")); err != nil {
		return err
	}
	if d.plugins != nil {
		if lcfg.Policy == nil {
			lcfg.Policy = d.plugins
		}
		key, err := d.auditIDKey()
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		if d.audit, err = audit.NewPublisher(audit.Config{Auditor: d.plugins, Node: d.cfg.ID, IDKey: key,
			Logger: d.log.With("component", "audit"), Registerer: d.reg}); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	// The lock subjects are served once the timers are re-armed, which
	// for a large table ends after the raft loop's leader-ready event.
	lcfg.OnReady = func() {
		if api := d.apiKick.Load(); api != nil {
			api.LeadershipChanged()
		}
	}
	d.locks = lockservice.New(lcfg)
	return nil
}

func (d *Daemon) controlConfig(addrs map[uint64]string) control.Config {
	ccfg := control.Config{
		ID:                  d.cfg.ID,
		Node:                d.node,
		Leadership:          d.locks,
		Addresses:           addrs,
		ClusterID:           d.clusterID,
		Listen:              d.cfg.ControlListen,
		TLS:                 d.controlServerTLS,
		Credential:          d.cfg.ControlCredential,
		BootstrapCredential: d.cfg.BootstrapCredential,
		DataDir:             d.cfg.Data,
		PeerListen:          d.cfg.PeerListen,
		PeerAddr:            d.PeerAddr(),
		Logger:              d.log.With("component", "control"),
	}
	if d.peers != nil {
		ccfg.Peers = d.peers
	}
	return ccfg
}

// startClientService connects to NATS (starting the embedded server),
// prepares the audit stream and publisher, and serves the client API.
func (d *Daemon) startClientService(ctx context.Context, opts Options) error {
	if d.nc == nil { // started already to ask the cluster (clusterid.go)
		if err := d.startNATS(); err != nil {
			return err
		}
	}
	trust, err := d.identityTrust()
	if err != nil {
		return err
	}
	d.coverWaitsInImports()
	if d.cfg.AuditStream != "" {
		sctx, cancel := context.WithTimeout(ctx, StartTimeoutDefault)
		err := audit.EnsureStream(sctx, d.nc, d.cfg.AuditStream, d.cfg.AuditMaxBytes)
		cancel()
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	if d.audit != nil {
		d.audit.Start(d.nc)
	}
	d.watch.Start(d.nc, d.watchInterest())
	d.api, err = natsapi.Start(natsapi.Config{
		Conn: d.nc, Locks: d.locks, Node: d.node, MemberAddr: d.ctl.Address, ClusterID: d.clusterID, Plugins: d.plugins, Disk: d.store.Disk(),
		Logger: d.log.With("component", "natsapi"), Now: opts.Now, Identity: trust,
		MaxInflight: d.cfg.MaxInflight, ReplyInterest: d.replyInterest(opts), Partition: d.cfg.Partition(),
		MaxClusterVersion: opts.MaxClusterVersion,
	})
	if err != nil {
		return fmt.Errorf("daemon: start client service: %w", err)
	}
	d.apiKick.Store(d.api)
	d.startPlacement()
	return nil
}

// newPeers creates the peer transport, which listens at once; it starts
// accepting, bound to the raft node, once the node exists (the node needs
// the transport to be created).
func (d *Daemon) newPeers(members []Member) error {
	peers := make(map[uint64]string, len(members))
	for _, m := range members {
		if m.ID != d.cfg.ID {
			peers[m.ID] = m.Addr
		}
	}
	var tlsCfg *tls.Config
	if d.cfg.PeerTLSCert != "" {
		var err error
		if tlsCfg, err = loadPeerTLS(d.cfg); err != nil {
			return err
		}
	} else if !control.IsLoopback(d.cfg.PeerListen) {
		d.log.Warn("the peer port is not loopback and has no TLS: raft traffic (keys, owners, tokens, and the fence signing keys, with which anyone on the path can forge fences) crosses the network in clear; use --peer-tls-cert, --peer-tls-key and --peer-tls-ca",
			"peer_listen", d.cfg.PeerListen)
	}
	t, err := peer.New(peer.Config{
		ID:        d.cfg.ID,
		Listen:    d.cfg.PeerListen,
		Peers:     peers,
		Secret:    []byte(d.cfg.PeerSecret),
		ClusterID: d.clusterID,
		TLS:       tlsCfg,
		Logger:    d.log.With("component", "peer"),
	})
	if err != nil {
		return fmt.Errorf("daemon: peer transport: %w", err)
	}
	d.peers = t
	return nil
}

// The raft node is what the peer transport delivers to.
var _ peer.Raft = (*raftstore.Node)(nil)

// The snapshot of the largest table a node can hold, plus the raft
// message around it (a few hundred bytes of metadata and conf state; 1 MiB
// allowed), must fit what the peer transport streams: a negative constant
// here does not compile.
const _ = uint64(peer.MaxSnapshotSize - core.MaxSnapshotSize - 1<<20)

// Ready reports nil when the node can serve clients: its loop runs, it
// knows a leader, and NATS is connected.
func (d *Daemon) Ready() error {
	switch {
	case d.node.Err() != nil:
		return fmt.Errorf("raft loop stopped: %w", d.node.Err())
	case d.node.Leader() == 0:
		return errors.New("no leader known")
	case d.node.IsLeader() && !d.node.LeaderReady():
		return errors.New("leader still applying earlier terms")
	case d.node.IsLeader() && !d.api.Serving():
		return errors.New("leader not yet serving the lock subjects")
	case !d.nc.IsConnected():
		return errors.New("NATS not connected")
	}
	return nil
}

// ClientURL is the NATS URL clients use to reach this node.
func (d *Daemon) ClientURL() string {
	if d.ns != nil {
		return d.ns.ClientURL()
	}
	return d.cfg.NATSURL
}

// ControlAddr is the bound control listener address ("" if none).
func (d *Daemon) ControlAddr() string {
	if d.ctl == nil {
		return ""
	}
	return d.ctl.Addr()
}

// PeerAddr is the bound peer listener address ("" for a single node).
func (d *Daemon) PeerAddr() string {
	if d.peers == nil {
		return ""
	}
	return d.peers.Addr().String()
}

// ClusterID is the ID of the cluster this node belongs to (0: one
// created before cluster IDs).
func (d *Daemon) ClusterID() uint64 { return d.clusterID }

// Node, Store, Locks, API, Peers and Registry expose the parts for tests and
// tools.
func (d *Daemon) Node() *raftstore.Node          { return d.node }
func (d *Daemon) Store() *raftstore.Store        { return d.store }
func (d *Daemon) Locks() *lockservice.Service    { return d.locks }
func (d *Daemon) API() *natsapi.Service          { return d.api }
func (d *Daemon) Peers() *peer.Transport         { return d.peers }
func (d *Daemon) Registry() *prometheus.Registry { return d.reg }

// Done is closed when the node cannot go on: its raft loop stopped on a
// fatal error, or it was removed from the cluster (Err says which).
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Err is why Done is closed: an error wrapping ErrRemoved, or the raft
// loop's fatal error (nil while the node runs).
func (d *Daemon) Err() error {
	if err := d.removedErr(); err != nil {
		return err
	}
	return d.node.Err()
}

// Shutdown is the planned stop: a leader first hands leadership to an
// active voter (raftstore.Node.HandOver), for at most as long as ctx
// allows, so that the cluster does not wait an election timeout for a new
// leader and the requests this leader took are answered, not left
// indeterminate; then Close.
func (d *Daemon) Shutdown(ctx context.Context) {
	if d.placementStop != nil {
		d.placementStop() // no placement move during the hand-over
	}
	if d.node != nil {
		if err := d.node.HandOver(ctx); err != nil {
			d.log.Warn("stopping without handing leadership over", "err", err)
		}
	}
	d.Close()
}

// HandOverTimeout bounds Shutdown's hand-over for cfg: two election
// timeouts, after which raft has abandoned the transfer anyway.
func HandOverTimeout(cfg Config) time.Duration {
	return 2 * time.Duration(cfg.TickMS*cfg.ElectionTicks) * time.Millisecond
}

// Close stops everything in reverse start order. It is safe to call more
// than once and on a partly started daemon.
func (d *Daemon) Close() {
	d.closeOnce.Do(func() {
		close(d.removal.stop)
		if d.watching {
			<-d.removal.exited
		}
		if d.gcStop != nil {
			d.gcStop()
		}
		if d.placementStop != nil {
			d.placementStop()
		}
		if d.ctl != nil {
			d.ctl.Close()
		}
		if d.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = d.http.Shutdown(ctx)
			cancel()
		}
		if d.api != nil {
			if err := d.api.Stop(); err != nil {
				d.log.Warn("stop client service", "err", err)
			}
		}
		if d.locks != nil {
			d.locks.Close()
		}
		if d.node != nil {
			d.node.Stop()
		}
		if d.peers != nil {
			_ = d.peers.Close()
		}
		if d.audit != nil {
			d.audit.Close()
		}
		if d.watch != nil {
			d.watch.Stop()
		}
		if d.plugins != nil {
			_ = d.plugins.Close(context.Background())
		}
		if d.nc != nil {
			d.nc.Close()
		}
		if d.ns != nil {
			d.ns.Shutdown()
			d.ns.WaitForShutdown()
		}
		if d.store != nil {
			if err := d.store.Close(); err != nil {
				d.log.Warn("close store", "err", err)
			}
		}
		d.log.Info("node stopped")
	})
}
