package peer

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/internal/testkit"
)

const waitFor = 10 * time.Second

func connected(n *node, ids ...uint64) func() bool {
	return func() bool {
		st := n.tr.Stats()
		for _, id := range ids {
			if !st.Peers[id].Connected {
				return false
			}
		}
		return true
	}
}

// meshed starts a fully connected cluster and waits until every outbound
// connection is up.
func meshed(t testing.TB, size int, mod func(*Config)) []*node {
	t.Helper()
	nodes := cluster(t, size, mod)
	for _, n := range nodes {
		var others []uint64
		for _, o := range nodes {
			if o != n {
				others = append(others, o.id)
			}
		}
		testkit.Eventually(t, waitFor, fmt.Sprintf("node %d connected to %v", n.id, others), connected(n, others...))
	}
	return nodes
}

func TestNewValidatesConfig(t *testing.T) {
	base := func() Config {
		return Config{ID: 1, Listen: "127.0.0.1:0", Secret: testSecret}
	}
	cases := []struct {
		name string
		mod  func(*Config)
	}{
		{"zero id", func(c *Config) { c.ID = 0 }},
		{"no listen address", func(c *Config) { c.Listen = "" }},
		{"no secret", func(c *Config) { c.Secret = nil }},
		{"short secret", func(c *Config) { c.Secret = make([]byte, MinSecretSize-1) }},
		{"negative queue", func(c *Config) { c.QueueSize = -1 }},
		{"negative dial timeout", func(c *Config) { c.DialTimeout = -time.Second }},
		{"negative write timeout", func(c *Config) { c.WriteTimeout = -time.Second }},
		{"backoff min over max", func(c *Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }},
		{"peer id zero", func(c *Config) { c.Peers = map[uint64]string{0: "127.0.0.1:1"} }},
		{"peer without address", func(c *Config) { c.Peers = map[uint64]string{2: ""} }},
		{"tls without client auth", func(c *Config) {
			c.TLS = &tls.Config{Certificates: []tls.Certificate{{}}, ClientAuth: tls.VerifyClientCertIfGiven}
		}},
		{"tls without certificate", func(c *Config) { c.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert} }},
	}
	for _, tc := range cases {
		cfg := base()
		tc.mod(&cfg)
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", tc.name, err)
		}
	}

	cfg := base()
	cfg.Peers = map[uint64]string{1: "ignored:1", 2: "127.0.0.1:1"}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); len(st.Peers) != 1 || st.Peers[2].Addr != "127.0.0.1:1" || tr.cfg.QueueSize != QueueSizeDefault ||
		tr.cfg.DialTimeout != DialTimeoutDefault || tr.cfg.WriteTimeout != WriteTimeoutDefault {
		t.Fatalf("defaults or self entry not applied: %+v", st)
	}
	cfg.Secret[0] ^= 1
	if tr.cfg.Secret[0] == cfg.Secret[0] {
		t.Fatal("New kept the caller's secret slice")
	}
	cfg.Secret[0] ^= 1
	if tr.Addr() == nil {
		t.Fatal("New did not listen: no Addr before Start")
	}
	if err := tr.Start(context.Background(), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Start without a Raft: %v, want ErrInvalidConfig", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Start(context.Background(), newFakeRaft()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}

func TestStartErrors(t *testing.T) {
	checkGoroutines(t)
	n := startNode(t, 1, nil, nil)
	if err := n.tr.Start(context.Background(), newFakeRaft()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	cfg := testConfig(2, &logRecorder{tb: t})
	cfg.Listen = n.addr()
	if tr, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "peer: listen") {
		if tr != nil {
			_ = tr.Close()
		}
		t.Fatalf("New on a busy address: %v", err)
	}
}

func TestExchangeThreeNodes(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 3, nil)
	const perPair = 50
	want := map[uint64][]byte{} // marshalled MsgApp by node pair, to compare contents
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			app := raftpb.Message{Type: raftpb.MsgApp, From: a.id, To: b.id, Term: 2, LogTerm: 2, Index: 41, Commit: 40,
				Entries: []raftpb.Entry{{Term: 2, Index: 42, Data: []byte(fmt.Sprintf("grant %d->%d", a.id, b.id))}}}
			want[a.id*10+b.id] = mustMarshal(t, app)
			msgs := []raftpb.Message{app}
			for i := 1; i < perPair; i++ {
				msgs = append(msgs, raftpb.Message{Type: raftpb.MsgHeartbeat, From: a.id, To: b.id, Term: 2, Commit: uint64(i)})
			}
			a.tr.Send(msgs)
		}
	}
	for _, n := range nodes {
		testkit.Eventually(t, waitFor, fmt.Sprintf("node %d inbox", n.id), func() bool { return n.in.len() == 2*perPair })
		next := map[uint64]uint64{}
		for _, m := range n.in.all() {
			if m.To != n.id || m.From == n.id || m.From < 1 || m.From > 3 {
				t.Fatalf("node %d got a misaddressed message %v->%v", n.id, m.From, m.To)
			}
			if m.Type == raftpb.MsgApp {
				if got := mustMarshal(t, m); !bytes.Equal(got, want[m.From*10+m.To]) {
					t.Fatalf("MsgApp %d->%d arrived altered", m.From, m.To)
				}
			}
			pos := m.Commit // heartbeat i carries Commit i; the MsgApp goes first
			if m.Type == raftpb.MsgApp {
				pos = 0
			}
			if pos != next[m.From] {
				t.Fatalf("node %d: from %d got message %d, want %d (order)", n.id, m.From, pos, next[m.From])
			}
			next[m.From]++
		}
	}
	for _, a := range nodes {
		st := a.tr.Stats()
		for _, b := range nodes {
			if a == b {
				continue
			}
			ps := st.Peers[b.id]
			if ps.Sent != perPair || ps.Received != perPair || ps.Dropped != 0 || !ps.Connected {
				t.Fatalf("node %d, peer %d: %+v", a.id, b.id, ps)
			}
		}
	}
}

func TestSnapshotStreamed(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	data := make([]byte, 10<<20)
	rand.Read(data)
	snap := raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 3, Snapshot: &raftpb.Snapshot{Data: data,
		Metadata: raftpb.SnapshotMetadata{Index: 1000, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}}}}
	n1.tr.Send([]raftpb.Message{snap, heartbeat(1, 2, 3)})
	testkit.Eventually(t, waitFor, "snapshot and heartbeat delivered", func() bool { return n2.in.len() == 2 })
	var got *raftpb.Message
	for _, m := range n2.in.all() {
		if m.Type == raftpb.MsgSnap {
			got = &m
		}
	}
	if got == nil || got.From != 1 || got.Term != 3 || got.Snapshot.Metadata.Index != 1000 ||
		len(got.Snapshot.Metadata.ConfState.Voters) != 2 || !bytes.Equal(got.Snapshot.Data, data) {
		t.Fatal("snapshot arrived altered")
	}
	testkit.Eventually(t, waitFor, "ReportSnapshot", func() bool { return len(n1.rep.snapshots()) == 1 })
	if r := n1.rep.snapshots()[0]; r != (snapReport{2, raft.SnapshotFinish}) {
		t.Fatalf("report %+v, want SnapshotFinish for 2", r)
	}
	if st := n1.tr.Stats().Peers[2]; st.SnapshotsSent != 1 || st.SnapshotsFailed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSnapshotFailuresReported(t *testing.T) {
	checkGoroutines(t)
	small := func(from, to uint64) raftpb.Message {
		return raftpb.Message{Type: raftpb.MsgSnap, From: from, To: to, Term: 1,
			Snapshot: &raftpb.Snapshot{Data: []byte("state"), Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 1}}}
	}
	failures := func(r *fakeReporter, id uint64) (n int) {
		for _, s := range r.snapshots() {
			if s.id == id && s.status == raft.SnapshotFailure {
				n++
			}
			if s.status == raft.SnapshotFinish {
				t.Fatalf("unexpected SnapshotFinish for %d", s.id)
			}
		}
		return n
	}

	t.Run("receiver step fails", func(t *testing.T) {
		nodes := meshed(t, 2, nil)
		nodes[1].in.mu.Lock()
		nodes[1].in.err = errors.New("raft stopped")
		nodes[1].in.mu.Unlock()
		nodes[0].tr.Send([]raftpb.Message{small(1, 2)})
		testkit.Eventually(t, waitFor, "failure report", func() bool { return failures(nodes[0].rep, 2) == 1 })
	})
	t.Run("peer down and queue full", func(t *testing.T) {
		n := startNode(t, 1, map[uint64]string{2: testkit.FreeAddr(t)}, nil)
		var msgs []raftpb.Message
		for range 20 {
			msgs = append(msgs, small(1, 2))
		}
		n.tr.Send(msgs) // more than the snapshot queue holds: the rest fail at once
		testkit.Eventually(t, waitFor, "20 failure reports", func() bool { return failures(n.rep, 2) == 20 })
		if st := n.tr.Stats().Peers[2]; st.SnapshotsFailed != 20 || st.Dropped == 0 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("filtered", func(t *testing.T) {
		nodes := meshed(t, 2, nil)
		nodes[0].tr.SetFilter(func(from, to uint64) bool { return false })
		nodes[0].tr.Send([]raftpb.Message{small(1, 2)})
		testkit.Eventually(t, waitFor, "failure report", func() bool { return failures(nodes[0].rep, 2) == 1 })
		if nodes[1].in.len() != 0 {
			t.Fatal("filtered snapshot delivered")
		}
	})
}

func TestWrongSecretRejected(t *testing.T) {
	checkGoroutines(t)
	n1 := startNode(t, 1, nil, nil)
	n2 := startNode(t, 2, map[uint64]string{1: n1.addr()}, func(c *Config) {
		c.Secret = []byte("another-clusters-secret-98765432")
	})
	n1.tr.AddPeer(2, n2.addr())
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
	n2.tr.Send([]raftpb.Message{heartbeat(2, 1, 1)})
	testkit.Eventually(t, waitFor, "repeated handshake failures on both sides", func() bool {
		return n1.tr.Stats().HandshakeFailures >= 3 && n2.tr.Stats().HandshakeFailures >= 3
	})
	for _, n := range []*node{n1, n2} {
		if !n.logs.has("connect failed", "authentication failed") {
			t.Errorf("node %d did not log its failed connect:\n%s", n.id, n.logs.dump())
		}
		if !n.logs.has("inbound handshake failed", "rejected by remote", "authentication failed") {
			t.Errorf("node %d did not log the refused inbound handshake:\n%s", n.id, n.logs.dump())
		}
		if n.in.len() != 0 {
			t.Errorf("node %d delivered %d messages", n.id, n.in.len())
		}
		if st := n.tr.Stats(); st.Peers[3-n.id].Connected {
			t.Errorf("node %d reports connected", n.id)
		}
		if n.rep.unreachableCount(3-n.id) == 0 {
			t.Errorf("node %d never reported its peer unreachable", n.id)
		}
	}
}

// Nodes of another cluster are refused even when they share the secret:
// the cluster ID is bound into the handshake. Nodes of the same cluster
// ID talk.
func TestOtherClusterRejected(t *testing.T) {
	checkGoroutines(t)
	n1 := startNode(t, 1, nil, func(c *Config) { c.ClusterID = 0xA1 })
	other := startNode(t, 2, map[uint64]string{1: n1.addr()}, func(c *Config) { c.ClusterID = 0xB2 })
	n1.tr.AddPeer(2, other.addr())
	other.tr.Send([]raftpb.Message{heartbeat(2, 1, 1)})
	testkit.Eventually(t, waitFor, "refused handshakes", func() bool {
		return n1.tr.Stats().HandshakeFailures >= 2 && n1.logs.has("inbound handshake failed", "authentication failed")
	})
	if n1.in.len() != 0 {
		t.Fatalf("a node of another cluster delivered %d messages", n1.in.len())
	}
	same := startNode(t, 3, map[uint64]string{1: n1.addr()}, func(c *Config) { c.ClusterID = 0xA1 })
	n1.tr.AddPeer(3, same.addr())
	testkit.Eventually(t, waitFor, "delivery within the cluster", func() bool {
		same.tr.Send([]raftpb.Message{heartbeat(3, 1, 1)})
		return n1.in.len() > 0
	})
	if k := clusterKey(testSecret, 0); string(k) != string(testSecret) {
		t.Fatal("cluster ID 0 must keep the secret itself (the handshake of older nodes)")
	}
}

func TestUnknownPeerRejected(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, nil, nil) // knows no members
	n3 := startNode(t, 3, map[uint64]string{2: n2.addr()}, nil)
	n3.tr.Send([]raftpb.Message{heartbeat(3, 2, 1)})
	testkit.Eventually(t, waitFor, "unknown peer refused", func() bool {
		return n2.logs.has("inbound handshake failed", "unknown peer", "claims id 3") &&
			n3.logs.has("connect failed", "rejected by remote", "unknown peer")
	})
	// A node that thinks id 5 lives at node 2's address is refused too.
	n1 := startNode(t, 1, map[uint64]string{5: n2.addr()}, nil)
	testkit.Eventually(t, waitFor, "wrong target refused", func() bool {
		return n2.logs.has("inbound handshake failed", "peer id mismatch", "meant to reach 5") &&
			n1.logs.has("connect failed", "peer id mismatch")
	})
	if n2.in.len() != 0 || n2.tr.Stats().HandshakeFailures < 2 {
		t.Fatalf("delivered %d, handshake failures %d", n2.in.len(), n2.tr.Stats().HandshakeFailures)
	}
}

// rawSession authenticates to target as node `as` and returns the session
// for hand-written frames.
func rawSession(t *testing.T, from *node, target *node, kind connKind) *session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := &peer{id: target.id, addr: target.addr(), ctx: ctx}
	s, err := from.tr.dial(p, kind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

// closedByRemote reports whether the remote closes s (a read fails for a
// reason other than our deadline).
func closedByRemote(t *testing.T, s *session) bool {
	t.Helper()
	s.raw.SetReadDeadline(time.Now().Add(waitFor))
	var b [1]byte
	_, err := s.conn.Read(b[:])
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestForgedMessagesDropped(t *testing.T) {
	checkGoroutines(t)
	// Node 1 has no outbound connection of its own, so only the raw
	// sessions below reach node 2.
	n1 := startNode(t, 1, nil, nil)
	n2 := startNode(t, 2, map[uint64]string{1: n1.addr(), 3: testkit.FreeAddr(t)}, nil)
	cases := []struct {
		m   raftpb.Message
		log string
	}{
		{heartbeat(3, 2, 1), "claims From=3"},
		{heartbeat(1, 3, 1), "addressed to 3"},
		{raftpb.Message{Type: raftpb.MsgHup, From: 1, To: 2}, "local-only MsgHup"},
		{raftpb.Message{Type: raftpb.MsgSnapStatus, From: 1, To: 2}, "local-only MsgSnapStatus"},
	}
	for i, tc := range cases {
		s := rawSession(t, n1, n2, kindMsg)
		b, err := s.appendMsg(nil, &tc.m, tc.m.Size())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.write(b, time.Second); err != nil {
			t.Fatal(err)
		}
		if !closedByRemote(t, s) {
			t.Fatalf("case %d: connection not closed after %s", i, tc.log)
		}
		testkit.Eventually(t, waitFor, "rejection logged: "+tc.log, func() bool {
			return n2.logs.has("inbound connection dropped", "protocol violation", tc.log)
		})
	}
	if st := n2.tr.Stats(); st.Rejected != uint64(len(cases)) || n2.in.len() != 0 {
		t.Fatalf("rejected %d, delivered %d", st.Rejected, n2.in.len())
	}
	// The same path with an honest message delivers it.
	s := rawSession(t, n1, n2, kindMsg)
	m := heartbeat(1, 2, 9)
	if err := s.writeMessage(&m, time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, "honest message", func() bool { return n2.in.len() == 1 })
}

func TestSendNeverBlocks(t *testing.T) {
	checkGoroutines(t)
	batch := func(from, to uint64, n, entry int) []raftpb.Message {
		msgs := make([]raftpb.Message, n)
		for i := range msgs {
			msgs[i] = raftpb.Message{Type: raftpb.MsgApp, From: from, To: to, Term: 1, Index: uint64(i),
				Entries: []raftpb.Entry{{Term: 1, Index: uint64(i + 1), Data: make([]byte, entry)}}}
		}
		return msgs
	}
	measure := func(send func()) (worst, total time.Duration) {
		start := time.Now()
		for range 1000 {
			s := time.Now()
			send()
			worst = max(worst, time.Since(s))
		}
		return worst, time.Since(start)
	}

	t.Run("peer down", func(t *testing.T) {
		n := startNode(t, 1, map[uint64]string{2: testkit.FreeAddr(t)}, func(c *Config) { c.QueueSize = 64 })
		msgs := batch(1, 2, 100, 16)
		worst, total := measure(func() { n.tr.Send(msgs) })
		t.Logf("100,000 messages to a down peer: worst Send %v, total %v", worst, total)
		if worst > 100*time.Millisecond {
			t.Fatalf("a Send of 100 messages took %v", worst)
		}
		testkit.Eventually(t, waitFor, "everything dropped", func() bool { return n.tr.Stats().Peers[2].Dropped == 100_000 })
		if st := n.tr.Stats().Peers[2]; st.Sent != 0 || st.Connected {
			t.Fatalf("stats %+v", st)
		}
	})

	t.Run("receiver stalled", func(t *testing.T) {
		release := make(chan struct{})
		var got atomic.Int64
		nodes := meshed(t, 2, func(c *Config) {
			c.QueueSize = 64
			c.WriteTimeout = 300 * time.Millisecond
		})
		nodes[1].in.setStep(func(ctx context.Context, m raftpb.Message) error {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			got.Add(1)
			return nil
		})
		msgs := batch(1, 2, 16, 64<<10) // 1 MiB per Send: the socket buffers fill fast
		worst, total := measure(func() { nodes[0].tr.Send(msgs) })
		t.Logf("1 GiB to a stalled peer: worst Send %v, total %v", worst, total)
		if worst > 100*time.Millisecond {
			t.Fatalf("a Send took %v while the receiver was stalled", worst)
		}
		if st := nodes[0].tr.Stats().Peers[2]; st.Dropped == 0 {
			t.Fatalf("nothing dropped: %+v", st)
		}
		close(release)
		nodes[0].tr.Send(batch(1, 2, 1, 1))
		testkit.Eventually(t, waitFor, "delivery after the stall", func() bool { return got.Load() > 0 })
	})
}

func TestReconnectAfterRestart(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
	testkit.Eventually(t, waitFor, "first delivery", func() bool { return n2.in.len() == 1 })

	addr := n2.addr()
	n2.tr.Close()
	testkit.Eventually(t, waitFor, "node 1 notices", func() bool {
		return !n1.tr.Stats().Peers[2].Connected && n1.rep.unreachableCount(2) > 0
	})

	n2b := startNode(t, 2, map[uint64]string{1: n1.addr()}, func(c *Config) { c.Listen = addr })
	testkit.Eventually(t, waitFor, "delivery to the restarted node", func() bool {
		n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 2)})
		return n2b.in.len() > 0
	})
	testkit.Eventually(t, waitFor, "reconnected both ways", func() bool {
		return connected(n1, 2)() && connected(n2b, 1)()
	})
	n2b.tr.Send([]raftpb.Message{heartbeat(2, 1, 2)})
	testkit.Eventually(t, waitFor, "delivery from the restarted node", func() bool { return n1.in.len() == 1 })
}

func TestFilterDropsOneWay(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	tenOf := func(from, to uint64) []raftpb.Message {
		var msgs []raftpb.Message
		for i := range 10 {
			msgs = append(msgs, heartbeat(from, to, uint64(i+1)))
		}
		return msgs
	}
	// Outbound: node 1 drops 1->2 in Send.
	n1.tr.SetFilter(func(from, to uint64) bool { return !(from == 1 && to == 2) })
	n1.tr.Send(tenOf(1, 2))
	n2.tr.Send(tenOf(2, 1))
	testkit.Eventually(t, waitFor, "2->1 still flows", func() bool { return n1.in.len() == 10 })
	if st := n1.tr.Stats().Peers[2]; st.Filtered != 10 || st.Sent != 0 || n2.in.len() != 0 {
		t.Fatalf("1->2 not filtered: %+v, delivered %d", st, n2.in.len())
	}
	// Inbound: node 2 drops what comes from 1 before its Raft.Step.
	n1.tr.SetFilter(nil)
	n2.tr.SetFilter(func(from, to uint64) bool { return from != 1 })
	n1.tr.Send(tenOf(1, 2))
	testkit.Eventually(t, waitFor, "inbound filter", func() bool { return n2.tr.Stats().Peers[1].Filtered == 10 })
	if n2.in.len() != 0 {
		t.Fatalf("inbound filter let %d through", n2.in.len())
	}
	n2.tr.SetFilter(nil)
	n1.tr.Send(tenOf(1, 2))
	testkit.Eventually(t, waitFor, "traffic resumes", func() bool { return n2.in.len() == 10 })
}

func TestMutualTLS(t *testing.T) {
	checkGoroutines(t)
	ca := testkit.NewCA(t, "ticketd test cluster")
	nodes := meshed(t, 2, func(c *Config) { c.TLS = tlsConfig(t, ca, fmt.Sprint("node-", c.ID)) })
	n1, n2 := nodes[0], nodes[1]
	data := bytes.Repeat([]byte("tls snapshot "), 600_000) // ~7.8 MiB: streamed
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1),
		{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 1, Snapshot: &raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 3, Term: 1}}}})
	n2.tr.Send([]raftpb.Message{heartbeat(2, 1, 1)})
	testkit.Eventually(t, waitFor, "exchange over TLS", func() bool { return n2.in.len() == 2 && n1.in.len() == 1 })
	testkit.Eventually(t, waitFor, "snapshot finish", func() bool { return len(n1.rep.snapshots()) == 1 })
	if r := n1.rep.snapshots()[0]; r.status != raft.SnapshotFinish {
		t.Fatalf("snapshot over TLS: %+v", r)
	}

	// A client without a certificate is refused by TLS itself.
	before := n1.tr.Stats().HandshakeFailures
	conn, err := tls.Dial("tcp", n1.addr(), &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"})
	if err == nil {
		h := hello{kind: kindMsg, dialer: 2, target: 1}
		conn.Write(mustFrame(t, FrameHello, h.encode()))
		conn.SetReadDeadline(time.Now().Add(waitFor))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("certificate-less client not refused: %v", err)
	}
	testkit.Eventually(t, waitFor, "refusal counted and logged", func() bool {
		return n1.tr.Stats().HandshakeFailures > before && n1.logs.has("inbound handshake failed", "tls")
	})

	// A member with a certificate from another CA, and one without TLS.
	rogue := testkit.NewCA(t, "rogue")
	n3 := startNode(t, 3, map[uint64]string{1: n1.addr()}, func(c *Config) { c.TLS = tlsConfig(t, rogue, "node-3") })
	n4 := startNode(t, 4, map[uint64]string{1: n1.addr()}, nil)
	n1.tr.AddPeer(3, n3.addr())
	n1.tr.AddPeer(4, n4.addr())
	n3.tr.Send([]raftpb.Message{heartbeat(3, 1, 1)})
	n4.tr.Send([]raftpb.Message{heartbeat(4, 1, 1)})
	testkit.Eventually(t, waitFor, "foreign CA and plain TCP refused", func() bool {
		return n3.logs.has("connect failed", "tls") && n4.logs.has("connect failed", "handshake with 1") &&
			n1.tr.Stats().HandshakeFailures >= before+3
	})
	if n1.in.len() != 1 {
		t.Fatalf("node 1 delivered %d messages, want only node 2's", n1.in.len())
	}
}

// The handshake bytes of a real connection, replayed on a new one, fail:
// the listener's fresh nonce changes the proof it expects.
func TestReplayedHandshakeRejected(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, map[uint64]string{1: testkit.FreeAddr(t)}, nil)
	px := startProxy(t, n2.addr(), nil)
	n1 := startNode(t, 1, map[uint64]string{2: px.addr()}, nil)
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
	testkit.Eventually(t, waitFor, "delivery through the proxy", func() bool { return n2.in.len() == 1 })
	rec := px.recordedBytes()
	if len(rec) < HeaderSize+helloSize+HeaderSize+proofSize {
		t.Fatalf("recorded only %d bytes", len(rec))
	}
	conn, err := net.Dial("tcp", n2.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(rec)
	conn.SetReadDeadline(time.Now().Add(waitFor))
	for {
		if _, err := conn.Read(make([]byte, 512)); err != nil {
			break
		}
	}
	testkit.Eventually(t, waitFor, "replay refused", func() bool {
		return n2.logs.has("inbound handshake failed", "authentication failed", "did not prove")
	})
	if n2.in.len() != 1 {
		t.Fatalf("replayed traffic delivered: %d messages", n2.in.len())
	}
}

// A bit flipped in flight after the handshake fails the frame MAC.
func TestTamperedFrameRejected(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, map[uint64]string{1: testkit.FreeAddr(t)}, nil)
	const firstFrame = HeaderSize + helloSize + HeaderSize + proofSize
	var tampered atomic.Bool
	px := startProxy(t, n2.addr(), func(off int64, b []byte) {
		at := int64(firstFrame + HeaderSize + 2)
		if off <= at && at < off+int64(len(b)) && !tampered.Swap(true) {
			b[at-off] ^= 0x01
		}
	})
	n1 := startNode(t, 1, map[uint64]string{2: px.addr()}, nil)
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 7)})
	testkit.Eventually(t, waitFor, "bad MAC detected", func() bool {
		return n2.logs.has("inbound connection dropped", "frame authentication failed")
	})
	testkit.Eventually(t, waitFor, "delivery after reconnect", func() bool {
		n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 8)})
		return n2.in.len() > 0
	})
	for _, m := range n2.in.all() {
		if m.Term != 8 {
			t.Fatalf("tampered message delivered: %+v", m)
		}
	}
}

func TestRemovePeer(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 2, nil)
	n1, n2 := nodes[0], nodes[1]
	n2.tr.RemovePeer(1)
	if _, ok := n2.tr.Stats().Peers[1]; ok {
		t.Fatal("removed peer still in stats")
	}
	testkit.Eventually(t, waitFor, "node 1 refused after removal", func() bool {
		return !connected(n1, 2)() && n1.logs.has("connect failed", "rejected by remote", "unknown peer")
	})
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
	n2.tr.Send([]raftpb.Message{heartbeat(2, 1, 1)}) // unroutable now
	if st := n2.tr.Stats(); st.Unroutable != 1 {
		t.Fatalf("unroutable %d", st.Unroutable)
	}
	// Let node 1 give up on that message before node 2 re-admits it.
	testkit.Eventually(t, waitFor, "message dropped while removed", func() bool { return n1.tr.Stats().Peers[2].Dropped == 1 })
	n2.tr.AddPeer(1, n1.addr())
	testkit.Eventually(t, waitFor, "delivery after re-adding", func() bool {
		n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 2)})
		return n2.in.len() > 0
	})
	for _, m := range n2.in.all() {
		if m.Term != 2 {
			t.Fatalf("message sent while removed was delivered: %+v", m)
		}
	}
}

func TestHostileInbound(t *testing.T) {
	checkGoroutines(t)
	n := startNode(t, 1, map[uint64]string{2: testkit.FreeAddr(t)}, func(c *Config) { c.HandshakeTimeout = 200 * time.Millisecond })
	h := hello{kind: kindMsg, dialer: 2, target: 1}
	cases := []struct {
		name string
		in   []byte
		log  string
	}{
		{"http request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "unknown frame version"},
		{"huge hello", header(Version1, FrameHello, MaxFrameSize), "frame too large"},
		{"session frame first", append(append(header(Version1, FrameMsg, 1), 1), make([]byte, MACSize)...), "got msg, want hello"},
		{"bad kind", mustFrame(t, FrameHello, func() []byte { b := h.encode(); b[0] = 7; return b }()), "unknown connection kind"},
		{"hello then garbage proof", append(mustFrame(t, FrameHello, h.encode()), mustFrame(t, FrameProof, make([]byte, proofSize))...), "did not prove"},
		{"silent", nil, "i/o timeout"},
		{"half a header", []byte{Version1, 1}, "i/o timeout"},
	}
	for i, tc := range cases {
		conn, err := net.Dial("tcp", n.addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(tc.in)
		conn.SetReadDeadline(time.Now().Add(waitFor))
		for {
			if _, err = conn.Read(make([]byte, 256)); err != nil {
				break
			}
		}
		conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the listener did not close the connection", tc.name)
		}
		testkit.Eventually(t, waitFor, tc.name+" logged", func() bool {
			return n.tr.Stats().HandshakeFailures == uint64(i+1) && n.logs.has("inbound handshake failed", tc.log)
		})
	}
	if n.in.len() != 0 {
		t.Fatal("hostile input delivered a message")
	}
}

// dialFrom opens a TCP connection to addr from the loopback address ip
// (any of 127.0.0.0/8 on Linux), standing in for another machine; the
// test is skipped where such an address cannot be bound.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from %s (%v): this system routes only 127.0.0.1", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refused reports whether the listener closed c without a word.
func refused(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// pendingFrom is how many connections from source wait for their
// handshake, and how many in all.
func pendingFrom(n *node, source string) (total, fromSource int) {
	return n.tr.pending.Len(source)
}

// At most MaxPendingHandshakes unauthenticated connections from addresses
// that are not a member's, from as many sources as it takes: one more
// evicts the oldest, rather than being refused.
func TestPendingHandshakeLimit(t *testing.T) {
	checkGoroutines(t)
	n := startNode(t, 1, nil, func(c *Config) { c.HandshakeTimeout, c.HelloTimeout = time.Minute, time.Minute })
	var conns []net.Conn
	for i := range MaxPendingHandshakes {
		conns = append(conns, dialFrom(t, fmt.Sprintf("127.0.1.%d", 1+i/MaxPendingHandshakesPerSource), n.addr()))
	}
	testkit.Eventually(t, waitFor, "every slot taken", func() bool { total, _ := pendingFrom(n, ""); return total == MaxPendingHandshakes })
	dialFrom(t, "127.0.2.1", n.addr())
	if !refused(conns[0]) {
		t.Fatal("the oldest pending connection was kept beyond the limit")
	}
	testkit.Eventually(t, waitFor, "the newcomer admitted, the oldest evicted", func() bool {
		total, newcomer := pendingFrom(n, "127.0.2.1")
		return total == MaxPendingHandshakes && newcomer == 1 &&
			n.tr.Stats().HandshakeFailures == 1 && n.logs.has("closed to make room")
	})
}

// Idle connections from one source take at most
// MaxPendingHandshakesPerSource slots, its newest: a member restarting
// elsewhere still gets in (the 64 idle connections kept one out
// for 20 s).
func TestIdleConnectionsFromOneSourceDoNotLockOutMembers(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, map[uint64]string{1: "127.0.0.1:1"}, func(c *Config) { c.HandshakeTimeout, c.HelloTimeout = time.Minute, time.Minute })
	var idle []net.Conn
	for range MaxPendingHandshakes {
		idle = append(idle, dialFrom(t, "127.0.0.2", n2.addr()))
	}
	for _, c := range idle[:MaxPendingHandshakes-MaxPendingHandshakesPerSource] {
		if !refused(c) {
			t.Fatal("a connection beyond the per-source limit was kept")
		}
	}
	n1 := startNode(t, 1, map[uint64]string{2: n2.addr()}, nil)
	testkit.Eventually(t, waitFor, "the member's heartbeat delivered", func() bool {
		n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
		return n2.in.len() > 0
	})
	if _, got := pendingFrom(n2, "127.0.0.2"); got != MaxPendingHandshakesPerSource {
		t.Fatalf("%d pending from the flooding source, want %d", got, MaxPendingHandshakesPerSource)
	}
	if got := n2.tr.Stats().HandshakeFailures; got != MaxPendingHandshakes-MaxPendingHandshakesPerSource {
		t.Fatalf("%d refusals, want %d", got, MaxPendingHandshakes-MaxPendingHandshakesPerSource)
	}
}

// A member the listener does not know by address (its peer address names
// another IP) still gets in through a full table of idle connections from
// many sources: it evicts the oldest. Once authenticated, its address is
// learned and reserved.
func TestFloodEvictsForAnUnknownMemberAddress(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, map[uint64]string{1: "127.0.0.3:1"}, func(c *Config) { c.HandshakeTimeout, c.HelloTimeout = time.Minute, time.Minute })
	for i := range MaxPendingHandshakes + 8 {
		dialFrom(t, fmt.Sprintf("127.0.1.%d", 1+i/MaxPendingHandshakesPerSource), n2.addr())
	}
	testkit.Eventually(t, waitFor, "every slot taken", func() bool { total, _ := pendingFrom(n2, ""); return total == MaxPendingHandshakes })
	if n2.tr.isMemberSource("127.0.0.1") {
		t.Fatal("127.0.0.1 counts as a member's address before any member came from it")
	}
	n1 := startNode(t, 1, map[uint64]string{2: n2.addr()}, nil)
	testkit.Eventually(t, waitFor, "the member's heartbeat delivered", func() bool {
		n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
		return n2.in.len() > 0
	})
	if !n2.tr.isMemberSource("127.0.0.1") {
		t.Fatal("the address the member authenticated from was not learned")
	}
}

// Connections from a member's address are reserved: a flood from many
// other addresses, dialling again as fast as it is evicted, never delays
// the member, and never holds more than MaxPendingHandshakes.
func TestMemberAddressesReservedUnderChurningFlood(t *testing.T) {
	checkGoroutines(t)
	n2 := startNode(t, 2, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	floodConnect(ctx, t, []func() string{n2.addr}, 9, MaxPendingHandshakesPerSource)
	t.Cleanup(cancel) // runs before the flood's cleanup waits for it
	testkit.Eventually(t, waitFor, "the flood evicting", func() bool { return n2.tr.Stats().HandshakeFailures > 20 })
	for round := range 3 {
		n2.tr.AddPeer(1, "127.0.0.1:1") // the member's address, as its peer address names it
		n1 := startNode(t, 1, map[uint64]string{2: n2.addr()}, nil)
		testkit.Eventually(t, 2*time.Second, fmt.Sprint("the member's heartbeat delivered, round ", round), func() bool {
			n1.tr.Send([]raftpb.Message{heartbeat(1, 2, uint64(round+1))})
			return n2.in.len() > round
		})
		if total, member := pendingFrom(n2, "127.0.0.1"); total-member > MaxPendingHandshakes {
			t.Fatalf("%d pending from strangers, the limit is %d", total-member, MaxPendingHandshakes)
		}
		n1.tr.Close()
		n2.tr.RemovePeer(1)
	}
}

// A member's peer address given as a host name counts once resolved, and
// no longer once the member is removed.
func TestMemberHostNameResolved(t *testing.T) {
	checkGoroutines(t)
	n := startNode(t, 2, nil, nil)
	n.tr.AddPeer(1, "localhost:1")
	testkit.Eventually(t, waitFor, "localhost resolved", func() bool { return n.tr.isMemberSource("127.0.0.1") })
	n.tr.RemovePeer(1)
	if n.tr.isMemberSource("127.0.0.1") {
		t.Fatal("a removed member's address still counts")
	}
}

// A connection that does not send its hello within HelloTimeout is
// closed, however long HandshakeTimeout is; one that did send it has the
// rest of HandshakeTimeout to finish.
func TestHelloTimeout(t *testing.T) {
	checkGoroutines(t)
	const helloTimeout = 100 * time.Millisecond
	n := startNode(t, 1, map[uint64]string{2: testkit.FreeAddr(t)}, func(c *Config) { c.HandshakeTimeout, c.HelloTimeout = time.Minute, helloTimeout })
	silent := dialFrom(t, "127.0.0.1", n.addr())
	if !refused(silent) {
		t.Fatal("a silent connection outlived HelloTimeout")
	}
	testkit.Eventually(t, waitFor, "the timeout logged", func() bool { return n.logs.has("inbound handshake failed", "i/o timeout") })
	talker := dialFrom(t, "127.0.0.1", n.addr())
	h := hello{kind: kindMsg, dialer: 2, target: 1}
	if _, err := talker.Write(mustFrame(t, FrameHello, h.encode())); err != nil {
		t.Fatal(err)
	}
	r := newHandshakeReader(talker)
	if _, err := readHandshake(r, FrameChallenge); err != nil {
		t.Fatal(err)
	}
	// Still open well past HelloTimeout: the read ends by its own deadline.
	_ = talker.SetReadDeadline(time.Now().Add(5 * helloTimeout))
	if _, err := talker.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection that sent its hello: %v, want it still open", err)
	}
}

func TestCloseStopsGoroutines(t *testing.T) {
	checkGoroutines(t)
	nodes := meshed(t, 3, nil)
	n1 := nodes[0]
	n1.tr.AddPeer(9, testkit.FreeAddr(t)) // a member that never answers: reconnect churn
	addr3 := nodes[2].addr()
	for round := range 3 {
		nodes[2].tr.Close()
		nodes[2] = startNode(t, 3, map[uint64]string{1: n1.addr(), 2: nodes[1].addr()}, func(c *Config) { c.Listen = addr3 })
		testkit.Eventually(t, waitFor, fmt.Sprint("round ", round), func() bool {
			n1.tr.Send([]raftpb.Message{heartbeat(1, 3, uint64(round))})
			return nodes[2].in.len() > 0
		})
	}
	// A Step stuck until its context ends must not keep Close waiting.
	stuck := make(chan struct{})
	var once sync.Once
	n5 := startNode(t, 5, map[uint64]string{1: n1.addr()}, nil)
	n5.in.setStep(func(ctx context.Context, m raftpb.Message) error {
		once.Do(func() { close(stuck) })
		<-ctx.Done()
		return ctx.Err()
	})
	n1.tr.AddPeer(5, n5.addr())
	n1.tr.Send([]raftpb.Message{heartbeat(1, 5, 1)})
	testkit.Eventually(t, waitFor, "step entered", func() bool {
		select {
		case <-stuck:
			return true
		default:
			n1.tr.Send([]raftpb.Message{heartbeat(1, 5, 1)})
			return false
		}
	})
	done := make(chan struct{})
	go func() {
		n5.tr.Close()
		n5.tr.Close() // idempotent
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("Close blocked on a stuck Step")
	}
	for _, n := range nodes {
		n.tr.Close()
	}
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)}) // after Close: dropped
	n1.tr.AddPeer(7, "127.0.0.1:1")                  // after Close: ignored
}

// BenchmarkSendReceive measures MsgApp throughput between two transports:
// Send on one, Raft.Step on the other, with the sender kept under its queue
// bound so nothing is dropped.
func BenchmarkSendReceive(b *testing.B) {
	for _, entry := range []int{128, 1024, 16 << 10} {
		b.Run(fmt.Sprintf("entries=4x%dB", entry), func(b *testing.B) {
			var got atomic.Int64
			nodes := meshed(b, 2, func(c *Config) { c.Logger = nil })
			nodes[1].in.setStep(func(context.Context, raftpb.Message) error { got.Add(1); return nil })
			m := raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 2, Term: 5, LogTerm: 5, Index: 100, Commit: 99}
			for i := range 4 {
				m.Entries = append(m.Entries, raftpb.Entry{Term: 5, Index: uint64(101 + i), Data: make([]byte, entry)})
			}
			batch := make([]raftpb.Message, 64)
			for i := range batch {
				batch[i] = m
			}
			b.SetBytes(int64(m.Size()))
			b.ReportAllocs()
			b.ResetTimer()
			sent := 0
			for sent < b.N {
				for int64(sent)-got.Load() > QueueSizeDefault/2 {
					time.Sleep(20 * time.Microsecond)
				}
				k := min(len(batch), b.N-sent)
				nodes[0].tr.Send(batch[:k])
				sent += k
			}
			testkit.Eventually(b, waitFor, "all received", func() bool { return got.Load() == int64(b.N) })
			b.StopTimer()
			if st := nodes[0].tr.Stats().Peers[2]; st.Dropped != 0 {
				b.Fatalf("dropped %d", st.Dropped)
			}
		})
	}
}

// TestInboundCutsReconnectBackoff: a member that comes up and connects to
// us ends our writer's reconnect backoff to it, so we connect back at
// once, not at the end of a wait that here is at least 5 s.
func TestInboundCutsReconnectBackoff(t *testing.T) {
	checkGoroutines(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr2 := ln.Addr().String()
	_ = ln.Close() // nothing listens there until node 2 starts
	n1 := startNode(t, 1, map[uint64]string{2: addr2}, func(c *Config) { c.BackoffMin, c.BackoffMax = 10*time.Second, 10*time.Second })
	testkit.Eventually(t, waitFor, "node 1's first dial to node 2 fails", func() bool { return n1.rep.unreachableCount(2) > 0 })
	start := time.Now()
	n2 := startNode(t, 2, map[uint64]string{1: n1.addr()}, func(c *Config) { c.Listen = addr2 })
	testkit.Eventually(t, 4*time.Second, "node 1 connected to node 2 before its backoff ended", connected(n1, 2))
	if took := time.Since(start); took >= 5*time.Second {
		t.Fatalf("node 1 connected after %v: the backoff ran out", took)
	}
	n1.tr.Send([]raftpb.Message{heartbeat(1, 2, 1)})
	testkit.Eventually(t, waitFor, "delivery to node 2", func() bool { return n2.in.len() == 1 })
}
