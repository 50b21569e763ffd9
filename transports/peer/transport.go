package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

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
	SnapshotTimeoutDefault  = 30 * time.Second
	BackoffMinDefault       = 50 * time.Millisecond
	BackoffMaxDefault       = 2 * time.Second
)

// Fixed limits.
const (
	// MinSecretSize is the shortest cluster secret New accepts.
	MinSecretSize = 16
	// MaxPendingHandshakes bounds the inbound connections that have not yet
	// authenticated; beyond it new connections are closed at once.
	MaxPendingHandshakes = 64
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

// Reporter receives delivery failures, as raft.Node's methods of the same
// names expect. Its methods are called from the transport's goroutines,
// never from Send, and must not block for long: Close waits for them.
type Reporter interface {
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// raft.Node is the Reporter the transport is made for.
var _ Reporter = raft.Node(nil)

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
	// TLS, when set, wraps every peer connection in mutual TLS. It is used
	// as both the server and the client config: it needs a certificate,
	// ClientAuth must be tls.RequireAndVerifyClientCert, and RootCAs and
	// ClientCAs should name the cluster CA. An empty ServerName is set to
	// the host of the address dialled. MinVersion is raised to TLS 1.3. The
	// HMAC handshake still runs inside TLS.
	TLS *tls.Config
	// Handler receives every authenticated, well-addressed message. It is
	// called from one goroutine per inbound connection (so concurrently for
	// different peers), may block briefly, and must return when ctx is done.
	// An error is logged; for a MsgSnap it fails the snapshot.
	Handler func(ctx context.Context, m raftpb.Message) error
	// Reporter, if set, is told about unreachable peers and snapshot results.
	Reporter Reporter
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// QueueSize bounds each peer's outbound queue (messages).
	QueueSize int
	// DialTimeout bounds a TCP connect; WriteTimeout bounds each write.
	DialTimeout, WriteTimeout time.Duration
	// HandshakeTimeout bounds the TLS and HMAC handshakes of a connection.
	HandshakeTimeout time.Duration
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
	if c.Handler == nil {
		return c, invalid("Handler is nil")
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
	// delivered to the Handler.
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

type peer struct {
	id    uint64
	addr  string
	queue chan raftpb.Message
	snaps chan raftpb.Message

	// Set under Transport.mu when the peer's goroutines start.
	ctx    context.Context
	cancel context.CancelFunc

	connected                         atomic.Bool
	sent, dropped, filtered, received atomic.Uint64
	snapsSent, snapsFailed            atomic.Uint64
}

type inKey struct {
	peer uint64
	kind connKind
}

// Transport carries raft messages between the members of one cluster. See
// the package documentation.
type Transport struct {
	cfg       Config
	log       *slog.Logger
	tlsServer *tls.Config
	filter    atomic.Pointer[func(from, to uint64) bool]

	handshakes chan struct{} // semaphore of pending inbound handshakes

	handshakeFailures, rejected, unroutable atomic.Uint64
	// inboundLogs rate-limits the logs anyone on the network can trigger.
	inboundLogs logLimiter

	mu      sync.RWMutex
	peers   map[uint64]*peer
	inbound map[inKey]*session
	ln      net.Listener
	ctx     context.Context
	cancel  context.CancelFunc
	started bool
	closed  bool

	wg sync.WaitGroup
}

// New validates cfg and returns a Transport that is not yet listening.
func New(cfg Config) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Transport{
		cfg:        cfg,
		log:        cfg.Logger.With("local", cfg.ID),
		tlsServer:  cfg.TLS,
		handshakes: make(chan struct{}, MaxPendingHandshakes),
		peers:      make(map[uint64]*peer, len(cfg.Peers)),
		inbound:    make(map[inKey]*session),
	}
	for id, addr := range cfg.Peers {
		t.peers[id] = t.newPeer(id, addr)
	}
	return t, nil
}

func (t *Transport) newPeer(id uint64, addr string) *peer {
	return &peer{
		id:    id,
		addr:  addr,
		queue: make(chan raftpb.Message, t.cfg.QueueSize),
		snaps: make(chan raftpb.Message, snapQueueSize),
	}
}

// Start listens on Config.Listen and starts the accept loop and one writer
// per peer. ctx bounds the transport's life: cancelling it stops everything
// as Close does (call Close anyway to wait), and the Handler's ctx derives
// from it.
func (t *Transport) Start(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrClosed
	case t.started:
		return ErrStarted
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("peer: listen on %s: %w", t.cfg.Listen, err)
	}
	t.ctx, t.cancel = context.WithCancel(ctx)
	t.ln, t.started = ln, true
	context.AfterFunc(t.ctx, func() { _ = ln.Close() })
	t.log.Info("peer: listening", "addr", ln.Addr().String(), "tls", t.tlsServer != nil)
	t.wg.Add(1)
	go t.acceptLoop(ln)
	for _, p := range t.peers {
		t.startPeerLocked(p)
	}
	return nil
}

// Addr is the listening address, or nil before Start.
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
	cancel := t.cancel
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	t.wg.Wait()
	if !already {
		t.log.Info("peer: closed")
	}
	return nil
}

// SetFilter installs a fault-injection filter: a message from -> to is
// dropped when f returns false. It applies to outbound messages in Send and
// to inbound messages before the Handler; nil removes it. f must be fast and
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

// Send queues messages for their peers and returns at once: a message
// whose peer queue is full is dropped and counted (raft retransmits). MsgSnap
// goes to a separate per-peer queue and its own connection; a MsgSnap that
// cannot be queued is reported as raft.SnapshotFailure. Messages for
// unknown peers, for local raft targets, or with a From other than our ID
// are dropped.
func (t *Transport) Send(msgs []raftpb.Message) {
	for i := range msgs {
		m := &msgs[i]
		if m.To == t.cfg.ID || raft.IsLocalMsgTarget(m.To) {
			continue
		}
		t.mu.RLock()
		p, closed := t.peers[m.To], t.closed
		t.mu.RUnlock()
		if closed {
			return
		}
		if p == nil || m.From != t.cfg.ID {
			t.unroutable.Add(1)
			t.log.Debug("peer: unroutable message dropped", "type", m.Type, "from", m.From, "to", m.To)
			continue
		}
		snap := m.Type == raftpb.MsgSnap
		if !t.allowed(t.cfg.ID, m.To) {
			p.filtered.Add(1)
			if snap {
				t.failSnapshotAsync(p)
			}
			continue
		}
		q := p.queue
		if snap {
			q = p.snaps
		}
		select {
		case q <- *m:
		default:
			p.dropped.Add(1)
			if snap {
				t.failSnapshotAsync(p)
			}
		}
	}
}

// failSnapshotAsync reports a snapshot failure off the caller's goroutine:
// Send is called from the raft loop, which the Reporter may feed back into.
func (t *Transport) failSnapshotAsync(p *peer) {
	p.snapsFailed.Add(1)
	if t.cfg.Reporter == nil {
		return
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.cfg.Reporter.ReportSnapshot(p.id, raft.SnapshotFailure)
	}()
}

func (t *Transport) reportUnreachable(id uint64) {
	if t.cfg.Reporter != nil {
		t.cfg.Reporter.ReportUnreachable(id)
	}
}

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

// ---- outbound ----

func (t *Transport) startPeerLocked(p *peer) {
	p.ctx, p.cancel = context.WithCancel(t.ctx)
	t.wg.Add(2)
	go t.runPeer(p)
	go t.runSnapshots(p)
}

type backoff struct{ lo, hi, cur time.Duration }

// next doubles the delay up to hi and returns it with "equal jitter": a
// random value in [cur/2, cur].
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.lo
	} else {
		b.cur = min(2*b.cur, b.hi)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

// runPeer keeps one authenticated message connection to p and drains its
// queue into it, reconnecting with backoff.
func (t *Transport) runPeer(p *peer) {
	defer t.wg.Done()
	log := t.log.With("peer", p.id, "addr", p.addr)
	bo := backoff{lo: t.cfg.BackoffMin, hi: t.cfg.BackoffMax}
	failing := false
	for p.ctx.Err() == nil {
		s, err := t.dial(p, kindMsg)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("peer: connect failed", "err", err)
			} else {
				log.Debug("peer: connect failed", "err", err)
			}
			failing = true
			t.reportUnreachable(p.id)
			if !t.pause(p, bo.next()) {
				return
			}
			continue
		}
		failing = false
		bo.cur = 0
		p.connected.Store(true)
		log.Info("peer: connected")
		err = t.writeLoop(p, s)
		p.connected.Store(false)
		if p.ctx.Err() != nil {
			return
		}
		log.Warn("peer: connection lost", "err", err)
		t.reportUnreachable(p.id)
		if !t.pause(p, bo.next()) {
			return
		}
	}
}

// pause waits d, dropping what is queued meanwhile: raft retransmits, and a
// queue full of stale messages would only delay fresh ones after a
// reconnect. It returns false if the peer is stopping.
func (t *Transport) pause(p *peer, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-p.queue:
			p.dropped.Add(1)
		}
	}
}

// writeLoop writes queued messages in batches until the connection fails
// or the peer stops. The listener never writes on a message connection
// after its accept, so a watcher read returning means it has closed.
func (t *Transport) writeLoop(p *peer, s *session) error {
	watch := make(chan struct{})
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer close(watch)
		var b [1]byte
		_, _ = s.conn.Read(b[:])
	}()
	defer func() {
		s.close()
		<-watch
	}()
	var (
		buf     []byte
		pending uint64
	)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := s.write(buf, t.cfg.WriteTimeout)
		if err != nil {
			p.dropped.Add(pending)
		} else {
			p.sent.Add(pending)
		}
		if cap(buf) > 2*maxBatchBytes {
			buf = nil
		}
		buf, pending = buf[:0], 0
		return err
	}
	for {
		var m raftpb.Message
		select {
		case <-p.ctx.Done():
			return p.ctx.Err()
		case <-watch:
			return fmt.Errorf("peer: connection to %d closed by remote", p.id)
		case m = <-p.queue:
		}
		for {
			if size := m.Size(); size <= MaxFrameSize {
				var err error
				if buf, err = s.appendMsg(buf, &m, size); err != nil {
					p.dropped.Add(1)
					t.log.Error("peer: message dropped", "peer", p.id, "type", m.Type, "err", err)
				} else {
					pending++
				}
			} else {
				if err := flush(); err != nil {
					return err
				}
				if err := s.writeMessage(&m, t.cfg.WriteTimeout); err != nil {
					p.dropped.Add(1)
					if !errors.Is(err, errEncode) {
						return err
					}
					t.log.Error("peer: message dropped", "peer", p.id, "type", m.Type, "err", err)
				} else {
					p.sent.Add(1)
				}
			}
			if len(buf) >= maxBatchBytes || pending >= maxBatchMsgs {
				break
			}
			var more bool
			select {
			case m = <-p.queue:
				more = true
			default:
			}
			if !more {
				break
			}
		}
		if err := flush(); err != nil {
			return err
		}
	}
}

// runSnapshots sends p's MsgSnap messages one at a time, each on its own
// connection, and reports each outcome.
func (t *Transport) runSnapshots(p *peer) {
	defer t.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case m := <-p.snaps:
			start := time.Now()
			err := t.sendSnapshot(p, &m)
			if t.ctx.Err() != nil {
				return // shutting down: nobody to report to
			}
			status := raft.SnapshotFinish
			if err != nil {
				status = raft.SnapshotFailure
				p.snapsFailed.Add(1)
				t.log.Warn("peer: snapshot failed", "peer", p.id, "index", m.Snapshot.Metadata.Index, "err", err)
			} else {
				p.snapsSent.Add(1)
				t.log.Info("peer: snapshot sent", "peer", p.id, "index", m.Snapshot.Metadata.Index,
					"bytes", len(m.Snapshot.Data), "took", time.Since(start))
			}
			if t.cfg.Reporter != nil {
				t.cfg.Reporter.ReportSnapshot(p.id, status)
			}
		}
	}
}

func (t *Transport) sendSnapshot(p *peer, m *raftpb.Message) error {
	if m.Snapshot == nil {
		m.Snapshot = &raftpb.Snapshot{}
	}
	if !t.allowed(t.cfg.ID, p.id) {
		p.filtered.Add(1)
		return errors.New("peer: dropped by filter")
	}
	s, err := t.dial(p, kindSnap)
	if err != nil {
		t.reportUnreachable(p.id)
		return err
	}
	defer s.close()
	if err := s.writeMessage(m, t.cfg.WriteTimeout); err != nil {
		return err
	}
	if err := s.raw.SetReadDeadline(time.Now().Add(t.cfg.SnapshotTimeout)); err != nil {
		return fmt.Errorf("peer: set read deadline: %w", err)
	}
	f, err := s.readFrame()
	if err != nil {
		return fmt.Errorf("peer: waiting for snapshot ack: %w", err)
	}
	if f.Type != FrameAck {
		return fmt.Errorf("%w: got %s, want ack", ErrProtocol, f.Type)
	}
	if f.Payload[0] != ackOK {
		return ErrSnapshotRejected
	}
	return nil
}

// dial connects to p, runs TLS (if configured) and the HMAC handshake, and
// returns a session that closes when p stops.
func (t *Transport) dial(p *peer, kind connKind) (*session, error) {
	d := net.Dialer{Timeout: t.cfg.DialTimeout}
	raw, err := d.DialContext(p.ctx, "tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("peer: dial %d at %s: %w", p.id, p.addr, err)
	}
	stop := context.AfterFunc(p.ctx, func() { _ = raw.Close() })
	s, err := t.clientHandshake(p, raw, kind)
	if err != nil {
		stop()
		_ = raw.Close()
		return nil, fmt.Errorf("peer: handshake with %d at %s: %w", p.id, p.addr, err)
	}
	s.stop = stop
	return s, nil
}

func (t *Transport) clientHandshake(p *peer, raw net.Conn, kind connKind) (*session, error) {
	if err := raw.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		return nil, err
	}
	conn, binding := raw, []byte(nil)
	if t.cfg.TLS != nil {
		cfg := t.cfg.TLS.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(p.addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(p.ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		var err error
		if binding, err = exportBinding(tc); err != nil {
			return nil, err
		}
		conn = tc
	}
	s, err := dialHandshake(raw, conn, t.cfg.Secret, t.cfg.ID, p.id, kind, binding)
	if err != nil {
		return nil, err
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return s, nil
}

func exportBinding(tc *tls.Conn) ([]byte, error) {
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(tlsExporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("tls exporter: %w", err)
	}
	return b, nil
}

// ---- inbound ----

func (t *Transport) acceptLoop(ln net.Listener) {
	defer t.wg.Done()
	var delay time.Duration
	for {
		raw, err := ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("peer: accept failed", "err", err, "retry_in", delay)
			select {
			case <-t.ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		select {
		case t.handshakes <- struct{}{}:
		default:
			t.handshakeFailures.Add(1)
			if ok, suppressed := t.inboundLogs.allow(); ok {
				t.log.Warn("peer: too many pending handshakes, connection refused",
					"remote", raw.RemoteAddr().String(), "suppressed", suppressed)
			}
			_ = raw.Close()
			continue
		}
		t.wg.Add(1)
		go t.serveConn(raw)
	}
}

func (t *Transport) serveConn(raw net.Conn) {
	defer t.wg.Done()
	stop := context.AfterFunc(t.ctx, func() { _ = raw.Close() })
	remote := raw.RemoteAddr().String()
	s, err := t.serverHandshake(raw)
	<-t.handshakes
	if err != nil {
		stop()
		_ = raw.Close()
		if t.ctx.Err() == nil {
			t.handshakeFailures.Add(1)
			if ok, suppressed := t.inboundLogs.allow(); ok {
				t.log.Warn("peer: inbound handshake failed", "remote", remote, "err", err, "suppressed", suppressed)
			}
		}
		return
	}
	s.stop = stop
	defer s.close()
	log := t.log.With("peer", s.peer, "kind", s.kind.String(), "remote", remote)
	if !t.register(s) {
		log.Warn("peer: inbound connection from a removed peer closed")
		return
	}
	defer t.unregister(s)
	log.Debug("peer: inbound connection authenticated")
	err = t.readLoop(s)
	switch {
	case t.ctx.Err() != nil:
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		log.Debug("peer: inbound connection closed", "err", err)
	default:
		log.Warn("peer: inbound connection dropped", "err", err)
	}
}

func (t *Transport) serverHandshake(raw net.Conn) (*session, error) {
	if err := raw.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		return nil, err
	}
	conn, binding := raw, []byte(nil)
	if t.tlsServer != nil {
		tc := tls.Server(raw, t.tlsServer)
		if err := tc.HandshakeContext(t.ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		var err error
		if binding, err = exportBinding(tc); err != nil {
			return nil, err
		}
		conn = tc
	}
	s, err := acceptHandshake(raw, conn, t.cfg.Secret, t.cfg.ID, t.isMember, binding)
	if err != nil {
		return nil, err
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return s, nil
}

// register records s as the inbound connection of its peer and kind,
// closing the one it replaces (a restarted peer's old connection).
func (t *Transport) register(s *session) bool {
	k := inKey{s.peer, s.kind}
	t.mu.Lock()
	if t.closed || t.peers[s.peer] == nil {
		t.mu.Unlock()
		return false
	}
	old := t.inbound[k]
	t.inbound[k] = s
	t.mu.Unlock()
	if old != nil {
		old.close()
	}
	return true
}

func (t *Transport) unregister(s *session) {
	k := inKey{s.peer, s.kind}
	t.mu.Lock()
	if t.inbound[k] == s {
		delete(t.inbound, k)
	}
	t.mu.Unlock()
}

// readLoop decodes and delivers the messages of one inbound connection. Any
// error closes the connection.
func (t *Transport) readLoop(s *session) error {
	var (
		dec      decoder
		deadline bool
	)
	for {
		// Idle message connections may wait forever (TCP keepalive finds
		// dead ones); a snapshot connection or an open stream may not.
		if s.kind == kindSnap || dec.streaming {
			if err := s.raw.SetReadDeadline(time.Now().Add(t.cfg.SnapshotTimeout)); err != nil {
				return err
			}
			deadline = true
		} else if deadline {
			if err := s.raw.SetReadDeadline(time.Time{}); err != nil {
				return err
			}
			deadline = false
		}
		f, err := s.readFrame()
		if err != nil {
			return err
		}
		m, done, err := dec.push(f)
		if err != nil {
			return err
		}
		if !done {
			continue
		}
		ok, err := t.deliver(s, m)
		if err != nil {
			t.rejected.Add(1)
			return err
		}
		if s.kind == kindSnap {
			status := ackOK
			if !ok {
				status = ackRejected
			}
			if err := s.writeFrame(FrameAck, []byte{status}, t.cfg.WriteTimeout); err != nil {
				return err
			}
		}
	}
}

// deliver checks m against the authenticated peer and hands it to the
// Handler. A false result without error means it was dropped (filter,
// handler error); an error is a protocol violation.
func (t *Transport) deliver(s *session, m raftpb.Message) (bool, error) {
	switch {
	case m.From != s.peer:
		return false, fmt.Errorf("%w: %s from authenticated peer %d claims From=%d", ErrProtocol, m.Type, s.peer, m.From)
	case m.To != t.cfg.ID:
		return false, fmt.Errorf("%w: %s from peer %d is addressed to %d, we are %d", ErrProtocol, m.Type, s.peer, m.To, t.cfg.ID)
	case raft.IsLocalMsg(m.Type):
		return false, fmt.Errorf("%w: local-only %s from peer %d", ErrProtocol, m.Type, s.peer)
	case s.kind == kindSnap && m.Type != raftpb.MsgSnap:
		return false, fmt.Errorf("%w: %s on a snapshot connection from peer %d", ErrProtocol, m.Type, s.peer)
	}
	p := t.lookup(s.peer)
	if p == nil {
		return false, fmt.Errorf("%w: peer %d was removed", ErrUnknownPeer, s.peer)
	}
	if !t.allowed(m.From, t.cfg.ID) {
		p.filtered.Add(1)
		return false, nil
	}
	if err := t.cfg.Handler(t.ctx, m); err != nil {
		t.log.Debug("peer: handler failed", "peer", s.peer, "type", m.Type, "err", err)
		return false, nil
	}
	p.received.Add(1)
	return true, nil
}

// logLimiter lets through at most logBurst records per second and counts
// the rest, so a flood of bad connections cannot flood the log.
type logLimiter struct {
	mu         sync.Mutex
	window     time.Time
	n          int
	suppressed int
}

const logBurst = 10

func (l *logLimiter) allow() (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.window) >= time.Second {
		l.window, l.n = now, 0
	}
	if l.n >= logBurst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
