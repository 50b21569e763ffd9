package faults

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/transports/protocol"
)

const (
	modeInProcess = "inprocess"
	modeProcess   = "process"
)

// freeAddr returns a 127.0.0.1 port that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// inprocCluster runs daemon.Start nodes in this process. Crashes are
// Close and restart on the same data (a clean stop, not a power cut: the
// process-level driver does kill -9); partitions are peer.Transport
// filters; every node's lease clock is a jumpClock given as Options.Now.
type inprocCluster struct {
	cfgs     []daemon.Config
	logger   *slog.Logger
	election time.Duration

	mu      sync.Mutex
	nodes   []*daemon.Daemon
	closing []bool
	clocks  []*jumpClock
	filter  func(from, to uint64) bool
	exits   []string
}

func startInProcess(dataDir string, n int, logger *slog.Logger, tickMS, electionTicks int) (*inprocCluster, error) {
	peers, err := freeAddrs(n)
	if err != nil {
		return nil, err
	}
	routes, err := freeAddrs(n)
	if err != nil {
		return nil, err
	}
	clients, err := freeAddrs(n)
	if err != nil {
		return nil, err
	}
	var members []string
	for i := 0; i < n; i++ {
		members = append(members, fmt.Sprintf("%d=%s", i+1, peers[i]))
	}
	c := &inprocCluster{
		logger:   logger,
		election: time.Duration(tickMS*electionTicks) * time.Millisecond,
		nodes:    make([]*daemon.Daemon, n),
		closing:  make([]bool, n),
		clocks:   make([]*jumpClock, n),
	}
	for i := 0; i < n; i++ {
		cfg := daemon.Defaults()
		cfg.ID = uint64(i + 1)
		cfg.Data = filepath.Join(dataDir, fmt.Sprintf("node%d", i+1))
		cfg.NATSListen = clients[i]
		cfg.NATSClusterListen = routes[i]
		cfg.NATSRoutes = strings.Join(routes, ",")
		cfg.PeerListen = peers[i]
		cfg.PeerSecret = "faults-harness-secret-0123456789"
		cfg.InitialCluster = strings.Join(members, ",")
		cfg.TickMS = tickMS
		cfg.ElectionTicks = electionTicks
		// Small snapshot intervals: a node that was down catches up
		// from a snapshot, not only from the log.
		cfg.SnapshotEntries = 300
		cfg.CompactKeep = 50
		cfg.LogLevel = "warn"
		c.cfgs = append(c.cfgs, cfg)
		c.clocks[i] = &jumpClock{}
	}
	for i := 0; i < n; i++ {
		if err := c.restart(i); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func (c *inprocCluster) size() int                      { return len(c.cfgs) }
func (c *inprocCluster) electionTimeout() time.Duration { return c.election }

func (c *inprocCluster) clientURLs() []string {
	out := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		out[i] = "nats://" + cfg.NATSListen
	}
	return out
}

func (c *inprocCluster) node(i int) *daemon.Daemon {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

func (c *inprocCluster) running(i int) bool { return c.node(i) != nil }

func (c *inprocCluster) leader() int {
	best, term := -1, uint64(0)
	for i := range c.cfgs {
		d := c.node(i)
		if d == nil || !d.Server().IsLeader() {
			continue
		}
		if t := d.Node().Term(); best < 0 || t > term {
			best, term = i, t
		}
	}
	return best
}

func (c *inprocCluster) crash(i int) error {
	c.mu.Lock()
	d := c.nodes[i]
	c.nodes[i] = nil
	c.closing[i] = true
	c.mu.Unlock()
	if d == nil {
		return fmt.Errorf("node %d is not running", i+1)
	}
	d.Close()
	return nil
}

func (c *inprocCluster) restart(i int) error {
	if c.running(i) {
		return nil
	}
	// The context passed to Start governs the peer transport for the
	// node's whole life (cancelling it closes the peer listener), so it
	// must not be a start-up timeout.
	d, err := daemon.Start(context.Background(), c.cfgs[i], daemon.Options{Logger: c.logger, Now: c.clocks[i].Now})
	if err != nil {
		return fmt.Errorf("restart node %d: %w", i+1, err)
	}
	c.mu.Lock()
	c.nodes[i] = d
	c.closing[i] = false
	f := c.filter
	c.mu.Unlock()
	if f != nil {
		d.Peers().SetFilter(f)
	}
	go func() {
		<-d.Done()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.nodes[i] == d && !c.closing[i] {
			c.exits = append(c.exits, fmt.Sprintf("node %d: raft loop stopped: %v", i+1, d.Node().Err()))
		}
	}()
	return nil
}

func (c *inprocCluster) setLinks(allow func(from, to int) bool, _ linkMode) {
	var f func(from, to uint64) bool
	if allow != nil {
		f = func(from, to uint64) bool { return allow(int(from)-1, int(to)-1) }
	}
	c.mu.Lock()
	c.filter = f
	nodes := append([]*daemon.Daemon(nil), c.nodes...)
	c.mu.Unlock()
	for _, d := range nodes {
		if d != nil {
			d.Peers().SetFilter(f)
		}
	}
}

func (c *inprocCluster) pause(int) error  { return errUnsupported }
func (c *inprocCluster) resume(int) error { return nil }

func (c *inprocCluster) blackholes() bool { return false }

func (c *inprocCluster) jump(i int, d time.Duration) error {
	c.clocks[i].Jump(d)
	return nil
}

func (c *inprocCluster) status(ctx context.Context, i int) (protocol.StatusReply, error) {
	d := c.node(i)
	if d == nil {
		return protocol.StatusReply{}, fmt.Errorf("node %d is down", i+1)
	}
	return d.Status(ctx), nil
}

func (c *inprocCluster) unexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.exits...)
}

func (c *inprocCluster) close() {
	var wg sync.WaitGroup
	for i := range c.cfgs {
		c.mu.Lock()
		d := c.nodes[i]
		c.nodes[i] = nil
		c.closing[i] = true
		c.mu.Unlock()
		if d != nil {
			wg.Add(1)
			go func() { defer wg.Done(); d.Close() }()
		}
	}
	wg.Wait()
}
