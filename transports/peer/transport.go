package peer

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/internal/connlimit"
	"github.com/ticketd/ticketd/internal/loglimit"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Defaults for the zero values of Config. Tests shorten them through the
// Config fields.
const (
	QueueSizeDefault        = 4096
	DialTimeoutDefault      = 2 * time.Second
	WriteTimeoutDefault     = 5 * time.Second
	HandshakeTimeoutDefault = 5 * time.Second
	HelloTimeoutDefault     = 2 * time.Second
	SnapshotTimeoutDefault  = 30 * time.Second
	BackoffMinDefault       = 50 * time.Millisecond
	BackoffMaxDefault       = 2 * time.Second
)

// Fixed limits.
const (
	// MinSecretSize is the shortest cluster secret New accepts.
	MinSecretSize = 16
	// MaxPendingHandshakes bounds the inbound connections not yet
	// authenticated from addresses that are not a member's (admission.go);
	// a new one beyond it evicts the oldest of them.
	MaxPendingHandshakes = 64
	// MaxPendingHandshakesPerSource bounds those from one source address,
	// members' included; a new one beyond it evicts the oldest from that
	// address. A member has at most a message and a snapshot connection
	// in handshake at once; several members may share an address (one
	// machine).
	MaxPendingHandshakesPerSource = 8
	// snapQueueSize bounds the MsgSnap messages waiting per peer. Raft sends
	// one snapshot at a time to a follower, so a few is plenty.
	snapQueueSize = 4
	// Batching of the message writer: one Write carries at most this much.
	maxBatchBytes = 256 << 10
	maxBatchMsgs  = 512
	// tlsExporterLabel derives the TLS channel binding mixed into the
	// handshake transcript.
	tlsExporterLabel = "EXPORTER-ticketd-peer-v1"
)

// Errors of configuration and lifecycle.
var (
	ErrInvalidConfig    = errors.New("peer: invalid config")
	ErrClosed           = errors.New("peer: transport closed")
	ErrStarted          = errors.New("peer: transport already started")
	ErrSnapshotRejected = errors.New("peer: snapshot rejected by receiver")

	errEncode = errors.New("peer: cannot encode message")
)

// Raft is what the transport delivers to: the local raft node. Its methods
// are called from the transport's goroutines, never from Send.
type Raft interface {
	// Step receives every authenticated, well-addressed message. It is
	// called from one goroutine per inbound connection (so concurrently for
	// different peers), may block briefly, and must return when ctx is
	// done. An error is logged; for a MsgSnap it fails the snapshot.
	Step(ctx context.Context, m raftpb.Message) error
	// ReportUnreachable and ReportSnapshot are told about unreachable peers
	// and snapshot results. They must not block for long: Close waits for
	// them.
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// raft.Node is the Raft the transport is made for.
var _ Raft = raft.Node(nil)

// Config configures a Transport. Zero durations and sizes take the
// ...Default constants.
type Config struct {
	// ID is this node's raft id (non-zero).
	ID uint64
	// Listen is the TCP address to listen on for peers; "127.0.0.1:0" picks
	// a free port (see Transport.Addr).
	Listen string
	// Peers maps the other members' ids to their peer addresses. An entry
	// for ID itself is ignored. Only members may connect to us.
	Peers map[uint64]string
	// Secret is the cluster secret, at least MinSecretSize bytes. It never
	// crosses the wire.
	Secret []byte
	// ClusterID, when not 0, binds the handshake to one cluster: nodes
	// with the same secret but another cluster ID fail it (its proofs and
	// keys derive from clusterKey(Secret, ClusterID)). 0 is the handshake
	// of nodes older than cluster IDs, so a cluster they created keeps
	// talking to itself across an upgrade.
	ClusterID uint64
	// TLS, when set, wraps every peer connection in mutual TLS. It is used
	// as both the server and the client config: it needs a certificate,
	// ClientAuth must be tls.RequireAndVerifyClientCert, and RootCAs and
	// ClientCAs should name the cluster CA. An empty ServerName is set to
	// the host of the address dialled. MinVersion is raised to TLS 1.3. The
	// HMAC handshake still runs inside TLS.
	TLS *tls.Config
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// QueueSize bounds each peer's outbound queue (messages).
	QueueSize int
	// DialTimeout bounds a TCP connect; WriteTimeout bounds each write.
	DialTimeout, WriteTimeout time.Duration
	// HandshakeTimeout bounds the TLS and HMAC handshakes of a connection.
	// HelloTimeout bounds, on the listener, the time from accept to the
	// dialer's hello (TLS handshake included), so that connections that
	// say nothing give their slot back early.
	HandshakeTimeout, HelloTimeout time.Duration
	// SnapshotTimeout bounds the gap between two frames of an inbound stream
	// and the sender's wait for a snapshot's acknowledgement.
	SnapshotTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff (doubling, with
	// jitter).
	BackoffMin, BackoffMax time.Duration
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// withDefaults validates c and returns a private copy with defaults filled in.
func (c Config) withDefaults() (Config, error) {
	if c.ID == 0 {
		return c, invalid("ID must be non-zero")
	}
	if c.Listen == "" {
		return c, invalid("Listen address is empty")
	}
	if len(c.Secret) < MinSecretSize {
		return c, invalid("Secret is %d bytes, need at least %d", len(c.Secret), MinSecretSize)
	}
	if c.QueueSize < 0 {
		return c, invalid("QueueSize %d is negative", c.QueueSize)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"DialTimeout", &c.DialTimeout, DialTimeoutDefault},
		{"WriteTimeout", &c.WriteTimeout, WriteTimeoutDefault},
		{"HandshakeTimeout", &c.HandshakeTimeout, HandshakeTimeoutDefault},
		{"HelloTimeout", &c.HelloTimeout, HelloTimeoutDefault},
		{"SnapshotTimeout", &c.SnapshotTimeout, SnapshotTimeoutDefault},
		{"BackoffMin", &c.BackoffMin, BackoffMinDefault},
		{"BackoffMax", &c.BackoffMax, BackoffMaxDefault},
	} {
		if *d.v < 0 {
			return c, invalid("%s %v is negative", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.BackoffMin > c.BackoffMax {
		return c, invalid("BackoffMin %v exceeds BackoffMax %v", c.BackoffMin, c.BackoffMax)
	}
	if c.QueueSize == 0 {
		c.QueueSize = QueueSizeDefault
	}
	peers := make(map[uint64]string, len(c.Peers))
	for id, addr := range c.Peers {
		if id == c.ID {
			continue
		}
		if id == 0 {
			return c, invalid("peer id 0")
		}
		if addr == "" {
			return c, invalid("peer %d has no address", id)
		}
		peers[id] = addr
	}
	c.Peers = peers
	if c.TLS != nil {
		if c.TLS.ClientAuth != tls.RequireAndVerifyClientCert {
			return c, invalid("TLS.ClientAuth must be tls.RequireAndVerifyClientCert")
		}
		if len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
			return c, invalid("TLS has no certificate")
		}
		c.TLS = c.TLS.Clone()
		if c.TLS.MinVersion < tls.VersionTLS13 {
			c.TLS.MinVersion = tls.VersionTLS13
		}
	}
	c.Secret = append([]byte(nil), c.Secret...)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// PeerStats are the counters of one peer.
type PeerStats struct {
	Addr string
	// Connected: the outbound message connection is authenticated and up.
	Connected bool
	// Sent counts messages written to the peer; Dropped those given up
	// (queue full, not connected, write failed, not encodable); Filtered
	// those the filter dropped, in either direction; Received those
	// delivered to Raft.Step without error.
	Sent, Dropped, Filtered, Received uint64
	// SnapshotsSent and SnapshotsFailed count MsgSnap outcomes reported.
	SnapshotsSent, SnapshotsFailed uint64
}

// Stats is a snapshot of the transport's counters.
type Stats struct {
	Peers map[uint64]PeerStats
	// HandshakeFailures counts inbound connections refused before or during
	// authentication.
	HandshakeFailures uint64
	// Rejected counts inbound messages refused after authentication (forged
	// From, wrong To, local-only type) and the connections closed for them.
	Rejected uint64
	// Unroutable counts outbound messages for unknown peers or from a From
	// other than our ID.
	Unroutable uint64
}

// peer is one member the transport sends to: its queues, the context of
// its goroutines, its counters, and the source addresses its inbound
// connections are expected from (admission.go).
type peer struct {
	id    uint64
	addr  string
	queue chan raftpb.Message
	snaps chan raftpb.Message
	// wake cuts a reconnect backoff short (wakePeer, outbound.go).
	wake chan struct{}

	// Under Transport.mu: hostIP is addr's host when it is an IP; resolved
	// the addresses its host name resolves to; learned the addresses the
	// member authenticated from, newest last. At most maxMemberSources
	// each.
	hostIP            string
	resolved, learned []string

	// Set under Transport.mu when the peer's goroutines start.
	ctx    context.Context
	cancel context.CancelFunc

	connected                         atomic.Bool
	sent, dropped, filtered, received atomic.Uint64
	snapsSent, snapsFailed            atomic.Uint64
}

// inboundLogBurst is how many log lines about inbound connections get
// through per second.
const inboundLogBurst = 10

// unknownPeerLogEvery is how often a handshake refused because the dialer
// is not a member gets into the log: a join does that until its admission
// applies here.
const unknownPeerLogEvery = time.Minute

// Transport carries raft messages between the members of one cluster. See
// the package documentation.
type Transport struct {
	cfg       Config
	log       *slog.Logger
	tlsServer *tls.Config
	filter    atomic.Pointer[func(from, to uint64) bool]

	// pending holds the inbound connections not yet authenticated, per
	// source address; members' addresses are reserved (admission.go).
	pending *connlimit.Table
	// resolveNow wakes the resolve loop when a peer is added.
	resolveNow chan struct{}
	// secret is the key the handshake proves: Secret bound to ClusterID.
	secret []byte

	handshakeFailures, rejected, unroutable atomic.Uint64
	// inboundLogs rate-limits the logs anyone on the network can trigger
	// (inboundLogBurst lines a second).
	inboundLogs loglimit.Limiter
	// unknownPeerLogs limits the lines about handshakes from ids that are
	// not members (yet): one a minute (unknownPeerLogEvery).
	unknownPeerLogs loglimit.Limiter

	// mu guards the peer table, the inbound sessions and the lifecycle
	// fields up to closed.
	mu      sync.RWMutex
	peers   map[uint64]*peer
	inbound map[inKey]*session // the current inbound session per peer and kind
	ln      net.Listener
	cancel  context.CancelFunc
	started bool
	closed  bool
	// ctx and raft are set by Start under mu before it starts any goroutine,
	// and never change after; the goroutines read them without mu.
	ctx  context.Context
	raft Raft

	wg sync.WaitGroup // every goroutine of the transport; Close waits for it
}

// New validates cfg and listens on Config.Listen. Peers that connect
// before Start wait in the listen backlog (their handshake completes once
// Start accepts), so a restarting node is reachable as soon as its raft
// node exists, without peers backing off.
func New(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("peer: listen on %s: %w", cfg.Listen, err)
	}
	t := &Transport{
		ln:         ln,
		cfg:        cfg,
		log:        cfg.Logger.With("local", cfg.ID),
		tlsServer:  cfg.TLS,
		pending:    connlimit.New(connlimit.Limits{Total: MaxPendingHandshakes, PerSource: MaxPendingHandshakesPerSource}),
		resolveNow: make(chan struct{}, 1),
		secret:     clusterKey(cfg.Secret, cfg.ClusterID),
		peers:      make(map[uint64]*peer, len(cfg.Peers)),
		inbound:    make(map[inKey]*session),
	}
	for id, addr := range cfg.Peers {
		t.peers[id] = t.newPeer(id, addr)
	}
	t.inboundLogs.Burst = inboundLogBurst
	t.unknownPeerLogs = loglimit.Limiter{Burst: 1, Per: unknownPeerLogEvery}
	return t, nil
}

func (t *Transport) newPeer(id uint64, addr string) *peer {
	return &peer{
		id:     id,
		addr:   addr,
		queue:  make(chan raftpb.Message, t.cfg.QueueSize),
		snaps:  make(chan raftpb.Message, snapQueueSize),
		wake:   make(chan struct{}, 1),
		hostIP: hostIP(addr),
	}
}

// Start binds r, the raft node that inbound messages are delivered to and
// failures reported to, then starts the accept loop and one writer per
// peer. Nothing is accepted before Start, so nothing arrives before r is
// bound. ctx bounds the transport's life: cancelling it
// stops everything as Close does (call Close anyway to wait), and the ctx
// given to r.Step derives from it.
func (t *Transport) Start(ctx context.Context, r Raft) error {
	if r == nil {
		return invalid("Raft is nil")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrClosed
	case t.started:
		return ErrStarted
	}
	ln := t.ln
	t.ctx, t.cancel = context.WithCancel(ctx)
	t.raft = r
	t.started = true
	context.AfterFunc(t.ctx, func() { _ = ln.Close() })
	t.log.Info("peer: listening", "addr", ln.Addr().String(), "tls", t.tlsServer != nil)
	t.wg.Add(2)
	go t.acceptLoop(ln)
	go t.resolveLoop()
	for _, p := range t.peers {
		t.startPeerLocked(p)
	}
	return nil
}

// Addr is the listening address.
func (t *Transport) Addr() net.Addr {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.ln == nil {
		return nil
	}
	return t.ln.Addr()
}

// Close stops the listener, every connection and goroutine, and waits for
// them. It is idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	already := t.closed
	t.closed = true
	cancel, started := t.cancel, t.started
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if !started {
		_ = t.ln.Close() // a started transport closes it when its ctx ends
	}
	t.wg.Wait()
	if !already {
		t.log.Info("peer: closed")
	}
	return nil
}

// SetFilter installs a fault-injection filter: a message from -> to is
// dropped when f returns false. It applies to outbound messages in Send and
// to inbound messages before Raft.Step; nil removes it. f must be fast and
// must not call back into the Transport.
func (t *Transport) SetFilter(f func(from, to uint64) bool) {
	if f == nil {
		t.filter.Store(nil)
		return
	}
	t.filter.Store(&f)
}

func (t *Transport) allowed(from, to uint64) bool {
	f := t.filter.Load()
	return f == nil || (*f)(from, to)
}

// AddPeer adds a member or changes its address (which restarts its
// connection and resets its counters). Invalid ids, our own id and empty
// addresses are logged and ignored.
func (t *Transport) AddPeer(id uint64, addr string) {
	if id == 0 || id == t.cfg.ID || addr == "" {
		t.log.Warn("peer: AddPeer ignored", "peer", id, "addr", addr)
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	old := t.peers[id]
	if old != nil && old.addr == addr {
		t.mu.Unlock()
		return
	}
	var oldCancel context.CancelFunc
	if old != nil {
		oldCancel = old.cancel
	}
	p := t.newPeer(id, addr)
	t.peers[id] = p
	if t.started {
		t.startPeerLocked(p)
	}
	t.mu.Unlock()
	if oldCancel != nil {
		oldCancel()
	}
	t.resolveSoon()
	t.log.Info("peer: added", "peer", id, "addr", addr)
}

// RemovePeer forgets a member: its outbound goroutines stop, its inbound
// connections are closed and it can no longer authenticate.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	p := t.peers[id]
	if p == nil {
		t.mu.Unlock()
		return
	}
	delete(t.peers, id)
	var conns []*session
	for _, k := range []connKind{kindMsg, kindSnap} {
		if s := t.inbound[inKey{id, k}]; s != nil {
			conns = append(conns, s)
			delete(t.inbound, inKey{id, k})
		}
	}
	cancel := p.cancel
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	for _, s := range conns {
		s.close()
	}
	t.log.Info("peer: removed", "peer", id)
}

// Stats returns the current counters.
func (t *Transport) Stats() Stats {
	t.mu.RLock()
	peers := maps.Clone(t.peers)
	t.mu.RUnlock()
	st := Stats{
		Peers:             make(map[uint64]PeerStats, len(peers)),
		HandshakeFailures: t.handshakeFailures.Load(),
		Rejected:          t.rejected.Load(),
		Unroutable:        t.unroutable.Load(),
	}
	for id, p := range peers {
		st.Peers[id] = PeerStats{
			Addr:            p.addr,
			Connected:       p.connected.Load(),
			Sent:            p.sent.Load(),
			Dropped:         p.dropped.Load(),
			Filtered:        p.filtered.Load(),
			Received:        p.received.Load(),
			SnapshotsSent:   p.snapsSent.Load(),
			SnapshotsFailed: p.snapsFailed.Load(),
		}
	}
	return st
}

// reportUnreachable is called only from goroutines Start started, after
// it bound t.raft.
func (t *Transport) reportUnreachable(id uint64) { t.raft.ReportUnreachable(id) }

func (t *Transport) isMember(id uint64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.peers[id]
	return ok && id != t.cfg.ID
}

func (t *Transport) lookup(id uint64) *peer {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.peers[id]
}

// labelCluster separates the cluster-bound key from every other use of the
// secret.
const labelCluster = "ticketd/peer/v1 cluster"

// clusterKey is the key the handshake uses: the secret itself for cluster
// ID 0, else HMAC(secret, label | id), so that two clusters sharing a
// secret still cannot talk.
func clusterKey(secret []byte, clusterID uint64) []byte {
	if clusterID == 0 {
		return append([]byte(nil), secret...)
	}
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(labelCluster))
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], clusterID)
	h.Write(id[:])
	return h.Sum(nil)
}
