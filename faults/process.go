package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// buildBinary builds ./cmd/ticketd into dir.
func buildBinary(dir string) (string, error) {
	bin := filepath.Join(dir, "ticketd")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/ticketd/ticketd/cmd/ticketd")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/ticketd: %v\n%s", err, out)
	}
	return bin, nil
}

// procCluster runs real `ticketd serve` processes on 127.0.0.1. Every
// raft link a -> b goes through a proxy owned by the harness: node a's
// --initial-cluster names the proxy as b's address. Crashes are kill -9
// (and restart on the same data), pauses SIGSTOP/SIGCONT, partitions cut
// proxies. The embedded NATS servers route to each other directly, so
// clients always reach some node; only raft traffic is partitioned.
type procCluster struct {
	bin, dir string
	n        int
	election time.Duration
	env      []string
	args     [][]string
	nats     []string
	proxies  map[[2]int]*proxy
	nc       *nats.Conn
	client   *sdk.Client // status requests to one named node

	mu    sync.Mutex
	procs []*proc
	exits []string
}

type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	killed bool // guarded by procCluster.mu
	paused bool // guarded by procCluster.mu
}

// mustStartProcesses builds ticketd and starts an n-node cluster of it
// with its data under dir, failing t if either fails; the caller closes it.
func mustStartProcesses(t testing.TB, dir string, n int) *procCluster {
	t.Helper()
	bin, err := buildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := startProcesses(t, bin, dir, n)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startProcesses(t testing.TB, bin, dir string, n int) (_ *procCluster, err error) {
	const tickMS, electionTicks = 50, 10
	peers := testkit.FreeAddrs(t, n)
	routes := testkit.FreeAddrs(t, n)
	natsAddrs := testkit.FreeAddrs(t, n)
	c := &procCluster{
		bin: bin, dir: dir, n: n,
		election: tickMS * electionTicks * time.Millisecond,
		env:      append(childEnv(), "TICKETD_PEER_SECRET=faults-process-secret-0123456789"),
		nats:     natsAddrs,
		proxies:  map[[2]int]*proxy{},
		procs:    make([]*proc, n),
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	for from := 0; from < n; from++ {
		for to := 0; to < n; to++ {
			if from == to {
				continue
			}
			p, err := newProxy(peers[to])
			if err != nil {
				return nil, err
			}
			c.proxies[[2]int{from, to}] = p
		}
	}
	for i := 0; i < n; i++ {
		var members []string
		for j := 0; j < n; j++ {
			addr := peers[j]
			if j != i {
				addr = c.proxies[[2]int{i, j}].addr()
			}
			members = append(members, fmt.Sprintf("%d=%s", j+1, addr))
		}
		c.args = append(c.args, []string{
			"serve",
			"--id", fmt.Sprint(i + 1),
			"--data", filepath.Join(dir, fmt.Sprintf("node%d", i+1)),
			"--nats-listen", natsAddrs[i],
			"--nats-cluster-listen", routes[i],
			"--nats-routes", strings.Join(routes, ","),
			"--peer-listen", peers[i],
			"--initial-cluster", strings.Join(members, ","), "--initial-cluster-state", "new",
			"--tick-ms", fmt.Sprint(tickMS),
			"--election-ticks", fmt.Sprint(electionTicks),
			"--snapshot-entries", "300",
			"--compact-keep", "50",
			"--log-level", "info",
		})
	}
	for i := 0; i < n; i++ {
		if err := c.start(i); err != nil {
			return nil, err
		}
	}
	c.nc, err = nats.Connect(strings.Join(c.clientURLs(), ","),
		nats.Name("ticketd-faults-harness"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
		nats.PingInterval(300*time.Millisecond),
		nats.MaxPingsOutstanding(2),
		nats.NoCallbacksAfterClientClose(),
		quietNATS(),
	)
	if err != nil {
		return nil, fmt.Errorf("harness NATS connection: %w", err)
	}
	if c.client, err = sdk.New(c.nc); err != nil {
		return nil, fmt.Errorf("harness status client: %w", err)
	}
	return c, nil
}

// childEnv is this process's environment without TICKETD_* variables:
// ticketd serve reads TICKETD_* as configuration and rejects unknown
// keys (the harness's own TICKETD_FAULTS_* among them).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETD_") {
			env = append(env, kv)
		}
	}
	return env
}

func (c *procCluster) start(i int) error {
	logf, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("node%d.log", i+1)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== harness: starting node %d at %s\n", i+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, c.args[i]...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start node %d: %w", i+1, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	c.mu.Lock()
	c.procs[i] = p
	c.mu.Unlock()
	go func() {
		werr := cmd.Wait()
		_ = logf.Close()
		c.mu.Lock()
		if !p.killed {
			c.exits = append(c.exits, fmt.Sprintf("node %d exited on its own: %v (log %s)", i+1, werr, logf.Name()))
		}
		c.mu.Unlock()
		close(p.done)
	}()
	return nil
}

func (c *procCluster) size() int                      { return c.n }
func (c *procCluster) electionTimeout() time.Duration { return c.election }

func (c *procCluster) clientURLs() []string {
	out := make([]string, c.n)
	for i, a := range c.nats {
		out[i] = "nats://" + a
	}
	return out
}

func (c *procCluster) proc(i int) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[i]
}

func (c *procCluster) running(i int) bool {
	p := c.proc(i)
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (c *procCluster) isPaused(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[i] != nil && c.procs[i].paused
}

func (c *procCluster) leader() int {
	best, term := -1, uint64(0)
	for i := 0; i < c.n; i++ {
		if !c.running(i) || c.isPaused(i) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		st, err := c.status(ctx, i)
		cancel()
		if err != nil || st.State != "StateLeader" {
			continue
		}
		if best < 0 || st.Term > term {
			best, term = i, st.Term
		}
	}
	return best
}

// crash is kill -9.
func (c *procCluster) crash(i int) error { return c.kill(i, syscall.SIGKILL) }

// stop is SIGTERM: a leader hands leadership over before it exits.
func (c *procCluster) stop(i int) error { return c.kill(i, syscall.SIGTERM) }

// kill sends sig to node i and waits until it exited.
func (c *procCluster) kill(i int, sig syscall.Signal) error {
	c.mu.Lock()
	p := c.procs[i]
	if p != nil {
		p.killed = true
	}
	c.mu.Unlock()
	if p == nil {
		return fmt.Errorf("node %d was never started", i+1)
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%v to node %d: %w", sig, i+1, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("node %d did not exit 10s after %v", i+1, sig)
	}
}

func (c *procCluster) restart(i int) error {
	if c.running(i) {
		return nil
	}
	return c.start(i)
}

func (c *procCluster) signal(i int, sig syscall.Signal, paused bool) error {
	c.mu.Lock()
	p := c.procs[i]
	if p == nil || p.paused == paused {
		c.mu.Unlock()
		return nil
	}
	p.paused = paused
	c.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to node %d: %w", sig, i+1, err)
	}
	return nil
}

func (c *procCluster) pause(i int) error  { return c.signal(i, syscall.SIGSTOP, true) }
func (c *procCluster) resume(i int) error { return c.signal(i, syscall.SIGCONT, false) }

func (c *procCluster) jump(int, time.Duration) error { return errUnsupported }
func (c *procCluster) blackholes() bool              { return true }

func (c *procCluster) setLinks(allow func(from, to int) bool, mode linkMode) {
	for k, p := range c.proxies {
		switch {
		case allow == nil || allow(k[0], k[1]):
			p.set(proxyPass)
		case mode == linkBlackhole:
			p.set(proxyBlackhole)
		default:
			p.set(proxyDrop)
		}
	}
}

func (c *procCluster) status(ctx context.Context, i int) (sdk.Status, error) {
	st, err := c.client.NodeStatus(ctx, uint64(i+1))
	if err != nil {
		return sdk.Status{}, err
	}
	return *st, nil
}

func (c *procCluster) unexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.exits...)
}

func (c *procCluster) close() {
	for i := 0; i < c.n; i++ {
		c.mu.Lock()
		p := c.procs[i]
		if p != nil {
			p.killed = true
		}
		c.mu.Unlock()
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
	for _, p := range c.proxies {
		p.close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
}
