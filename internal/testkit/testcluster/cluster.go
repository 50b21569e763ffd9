package testcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// peerSecret is the peer secret every node of a cluster shares.
const peerSecret = "test-cluster-secret-0123456789"

// Option changes how New builds a cluster.
type Option func(*settings)

type settings struct {
	tickMS, electionTicks int
	config                func(i int, cfg *daemon.Config)
	options               func(i int, o *daemon.Options)
	unstarted             bool
}

// WithTicks sets the raft tick and the election timeout in ticks
// (default testkit.TickMS and testkit.ElectionTicks).
func WithTicks(tickMS, electionTicks int) Option {
	return func(s *settings) { s.tickMS, s.electionTicks = tickMS, electionTicks }
}

// WithConfig changes node i's config after New has filled it in.
func WithConfig(f func(i int, cfg *daemon.Config)) Option {
	return func(s *settings) { s.config = f }
}

// WithOptions changes the daemon.Options node i starts with, every time it
// starts. The default is a quiet logger and nothing else.
func WithOptions(f func(i int, o *daemon.Options)) Option {
	return func(s *settings) { s.options = f }
}

// Unstarted makes New return with every node stopped; the caller starts
// them with Start in the order it needs.
func Unstarted() Option {
	return func(s *settings) { s.unstarted = true }
}

// Cluster is n in-process nodes; node i (0-based) has raft id i+1 unless
// a config tweak says otherwise.
type Cluster struct {
	t        testing.TB
	dir      string
	election time.Duration
	options  func(i int, o *daemon.Options)

	// mu guards cfgs and nodes: Start, Stop and the readers may run on
	// different goroutines.
	mu    sync.Mutex
	cfgs  []daemon.Config
	nodes []*daemon.Daemon // nil while stopped
}

// New builds an n-node cluster, starts every node in order (unless
// Unstarted) and closes the nodes at cleanup. It fails the test if a node
// does not start.
func New(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	s := settings{tickMS: testkit.TickMS, electionTicks: testkit.ElectionTicks}
	for _, o := range opts {
		o(&s)
	}
	c := &Cluster{
		t:        t,
		dir:      t.TempDir(),
		election: time.Duration(s.tickMS*s.electionTicks) * time.Millisecond,
		options:  s.options,
		nodes:    make([]*daemon.Daemon, n),
	}
	peers := testkit.FreeAddrs(t, n)
	routes := testkit.FreeAddrs(t, n)
	clients := testkit.FreeAddrs(t, n)
	var members []string
	for i := 0; i < n; i++ {
		members = append(members, fmt.Sprintf("%d=%s", i+1, peers[i]))
	}
	for i := 0; i < n; i++ {
		cfg := daemon.Defaults()
		cfg.ID = uint64(i + 1)
		cfg.Data = filepath.Join(c.dir, fmt.Sprintf("node%d", i+1))
		cfg.NATSListen = clients[i]
		cfg.NATSClusterListen = routes[i]
		cfg.NATSRoutes = strings.Join(routes, ",")
		cfg.PeerListen = peers[i]
		cfg.PeerSecret = peerSecret
		cfg.InitialCluster = strings.Join(members, ",")
		// Creating the cluster; a restart finds raft state and ignores it.
		cfg.InitialClusterState = daemon.ClusterStateNew
		cfg.TickMS = s.tickMS
		cfg.ElectionTicks = s.electionTicks
		if s.config != nil {
			s.config(i, &cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	t.Cleanup(c.Close)
	if !s.unstarted {
		for i := range c.cfgs {
			if err := c.Start(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}

// Size is the number of nodes, running or not.
func (c *Cluster) Size() int { return len(c.cfgs) }

// Dir is the directory that holds every node's data directory.
func (c *Cluster) Dir() string { return c.dir }

// ElectionTimeout is the configured base election timeout.
func (c *Cluster) ElectionTimeout() time.Duration { return c.election }

// Config is the config node i starts with.
func (c *Cluster) Config(i int) daemon.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfgs[i]
}

// UpdateConfig changes the config node i starts with from its next Start
// on.
func (c *Cluster) UpdateConfig(i int, f func(cfg *daemon.Config)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.cfgs[i])
}

// ClientURL is node i's NATS client URL; it stays the same across
// restarts.
func (c *Cluster) ClientURL(i int) string { return "nats://" + c.Config(i).NATSListen }

// Node is node i, or nil while it is stopped.
func (c *Cluster) Node(i int) *daemon.Daemon {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Nodes is every node at this moment, nil for those stopped.
func (c *Cluster) Nodes() []*daemon.Daemon {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*daemon.Daemon(nil), c.nodes...)
}

// Start starts node i on its config (again on the same data after Stop).
// It does nothing if the node runs.
func (c *Cluster) Start(i int) error {
	c.mu.Lock()
	cfg, running := c.cfgs[i], c.nodes[i] != nil
	c.mu.Unlock()
	if running {
		return nil
	}
	opts := daemon.Options{Logger: testkit.QuietLogger()}
	if c.options != nil {
		c.options(i, &opts)
	}
	// Start's context bounds start-up only; the node runs until Close.
	d, err := daemon.Start(context.Background(), cfg, opts)
	if err != nil {
		return fmt.Errorf("start node %d: %w", i+1, err)
	}
	c.mu.Lock()
	c.nodes[i] = d
	c.mu.Unlock()
	return nil
}

// Stop closes node i and keeps its data.
func (c *Cluster) Stop(i int) error {
	c.mu.Lock()
	d := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if d == nil {
		return fmt.Errorf("node %d is not running", i+1)
	}
	d.Close()
	return nil
}

// Close stops every running node, all at once.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for i := range c.cfgs {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Stop(i) }()
	}
	wg.Wait()
}

// Leader waits until exactly one running node is a ready leader serving
// the lock subjects and returns its index.
func (c *Cluster) Leader(within time.Duration) int {
	c.t.Helper()
	idx := -1
	testkit.Eventually(c.t, within, "a ready leader", func() bool {
		idx = -1
		for i, d := range c.Nodes() {
			if d != nil && d.Locks().IsLeader() && d.API().Serving() {
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

// Follower is the first running node that is not leader.
func (c *Cluster) Follower(leader int) int {
	c.t.Helper()
	for i, d := range c.Nodes() {
		if i != leader && d != nil {
			return i
		}
	}
	c.t.Fatal("no follower running")
	return -1
}

// Converged waits until every running node has applied the same index
// and holds the same lock-table digest. On failure it logs each node's
// raft state, applied index, lock count and digest.
func (c *Cluster) Converged(within time.Duration) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			c.logNodes()
		}
	}()
	testkit.Eventually(c.t, within, "identical lock tables", func() bool {
		var first State
		seen := false
		for _, d := range c.Nodes() {
			if d == nil {
				continue
			}
			st := StateOf(d)
			if !seen {
				first, seen = st, true
			} else if st.Digest != first.Digest || st.Applied != first.Applied {
				return false
			}
		}
		return true
	})
}

func (c *Cluster) logNodes() {
	for i, d := range c.Nodes() {
		if d == nil {
			continue
		}
		n := d.Node()
		st := n.Status()
		var locks int
		var digest [32]byte
		n.View(func(m *core.Machine) { locks, digest = m.Len(), m.Digest() })
		c.t.Logf("node %d: state %s term %d commit %d applied %d locks %d digest %x err %v",
			i+1, st.RaftState, st.Term, st.Commit, n.AppliedIndex(), locks, digest[:6], n.Err())
	}
}

// State is what tests compare across replicas: the applied index, the
// lock-table digest and the last token issued.
type State struct {
	Applied   uint64
	Digest    [32]byte
	LastToken uint64
}

// StateOf reads d's replicated state.
func StateOf(d *daemon.Daemon) State {
	var st State
	// The index of the state read, not AppliedIndex, which may lag it
	// while a Ready's write is in flight (raftstore.Node.ViewIndexed).
	d.Node().ViewIndexed(func(m *core.Machine, index uint64) {
		st.Applied, st.Digest, st.LastToken = index, m.Digest(), m.LastToken()
	})
	return st
}

// Settled reports whether d is the ready leader, serves the lock
// subjects (natsapi: only the leader subscribes to them) and has raised the
// cluster version to the newest its binary reads, which a new leader does
// by itself shortly after it is elected, and from version 3 on holds a
// fence signing key, which the leader makes right after: tests that count
// applied indexes wait for it so that neither entry lands in their middle.
func Settled(d *daemon.Daemon) bool {
	var v uint64
	var fenced bool
	d.Node().View(func(m *core.Machine) {
		v = m.ClusterVersion()
		_, fenced = m.CurrentFenceKey()
	})
	return d.Locks().IsLeader() && d.API().Serving() && v == core.MaxClusterVersion && (v < 3 || fenced)
}
