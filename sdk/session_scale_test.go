package sdk_test

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// TestSessionScaleFigure is opt-in (TICKETD_SESSION_SCALE=1): issue 24
// item 5. On a three-node in-process cluster it measures three phases:
// nothing held (the baseline), S sessions holding L locks each kept alive,
// and the same S*L locks held with per-lock auto-renew. Each phase has a
// quiet window (only the holding: what keepalives or renewals cost) and a
// loaded window beside which 16 clients run try-acquire+release cycles on
// keys of their own (the p99 of their acquires). For each window it
// reports the leader's raft entries per second, the leader's ReadIndex
// rounds and reads per second, and the CPU of the whole test process per
// second: every node, the NATS servers and the clients share it, so the
// cost of the holding is the phase's CPU minus the baseline's, an upper
// bound of what the nodes spend on it (the clients' keepalive and renew
// loops are in it too). Sizes: TICKETD_SESSION_SCALE_SESSIONS (default
// 1000), _LOCKS (per session, default 10), _SECONDS (each holding phase,
// split evenly between its quiet and loaded windows; default 30),
// _TTL_SECONDS (the session TTL and the auto-renew lease, default 10; the
// SDK keeps alive every (TTL - margin)/3, margin a tenth of the TTL up to
// 1 s), and _RENEW=0 skips the auto-renew phase. With
// TICKETD_SESSION_SCALE_PROFILE=<prefix> each quiet window writes a CPU
// profile to <prefix>-<window>.pprof: the process's CPU split between the
// nodes' code and the clients' (sdk, nats.go).
func TestSessionScaleFigure(t *testing.T) {
	if os.Getenv("TICKETD_SESSION_SCALE") == "" {
		t.Skip("opt-in: TICKETD_SESSION_SCALE=1")
	}
	num := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv("TICKETD_SESSION_SCALE_" + name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	sessions, perSession, seconds := num("SESSIONS", 1000), num("LOCKS", 10), num("SECONDS", 30)
	window := time.Duration(max(seconds/2, 1)) * time.Second
	// The daemon's default ticks (100 ms, election after 10), not the
	// tests' fast ones: on a loaded machine the 200 ms election timeout of
	// the tests moves the leader during the windows, and users run the
	// defaults.
	if testing.Short() {
		t.Skip("in-process cluster skipped in -short mode")
	}
	def := daemon.Defaults()
	c := testcluster.New(t, 3, testcluster.WithTicks(def.TickMS, def.ElectionTicks))
	lead := c.Leader(30 * time.Second)
	testkit.Eventually(t, 30*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	cl := client(t, c, lead)
	loadCl := client(t, c, lead) // the acquire load has its own connection, as another service would
	ctx := t.Context()
	ttl := time.Duration(num("TTL_SECONDS", 10)) * time.Second
	var figures []scaleFigure
	measure := func(phase string, loaded bool, d time.Duration) {
		leader := c.Leader(10 * time.Second) // the one the entries are counted on
		node := c.Node(leader).Node()
		startIdx, startCPU, start := node.AppliedIndex(), processCPU(t), time.Now()
		rounds0, reads0 := readIndexRounds(c)
		f := scaleFigure{phase: phase, loaded: loaded}
		stopProfile := profileWindow(t, len(figures), loaded)
		if loaded {
			f.load = acquireLoad(ctx, loadCl, len(figures), d)
		} else {
			time.Sleep(d) // the measured window: nothing to wait for
		}
		el := time.Since(start).Seconds()
		stopProfile()
		rounds, reads := readIndexRounds(c)
		f.entries = float64(node.AppliedIndex()-startIdx) / el
		f.cpu = (processCPU(t) - startCPU).Seconds() / el
		f.rounds, f.reads = float64(rounds-rounds0)/el, float64(reads-reads0)/el
		f.seconds = el
		f.loadavg = loadAverage()
		if now := c.Leader(10 * time.Second); now != leader {
			f.leaderMoved = true
		}
		t.Log(f)
		figures = append(figures, f)
	}
	defer func() {
		t.Log("| phase | load | raft entries/s | ReadIndex rounds/s (reads/s) | process CPU s/s | acquires | p50 | p99 | errors |")
		t.Log("|---|---|---|---|---|---|---|---|---|")
		for _, f := range figures {
			t.Log(f.row())
		}
	}()

	baseline := "nothing held"
	measure(baseline, false, min(window, 30*time.Second))
	measure(baseline, true, window)

	var ss []*sdk.Session
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	opened := time.Now()
	for i := 0; i < sessions; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(ttl))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ss = append(ss, s)
			mu.Unlock()
			for j := 0; j < perSession; j++ {
				if _, err := s.Acquire(ctx, fmt.Sprintf("s/%d/%d", i, j)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("opened %d sessions holding %d locks in %v", len(ss), sessions*perSession, time.Since(opened).Round(time.Millisecond))
	phase := fmt.Sprintf("%d sessions x %d locks (TTL %v)", sessions, perSession, ttl)
	measure(phase, false, window)
	measure(phase, true, window)
	ended := 0
	for _, s := range ss {
		select {
		case <-s.Done():
			ended++
			if ended == 1 {
				t.Errorf("session %s ended: %v", s.ID, s.Err())
			}
		default:
		}
	}
	if ended > 0 {
		t.Errorf("%d of %d sessions ended while kept alive", ended, len(ss))
	}
	for _, s := range ss {
		_, _ = s.Close(ctx)
	}
	if os.Getenv("TICKETD_SESSION_SCALE_RENEW") == "0" {
		return
	}

	// The same locks with per-lock auto-renew. At full size that is more
	// renewals than an in-process cluster on a small machine may carry:
	// what fails is counted and reported, not fatal.
	// Acquiring stops after acquireFor: the renewals of the locks already
	// held may take all the cluster has.
	const acquireFor = 2 * time.Minute
	var locks []*sdk.Lock
	var failed atomic.Int64
	acquired := time.Now()
	actx, acancel := context.WithTimeout(ctx, acquireFor)
	defer acancel()
	for i := 0; i < sessions*perSession && actx.Err() == nil; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			l, err := cl.Acquire(actx, fmt.Sprintf("l/%d", i), sdk.WithLease(ttl), sdk.WithAutoRenew())
			if err != nil {
				if failed.Add(1) == 1 {
					t.Logf("auto-renew acquire: %v", err)
				}
				return
			}
			mu.Lock()
			locks = append(locks, l)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("acquired %d of %d locks with auto-renew in %v (%d acquires failed)", len(locks), sessions*perSession, time.Since(acquired).Round(time.Millisecond), failed.Load())
	phase = fmt.Sprintf("%d locks with auto-renew (lease %v)", len(locks), ttl)
	measure(phase, false, window)
	measure(phase, true, window)
	lost := 0
	for _, l := range locks {
		select {
		case <-l.Lost():
			lost++
		default:
		}
	}
	t.Logf("auto-renew: %d of %d locks lost while renewed", lost, len(locks))
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, l := range locks {
		_ = l.Release(rctx)
	}
}

// readIndexRounds sums the ReadIndex rounds and reads of every node (only
// a leader serves them; the sum counts them across a change of leader).
func readIndexRounds(c *testcluster.Cluster) (rounds, reads uint64) {
	for _, d := range c.Nodes() {
		r, n := d.Node().ReadIndexRounds()
		rounds, reads = rounds+r, reads+n
	}
	return rounds, reads
}

// scaleFigure is one measured window of TestSessionScaleFigure.
type scaleFigure struct {
	phase         string
	loaded        bool
	seconds       float64
	entries       float64 // leader's applied entries per second
	rounds, reads float64 // leader's ReadIndex rounds and reads per second
	cpu           float64 // process CPU seconds per second
	load          loadResult
	leaderMoved   bool   // the leader changed during the window
	loadavg       string // the machine's 1-minute load average at the window's end
}

func (f scaleFigure) String() string {
	s := fmt.Sprintf("%s, %s: %.0f raft entries/s, %.0f ReadIndex rounds/s for %.0f reads/s, %.3f CPU s/s (whole process) over %.0fs",
		f.phase, f.loadName(), f.entries, f.rounds, f.reads, f.cpu, f.seconds)
	if f.loaded {
		s += fmt.Sprintf("; 16-client acquires: %d, p50 %v, p99 %v, %d errors", f.load.n, f.load.p50, f.load.p99, f.load.errors)
	}
	if f.leaderMoved {
		s += " (the leader changed during the window)"
	}
	return s + "; load average " + f.loadavg
}

func (f scaleFigure) loadName() string {
	if f.loaded {
		return "16-client acquire load"
	}
	return "quiet"
}

func (f scaleFigure) row() string {
	phase := f.phase
	if f.leaderMoved {
		phase += " (leader changed)"
	}
	r := fmt.Sprintf("| %s | %s | %.0f | %.0f (%.0f) | %.3f |", phase, f.loadName(), f.entries, f.rounds, f.reads, f.cpu)
	if !f.loaded {
		return r + " | | | |"
	}
	return r + fmt.Sprintf(" %d | %v | %v | %d |", f.load.n, f.load.p50, f.load.p99, f.load.errors)
}

// loadResult is what acquireLoad measured.
type loadResult struct {
	n, errors int
	p50, p99  time.Duration
}

// loadClients is the size of the acquire load beside the holding.
const loadClients = 16

// acquireLoad runs loadClients clients for d, each doing try-acquire and
// release cycles on keys of its own (tag keeps windows apart), and returns the acquire latencies'
// percentiles. Each client stops after d or maxCycles cycles.
func acquireLoad(ctx context.Context, cl *sdk.Client, tag int, d time.Duration) loadResult {
	const maxCycles = 1_000_000
	deadline := time.Now().Add(d)
	lat := make([][]time.Duration, loadClients)
	errs := make([]int, loadClients)
	var wg sync.WaitGroup
	for w := range loadClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxCycles && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				key := fmt.Sprintf("load/%d/%d/%d", tag, w, i%64)
				start := time.Now()
				l, err := cl.Acquire(ctx, key, sdk.WithLease(ttlLoad))
				if err != nil {
					errs[w]++
					continue
				}
				lat[w] = append(lat[w], time.Since(start))
				if err := l.Release(ctx); err != nil {
					errs[w]++
				}
			}
		}()
	}
	wg.Wait()
	var all []time.Duration
	r := loadResult{}
	for w := range loadClients {
		all = append(all, lat[w]...)
		r.errors += errs[w]
	}
	r.n = len(all)
	if r.n == 0 {
		return r
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		return all[min(len(all)-1, int(p*float64(len(all))))].Round(10 * time.Microsecond)
	}
	r.p50, r.p99 = pct(0.50), pct(0.99)
	return r
}

// ttlLoad is the lease of the acquire load's locks (each is released at
// once).
const ttlLoad = 10 * time.Second

// profileWindow starts a CPU profile of window n when
// TICKETD_SESSION_SCALE_PROFILE names a file prefix and the window is
// quiet, and returns what stops it.
func profileWindow(t *testing.T, n int, loaded bool) (stop func()) {
	prefix := os.Getenv("TICKETD_SESSION_SCALE_PROFILE")
	if prefix == "" || loaded {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s-%d.pprof", prefix, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}

// loadAverage is the machine's 1-minute load average, "?" where
// /proc/loadavg cannot be read: the machine is shared, so every figure
// goes with it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// processCPU is the process's user + system CPU time so far.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
