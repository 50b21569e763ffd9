package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/sdk"
)

const testTickMS, testElectionTicks = 20, 10

// electionTimeout is the configured base election timeout of test nodes.
const electionTimeout = testTickMS * testElectionTicks * time.Millisecond

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// testCluster is n in-process nodes on 127.0.0.1.
type testCluster struct {
	t     testing.TB
	cfgs  []Config
	nodes []*Daemon
}

func newCluster(t testing.TB, n int, tweak func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t}
	var members, routes []string
	peerAddrs := make([]string, n)
	clusterAddrs := make([]string, n)
	for i := 0; i < n; i++ {
		peerAddrs[i] = freeAddr(t)
		clusterAddrs[i] = freeAddr(t)
		members = append(members, fmt.Sprintf("%d=%s", i+1, peerAddrs[i]))
		routes = append(routes, clusterAddrs[i])
	}
	for i := 0; i < n; i++ {
		cfg := Defaults()
		cfg.ID = uint64(i + 1)
		cfg.Data = t.TempDir()
		cfg.NATSListen = freeAddr(t)
		cfg.NATSClusterListen = clusterAddrs[i]
		cfg.NATSRoutes = strings.Join(routes, ",")
		cfg.PeerListen = peerAddrs[i]
		cfg.PeerSecret = "test-cluster-secret-0123456789"
		cfg.InitialCluster = strings.Join(members, ",")
		cfg.TickMS = testTickMS
		cfg.ElectionTicks = testElectionTicks
		if tweak != nil {
			tweak(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	c.nodes = make([]*Daemon, n)
	for i := range c.cfgs {
		c.start(i)
	}
	t.Cleanup(func() {
		for _, d := range c.nodes {
			if d != nil {
				d.Close()
			}
		}
	})
	return c
}

func (c *testCluster) start(i int) {
	c.t.Helper()
	d, err := Start(context.Background(), c.cfgs[i], Options{Logger: quietLogger()})
	if err != nil {
		c.t.Fatalf("start node %d: %v", i+1, err)
	}
	c.nodes[i] = d
}

func (c *testCluster) stop(i int) {
	c.nodes[i].Close()
	c.nodes[i] = nil
}

// leader waits for exactly one ready leader among running nodes.
func (c *testCluster) leader(within time.Duration) int {
	c.t.Helper()
	idx := -1
	waitFor(c.t, within, "a ready leader", func() bool {
		idx = -1
		for i, d := range c.nodes {
			if d != nil && d.Locks().IsLeader() {
				if idx >= 0 {
					return false
				}
				idx = i
			}
		}
		return idx >= 0
	})
	return idx
}

func (c *testCluster) follower(leader int) int {
	for i, d := range c.nodes {
		if i != leader && d != nil {
			return i
		}
	}
	c.t.Fatal("no follower running")
	return -1
}

// converged waits until every running node has applied the same index
// and holds the same digest.
func (c *testCluster) converged(within time.Duration) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			for i, d := range c.nodes {
				if d != nil {
					n := d.Node()
					st := n.Status()
					var locks int
					var digest [32]byte
					n.View(func(m *core.Machine) { locks, digest = m.Len(), m.Digest() })
					c.t.Logf("node %d: state %s term %d commit %d applied %d locks %d digest %x err %v",
						i+1, st.RaftState, st.Term, st.Commit, n.AppliedIndex(), locks, digest[:6], n.Err())
				}
			}
		}
	}()
	waitFor(c.t, within, "identical lock tables", func() bool {
		var first [32]byte
		var firstApplied uint64
		seen := false
		for _, d := range c.nodes {
			if d == nil {
				continue
			}
			applied, sum, _ := digest(d)
			if !seen {
				first, firstApplied, seen = sum, applied, true
			} else if sum != first || applied != firstApplied {
				return false
			}
		}
		return true
	})
}

// TestClusterFailover: locks taken through a follower survive the
// leader's death with their tokens; a new leader serves within two
// election timeouts; leases still expire by committed Expire; tokens keep
// increasing; the dead node catches up by snapshot with an identical table.
func TestClusterFailover(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.SnapshotEntries = 40
		cfg.CompactKeep = 10
	})
	lead := c.leader(10 * time.Second)
	fol := c.follower(lead)
	_, cl := connect(t, c.nodes[fol])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	held := map[string]uint64{}
	var maxToken uint64
	for i := 0; i < 5; i++ {
		key := fmt.Sprintf("keep/%d", i)
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("acquire through follower: %v", err)
		}
		if l.Token <= maxToken {
			t.Fatalf("token %d not above %d", l.Token, maxToken)
		}
		maxToken = l.Token
		held[key] = l.Token
	}
	short, err := cl.Acquire(ctx, "short", sdk.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	maxToken = short.Token
	c.converged(10 * time.Second)

	// Kill the leader (its data stays for the restart).
	killed := lead
	c.stop(killed)
	killedAt := time.Now()
	// The client keeps going: the SDK retries while there is no leader.
	l, err := cl.Acquire(ctx, "after-failover", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatalf("acquire after failover: %v", err)
	}
	if took := time.Since(killedAt); took > 2*(2*electionTimeout)+time.Second {
		// Randomised election timeouts reach 2× the base; allow two of
		// those plus scheduling slack on a 2-core machine.
		t.Fatalf("clients resumed after %v", took)
	}
	t.Logf("clients resumed %v after the leader died", time.Since(killedAt))
	if l.Token <= maxToken {
		t.Fatalf("token %d after failover not above %d", l.Token, maxToken)
	}
	maxToken = l.Token
	for key, tok := range held {
		h, err := cl.Get(ctx, key)
		if err != nil || !h.Held || h.Token != tok {
			t.Fatalf("%s after failover: %+v %v, want token %d", key, h, err, tok)
		}
	}
	// The short lease still ends by a committed Expire on the new leader.
	newLead := c.leader(5 * time.Second)
	waitFor(t, 10*time.Second, "short lease expired", func() bool {
		return counterValue(t, c.nodes[newLead], "ticketd_expiries_total", "existed", "true") >= 1
	})
	if h, err := cl.Get(ctx, "short"); err != nil || h.Held {
		t.Fatalf("short after expiry: %+v %v", h, err)
	}

	// Push the log well past the snapshot interval while the node is down,
	// so it can only catch up from a snapshot.
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("churn/%d", i%7)
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= maxToken {
			t.Fatalf("token %d not above %d", l.Token, maxToken)
		}
		maxToken = l.Token
		if err := cl.Release(ctx, key, l.Token); err != nil {
			t.Fatal(err)
		}
	}
	c.start(killed)
	c.converged(20 * time.Second)
	if sent := c.nodes[newLead].Peers().Stats().Peers[uint64(killed+1)].SnapshotsSent; sent == 0 {
		t.Fatalf("restarted node caught up without a snapshot; the test did not exercise snapshot catch-up")
	}
}

// TestIsolatedFollowerNeverAnswers: a follower cut off from its peers
// refuses lock requests (it never serves from its own state), and a
// leader that loses its quorum steps down.
func TestIsolatedFollowerNeverAnswers(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader(10 * time.Second)
	fol := c.follower(lead)
	_, cl := connect(t, c.nodes[lead])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Minute)); err != nil {
		t.Fatal(err)
	}
	c.converged(5 * time.Second)

	isolate := func(i int) {
		id := uint64(i + 1)
		for _, d := range c.nodes {
			d.Peers().SetFilter(func(from, to uint64) bool { return from != id && to != id })
		}
	}
	heal := func() {
		for _, d := range c.nodes {
			d.Peers().SetFilter(nil)
		}
	}
	isolate(fol)
	srv := c.nodes[fol].Locks()
	for i := 0; i < 20; i++ {
		_, err := srv.Acquire(ctx, acquireParams("iso", time.Second))
		var nl *lockservice.NotLeaderError
		if !errors.As(err, &nl) {
			t.Fatalf("isolated follower answered acquire: %v", err)
		}
		if _, err := srv.Get(ctx, "k"); !errors.As(err, &nl) {
			t.Fatalf("isolated follower answered get: %v", err)
		}
	}
	// The rest of the cluster keeps serving.
	if _, err := cl.Acquire(ctx, "k2", sdk.WithLease(time.Minute)); err != nil {
		t.Fatalf("majority stopped serving: %v", err)
	}
	heal()
	c.converged(10 * time.Second)

	// Now cut off the leader: CheckQuorum makes it step down, and a waiter
	// queued on it gets a retryable error at once, not a silent hang.
	lead = c.leader(5 * time.Second)
	waiterErr := make(chan error, 1)
	leaderSrv := c.nodes[lead].Locks()
	go func() {
		p := acquireParams("k", time.Second)
		p.Wait, p.Timeout = 20*time.Second, 25*time.Second
		_, err := leaderSrv.Acquire(ctx, p)
		waiterErr <- err
	}()
	waitFor(t, 5*time.Second, "waiter queued on the leader", func() bool {
		return gaugeValue(t, c.nodes[lead], "ticketd_waiters") == 1
	})
	isolate(lead)
	cutAt := time.Now()
	waitFor(t, 10*electionTimeout, "isolated leader steps down", func() bool {
		return !c.nodes[lead].Locks().IsLeader()
	})
	t.Logf("isolated leader stepped down after %v", time.Since(cutAt))
	select {
	case err := <-waiterErr:
		// Retryable: this node certainly proposed nothing for it.
		var nl *lockservice.NotLeaderError
		if !errors.As(err, &nl) && !errors.Is(err, lockservice.ErrShuttingDown) {
			t.Fatalf("queued waiter got %v, want a retryable error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("queued waiter still hanging after its leader stepped down")
	}
	if _, err := c.nodes[lead].Locks().Acquire(ctx, acquireParams("x", time.Second)); err == nil {
		t.Fatal("deposed leader granted a lock")
	}
	waitFor(t, 10*electionTimeout, "majority elects a new leader", func() bool {
		for i, d := range c.nodes {
			if i != lead && d.Locks().IsLeader() {
				return true
			}
		}
		return false
	})
	heal()
	c.converged(10 * time.Second)
}
