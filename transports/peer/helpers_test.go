package peer

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/internal/testkit"
)

// checkGoroutines fails the test if goroutines started during it are still
// running once its cleanups (Close) have run. Register it first.
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutine leak: %d running, %d before the test\n%s", runtime.NumGoroutine(), base, buf[:n])
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// logRecorder is a slog.Handler that keeps every record for assertions.
type logRecorder struct {
	mu   sync.Mutex
	recs []string
	tb   testing.TB
}

type recHandler struct {
	rec   *logRecorder
	attrs []slog.Attr
}

func (h *recHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.rec.mu.Lock()
	h.rec.recs = append(h.rec.recs, b.String())
	h.rec.mu.Unlock()
	if os.Getenv("PEER_TEST_LOG") != "" {
		h.rec.tb.Log(b.String())
	}
	return nil
}

func (h *recHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recHandler{rec: h.rec, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *recHandler) WithGroup(string) slog.Handler { return h }

// has reports whether some record contains every one of the substrings.
func (r *logRecorder) has(subs ...string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
next:
	for _, rec := range r.recs {
		for _, s := range subs {
			if !strings.Contains(rec, s) {
				continue next
			}
		}
		return true
	}
	return false
}

func (r *logRecorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.recs, "\n")
}

// inbox collects delivered messages: it is the Step of a fakeRaft.
type inbox struct {
	mu   sync.Mutex
	msgs []raftpb.Message
	err  error                                       // returned by Step when set
	step func(context.Context, raftpb.Message) error // when set, Step calls it instead of collecting
}

func (b *inbox) Step(ctx context.Context, m raftpb.Message) error {
	b.mu.Lock()
	if step := b.step; step != nil {
		b.mu.Unlock()
		return step(ctx, m)
	}
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	b.msgs = append(b.msgs, m)
	return nil
}

// setStep makes Step call step instead of collecting.
func (b *inbox) setStep(step func(context.Context, raftpb.Message) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.step = step
}

func (b *inbox) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

func (b *inbox) all() []raftpb.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]raftpb.Message(nil), b.msgs...)
}

type snapReport struct {
	id     uint64
	status raft.SnapshotStatus
}

type fakeReporter struct {
	mu          sync.Mutex
	unreachable map[uint64]int
	snaps       []snapReport
}

func (r *fakeReporter) ReportUnreachable(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unreachable == nil {
		r.unreachable = map[uint64]int{}
	}
	r.unreachable[id]++
}

func (r *fakeReporter) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, snapReport{id, status})
}

func (r *fakeReporter) unreachableCount(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unreachable[id]
}

func (r *fakeReporter) snapshots() []snapReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]snapReport(nil), r.snaps...)
}

// fakeRaft is the Raft a test transport delivers to: messages go to the
// inbox, reports to the fakeReporter.
type fakeRaft struct {
	*inbox
	*fakeReporter
}

var _ Raft = fakeRaft{}

func newFakeRaft() fakeRaft { return fakeRaft{&inbox{}, &fakeReporter{}} }

// node is a started Transport with its observers.
type node struct {
	id   uint64
	tr   *Transport
	in   *inbox
	logs *logRecorder
	rep  *fakeReporter
}

func (n *node) addr() string { return n.tr.Addr().String() }

// testConfig is a Config with short timeouts.
func testConfig(id uint64, logs *logRecorder) Config {
	return Config{
		ID:               id,
		Listen:           "127.0.0.1:0",
		Secret:           testSecret,
		Logger:           slog.New(&recHandler{rec: logs}),
		DialTimeout:      time.Second,
		WriteTimeout:     2 * time.Second,
		HandshakeTimeout: 2 * time.Second,
		SnapshotTimeout:  5 * time.Second,
		BackoffMin:       5 * time.Millisecond,
		BackoffMax:       50 * time.Millisecond,
	}
}

// startNode starts a transport with id; mod may adjust its config.
func startNode(t testing.TB, id uint64, peers map[uint64]string, mod func(*Config)) *node {
	t.Helper()
	n := &node{id: id, in: &inbox{}, logs: &logRecorder{tb: t}, rep: &fakeReporter{}}
	cfg := testConfig(id, n.logs)
	cfg.Peers = peers
	if mod != nil {
		mod(&cfg)
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%d): %v", id, err)
	}
	if err := tr.Start(context.Background(), fakeRaft{n.in, n.rep}); err != nil {
		t.Fatalf("Start(%d): %v", id, err)
	}
	t.Cleanup(func() { tr.Close() })
	n.tr = tr
	return n
}

// cluster starts n fully meshed nodes with ids 1..n.
func cluster(t testing.TB, size int, mod func(*Config)) []*node {
	t.Helper()
	nodes := make([]*node, size)
	for i := range nodes {
		nodes[i] = startNode(t, uint64(i+1), nil, mod)
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.tr.AddPeer(b.id, b.addr())
			}
		}
	}
	return nodes
}

func heartbeat(from, to, term uint64) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgHeartbeat, From: from, To: to, Term: term}
}

// tlsConfig is a node's mutual-TLS config with a certificate from ca.
func tlsConfig(t testing.TB, ca *testkit.CA, name string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, name)},
		RootCAs:      ca.Pool,
		ClientCAs:    ca.Pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
}

// proxy forwards TCP connections to target. For the dialer->listener
// direction it records the bytes of the first connection and lets mutate
// alter bytes in flight (off is the offset in that connection's stream).
type proxy struct {
	ln     net.Listener
	target string
	mutate func(off int64, b []byte)

	mu       sync.Mutex
	recorded []byte
	conns    []net.Conn
	wg       sync.WaitGroup
}

func startProxy(t testing.TB, target string, mutate func(off int64, b []byte)) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, mutate: mutate}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	first := true
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		record := first
		first = false
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 32<<10)
			var off int64
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if p.mutate != nil {
						p.mutate(off, buf[:n])
					}
					if record {
						p.mu.Lock()
						p.recorded = append(p.recorded, buf[:n]...)
						p.mu.Unlock()
					}
					off += int64(n)
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer p.wg.Done()
			defer c.Close()
			io.Copy(c, s)
		}()
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) recordedBytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.recorded...)
}
