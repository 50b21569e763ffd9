package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestSessionScaleProcesses is issue 24's scale figure (item 5) on real
// processes (opt-in: TICKETD_SESSION_PROC=1; about 30 minutes at full
// size, docs/benchmarks.md "Sessions (issue 24)"):
//
//	TICKETD_SESSION_PROC=1 TICKETD_SESSION_PROC_SESSIONS=10000 \
//	  go test -count=1 -run TestSessionScaleProcesses -timeout 90m -v ./cmd/ticketd/
//
// Three `ticketd serve` processes with the daemon's default ticks and
// fsync on; `ticketd bench hold` holding the locks in its own process; the
// acquire load, `ticketd bench --clients 16 --mode try`, a process of its
// own for each loaded window. Every client talks to the leader's own NATS
// server (found at the start). It measures in windows of
// _WINDOW seconds, each quiet (nothing but the holding) or loaded (the
// 16-client load beside it): the CPU s/s of every node, of the holder and
// of the load, from /proc; raft entries/s (the highest applied index of
// the three); renewals/s (ticketd_renewals_total, which every node counts
// as it applies a renewal: the highest of the three); ReadIndex rounds/s
// and the reads that shared them (ticketd_read_index_rounds_total and
// _reads_total, summed: only the leader issues them); whether the
// leader or the term changed; the holder's acknowledged keepalives (or
// renewals) per second; the load's acquires, p50 and p99. The schedule
// interleaves the baseline (nothing held) with the holding phases:
//
//	baseline (_BASE_ROUNDS x quiet+loaded), then for each kind of _KINDS:
//	open, _ROUNDS x quiet+loaded, close, baseline again
//
// and it prints every window, then per phase the medians and the spread
// (min-max), and the holding's cost above the baseline against the
// issue's goals (node CPU under 0.10 s/s summed over the three nodes, p99
// added under 1 ms). Sizes: TICKETD_SESSION_PROC_SESSIONS (default 1000),
// _LOCKS (per session, default 10), _TTL_SECONDS (the session TTL and the
// auto-renew lease, default 60), _WINDOW (seconds, default 60), _ROUNDS
// (default 5), _BASE_ROUNDS (default 1), _KINDS (default
// "sessions,auto-renew"). TICKETD_SESSION_PROC_PROFILE=DIR saves a CPU
// profile of the leader over each holding phase's first quiet and first
// loaded window (those windows are left out of the medians: profiling
// costs CPU). TICKETD_SESSION_PROC_PAIRS=N (default 0) adds, while the
// sessions are held, N pairs of loaded windows of _PAIR_WINDOW seconds
// (default 15, at most a quarter of the TTL), one with the holder stopped
// (SIGSTOP: no keepalives), and reports what the keepalives add to the
// load's p99 within each pair (pairs).
func TestSessionScaleProcesses(t *testing.T) {
	if os.Getenv("TICKETD_SESSION_PROC") == "" {
		t.Skip("opt-in: TICKETD_SESSION_PROC=1 runs issue 24's scale figure on three real processes (30 minutes at full size; docs/benchmarks.md)")
	}
	cfg := sessionProcConfigFromEnv(t)
	bin := binary(t)
	waitLoadBelow(t, 3, 5*time.Minute)

	const n = 3
	addrs := newProcessAddrs(t, n)
	urls, metrics := addrs.urls, addrs.metrics
	nodes := make([]*proc, n)
	for i := 0; i < n; i++ {
		// The daemon's defaults: ticks, fsync, limits.
		nodes[i] = startServeEnv(t, bin, []string{"TICKETD_PEER_SECRET=process-test-secret-0123"},
			addrs.serveArgs(i, t.TempDir(), "--metrics-listen", metrics[i], "--pprof", "--log-format", "json")...)
	}
	for i := 0; i < n; i++ {
		waitSessions(t, urls[i], i+1)
	}
	// Every client talks to the leader's own NATS server: leader
	// placement then keeps the leader where it is (its own server holds
	// the majority of the requests), and no request crosses a route.
	var lead uint64
	testkit.Eventually(t, time.Minute, "a leader", func() bool {
		st, err := nodeStatus(urls[0], 1)
		lead = st.Leader
		return err == nil && lead >= 1 && lead <= n
	})
	url := urls[lead-1]
	t.Logf("leader %d; the clients use its NATS, %s", lead, url)
	m := &procMeter{t: t, urls: urls, metrics: metrics, nodes: nodes, bin: bin, url: url, cfg: cfg}
	m.runLoad(5 * time.Second) // warm: connections, the first entries
	baseline := func() {
		for range cfg.baseRounds {
			m.window("baseline", false, nil)
			m.window("baseline", true, nil)
		}
	}
	baseline()
	for _, kind := range cfg.kinds {
		h := m.startHolder(kind)
		for r := range cfg.rounds {
			m.window(kind, false, h, r == 0)
			m.window(kind, true, h, r == 0)
		}
		if kind == holdSessions && cfg.pairs > 0 {
			m.pairs(h)
		}
		m.stopHolder(h)
		baseline()
	}
	m.report()
}

// sessionProcConfig is TestSessionScaleProcesses's size.
type sessionProcConfig struct {
	sessions, locks    int
	ttl, window        time.Duration
	rounds, baseRounds int
	kinds              []string
	profileDir         string
	// pairs of loaded windows of pairWindow each, with and without
	// keepalives (pairs).
	pairs      int
	pairWindow time.Duration
}

func sessionProcConfigFromEnv(t *testing.T) sessionProcConfig {
	t.Helper()
	num := func(name string, def, lo, hi int) int {
		v := os.Getenv("TICKETD_SESSION_PROC_" + name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			t.Fatalf("TICKETD_SESSION_PROC_%s=%q: want an integer in [%d, %d]", name, v, lo, hi)
		}
		return n
	}
	cfg := sessionProcConfig{
		sessions: num("SESSIONS", 1000, 1, 100_000), locks: num("LOCKS", 10, 1, 100),
		ttl:        time.Duration(num("TTL_SECONDS", 60, 1, 3600)) * time.Second,
		window:     time.Duration(num("WINDOW", 60, 5, 600)) * time.Second,
		rounds:     num("ROUNDS", 5, 1, 20),
		baseRounds: num("BASE_ROUNDS", 1, 1, 20),
		kinds:      []string{holdSessions, holdAutoRenew},
		profileDir: os.Getenv("TICKETD_SESSION_PROC_PROFILE"),
		pairs:      num("PAIRS", 0, 0, 100),
		pairWindow: time.Duration(num("PAIR_WINDOW", 15, 5, 600)) * time.Second,
	}
	// A stopped holder sends no keepalive: its sessions must outlive the
	// longest gap, a keepalive interval (at most a third of the TTL) plus
	// the window.
	if cfg.pairs > 0 && cfg.pairWindow > cfg.ttl/4 {
		t.Fatalf("TICKETD_SESSION_PROC_PAIR_WINDOW %v: at most a quarter of the session TTL (%v), or the stopped holder's sessions could expire", cfg.pairWindow, cfg.ttl)
	}
	if cfg.sessions*cfg.locks > holdMaxLocks {
		t.Fatalf("%d sessions x %d locks: more than a cluster holds (%d)", cfg.sessions, cfg.locks, holdMaxLocks)
	}
	if v := os.Getenv("TICKETD_SESSION_PROC_KINDS"); v != "" {
		cfg.kinds = strings.Split(v, ",")
		for _, k := range cfg.kinds {
			if k != holdSessions && k != holdAutoRenew {
				t.Fatalf("TICKETD_SESSION_PROC_KINDS: %q is neither %s nor %s", k, holdSessions, holdAutoRenew)
			}
		}
	}
	return cfg
}

// procWindow is one measured window.
type procWindow struct {
	phase     string // baseline, sessions or auto-renew
	loaded    bool
	profiled  bool // a CPU profile of the leader ran: left out of the medians
	seconds   float64
	nodeCPU   []float64 // s/s, by node
	leader    uint64    // at the window's end
	changed   string    // how the leader or term changed in the window, "" if not
	holderCPU float64   // s/s
	loadCPU   float64   // s/s, over the load's measured run
	entries   float64   // raft entries/s: the highest applied index of the nodes
	renewals  float64   // renewals/s, summed over the nodes
	keepalive float64   // the holder's acknowledged keepalives or renewals per second
	rounds    float64   // ReadIndex rounds/s, summed over the nodes (only a leader issues them)
	reads     float64   // reads/s that waited for those rounds
	held      int       // locks the holder held at the window's end
	lost      int       // locks it had lost by then
	load      BenchResult
	loadavg   string
}

func (w procWindow) nodeSum() float64 {
	s := 0.0
	for _, c := range w.nodeCPU {
		s += c
	}
	return s
}

// procHolder is a running `ticketd bench hold`.
type procHolder struct {
	kind   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	last   HoldResult // the last line printed
	lastAt time.Time  // when it was read
	done   chan struct{}
	errw   *lockedWriter // its stderr
}

// stderr is what the holder printed on stderr so far.
func (h *procHolder) stderr() string {
	h.errw.mu.Lock()
	defer h.errw.mu.Unlock()
	return h.errw.w.String()
}

func (h *procHolder) latest() HoldResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// procMeter runs the windows and keeps their figures.
type procMeter struct {
	t       *testing.T
	urls    []string
	metrics []string
	nodes   []*proc
	bin     string
	url     string // the clients' NATS
	cfg     sessionProcConfig
	windows []procWindow
	holders []HoldResult // each holding's last line (done)
	opened  []HoldResult // and its opened line
}

// clientCmd is a ticketd client process without this process's TICKETD_*
// variables (they configure tests, and clients read TICKETD_* too).
func (m *procMeter) clientCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(m.bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// runLoad runs the 16-client try load for d and returns its result.
func (m *procMeter) runLoad(d time.Duration) BenchResult {
	t := m.t
	var out, errb bytes.Buffer
	cmd := m.clientCmd("bench", "--nats", m.url, "--clients", "16", "--keys", "1000", "--mode", "try",
		"--duration", d.String(), "--warmup", "0s", "--cpu-pids", "none", "--json")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("load: %v\n%s", err, errb.String())
	}
	var res []BenchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res) != 1 {
		t.Fatalf("load output %q: %v", out.String(), err)
	}
	return res[0]
}

// procState is what a window compares between its start and end.
type procState struct {
	at       time.Time
	cpu      []time.Duration // nodes, then the holder (if any)
	applied  uint64
	renewals []float64 // by node
	rounds   []float64 // ReadIndex rounds, by node
	reads    []float64 // reads that joined them, by node
	terms    []uint64
	leader   uint64
	holder   HoldResult
}

func (m *procMeter) state(h *procHolder) procState {
	t := m.t
	s := procState{at: time.Now()}
	for _, p := range m.nodes {
		c, err := nodeCPU{pids: []int{p.cmd.Process.Pid}}.total()
		if err != nil {
			t.Fatal(err)
		}
		s.cpu = append(s.cpu, c)
	}
	if h != nil {
		c, err := nodeCPU{pids: []int{h.cmd.Process.Pid}}.total()
		if err != nil {
			t.Fatalf("holder: %v\n%s", err, h.stderr())
		}
		s.cpu = append(s.cpu, c)
		s.holder = h.latest()
	}
	for i := range m.nodes {
		st := m.status(i)
		s.applied = max(s.applied, st.AppliedIndex)
		s.terms = append(s.terms, st.Term)
		if i == 0 {
			s.leader = st.Leader
		}
		mx := scrape(t, m.metrics[i])
		s.renewals = append(s.renewals, mx["ticketd_renewals_total"])
		s.rounds = append(s.rounds, mx["ticketd_read_index_rounds_total"])
		s.reads = append(s.reads, mx["ticketd_read_index_reads_total"])
	}
	return s
}

// status is node i's own view. A busy node may answer with an error
// (no ID, no term: unavailable, its requests in progress at their
// bound): asked again until it answers, within a deadline.
func (m *procMeter) status(i int) protocol.StatusReply {
	t := m.t
	var st protocol.StatusReply
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err = nodeStatus(m.urls[i], i+1)
		if err == nil && st.ID == uint64(i+1) && st.Term > 0 {
			return st
		}
	}
	t.Fatalf("status of node %d: %v (last reply %+v)", i+1, err, st)
	return st
}

// window measures one window of phase: quiet, or with the load beside
// the holding h (nil: nothing held). With profile (and a profile
// directory) a CPU profile of the leader covers the window.
func (m *procMeter) window(phase string, loaded bool, h *procHolder, profile ...bool) {
	t := m.t
	w := procWindow{phase: phase, loaded: loaded}
	s0 := m.state(h)
	var profDone chan struct{}
	if len(profile) > 0 && profile[0] && m.cfg.profileDir != "" && s0.leader >= 1 && int(s0.leader) <= len(m.nodes) {
		w.profiled = true
		name := filepath.Join(m.cfg.profileDir, fmt.Sprintf("%s-%s-leader-cpu.pprof", phase, map[bool]string{false: "quiet", true: "loaded"}[loaded]))
		profDone = make(chan struct{})
		go func() {
			defer close(profDone)
			saveProfile(m.metrics[s0.leader-1], int(m.cfg.window/time.Second)-2, name)
		}()
	}
	if loaded {
		w.load = m.runLoad(m.cfg.window)
		w.loadCPU = w.load.ClientCPUS / w.load.DurationS
	} else {
		m.wait(m.cfg.window) // the window itself: nothing to poll for
	}
	s1 := m.state(h)
	if profDone != nil {
		<-profDone
	}
	el := s1.at.Sub(s0.at).Seconds()
	w.seconds = el
	for i := range m.nodes {
		w.nodeCPU = append(w.nodeCPU, (s1.cpu[i]-s0.cpu[i]).Seconds()/el)
	}
	if h != nil {
		w.holderCPU = (s1.cpu[len(m.nodes)] - s0.cpu[len(m.nodes)]).Seconds() / el
		if dt := s1.holder.HeldS - s0.holder.HeldS; dt > 0 {
			w.keepalive = float64(s1.holder.Keepalives-s0.holder.Keepalives) / dt
		}
		w.held, w.lost = s1.holder.LocksHeld, s1.holder.LocksLost
	}
	w.entries = float64(s1.applied-s0.applied) / el
	for i := range m.nodes {
		// Every node applies each renewal: the most any one counted.
		w.renewals = max(w.renewals, (s1.renewals[i]-s0.renewals[i])/el)
		w.rounds += (s1.rounds[i] - s0.rounds[i]) / el
		w.reads += (s1.reads[i] - s0.reads[i]) / el
	}
	w.leader = s1.leader
	if s0.leader != s1.leader || !slices.Equal(s0.terms, s1.terms) {
		w.changed = fmt.Sprintf("leader %d -> %d, terms %v -> %v", s0.leader, s1.leader, s0.terms, s1.terms)
	}
	w.loadavg = loadAvg()
	t.Log("WINDOW " + w.String())
	m.windows = append(m.windows, w)
}

func (w procWindow) String() string {
	var cpus []string
	for i, c := range w.nodeCPU {
		mark := ""
		if uint64(i+1) == w.leader {
			mark = "*"
		}
		cpus = append(cpus, fmt.Sprintf("n%d%s %.3f", i+1, mark, c))
	}
	s := fmt.Sprintf("%s %s: %.0fs, node CPU s/s %s (sum %.3f), holder %.3f, %.0f raft entries/s, %.0f renewals/s, %.0f ReadIndex rounds/s for %.0f reads/s",
		w.phase, w.loadName(), w.seconds, strings.Join(cpus, " "), w.nodeSum(), w.holderCPU, w.entries, w.renewals, w.rounds, w.reads)
	if w.phase != "baseline" {
		s += fmt.Sprintf(", %.0f keepalives/s acknowledged, %d locks held, %d lost", w.keepalive, w.held, w.lost)
	}
	if w.loaded {
		s += fmt.Sprintf("; load (CPU %.3f s/s): %d acquires, %d held, %d errors %v, p50 %.2f ms, p99 %.2f ms",
			w.loadCPU, w.load.Cycles, w.load.Held, w.load.Errors, w.load.ErrorCodes, w.load.Acquire.P50, w.load.Acquire.P99)
	}
	if w.changed != "" {
		s += "; CHANGED: " + w.changed
	}
	if w.profiled {
		s += "; profiled"
	}
	return s + "; load average " + w.loadavg
}

func (w procWindow) loadName() string {
	if w.loaded {
		return "loaded"
	}
	return "quiet"
}

// startHolder starts `ticketd bench hold` of kind and waits until
// everything is open.
func (m *procMeter) startHolder(kind string) *procHolder {
	t := m.t
	c := m.cfg
	// It holds until SIGINT; --duration only bounds it should the test die.
	hold := time.Duration(c.rounds*2+4)*c.window + 30*time.Minute
	h := &procHolder{kind: kind, done: make(chan struct{})}
	h.cmd = m.clientCmd("bench", "hold", "--nats", m.url, "--kind", kind, "--sessions", fmt.Sprint(c.sessions),
		"--locks-per-session", fmt.Sprint(c.locks), "--session-ttl", c.ttl.String(), "--duration", hold.String(),
		"--report-every", "1s", "--json", "--key-prefix", kind+"/")
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.errw = &lockedWriter{w: &bytes.Buffer{}}
	h.cmd.Stderr = h.errw
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			_ = h.cmd.Process.Kill()
			<-h.done
		}
	})
	opened := make(chan HoldResult, 1)
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r HoldResult
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue
			}
			h.mu.Lock()
			h.last, h.lastAt = r, time.Now()
			h.mu.Unlock()
			if r.Event == "opened" {
				opened <- r
			}
		}
		_ = h.cmd.Wait()
	}()
	start := time.Now()
	var r HoldResult
	select {
	case r = <-opened:
	case <-h.done:
		t.Fatalf("holder %s exited before everything was open: %s", kind, h.stderr())
	case <-time.After(30 * time.Minute):
		t.Fatalf("holder %s: not open after 30 minutes", kind)
	}
	t.Logf("HOLDER %s opened %d sessions, %d of %d locks in %.1fs (%v since start), errors %v %v; load average %s",
		kind, r.SessionsOpened, r.LocksOpened, c.sessions*c.locks, r.OpenS, time.Since(start).Round(time.Millisecond), r.OpenErrors, r.FirstErrors, loadAvg())
	m.opened = append(m.opened, r)
	return h
}

// stopHolder interrupts the holder (it closes everything) and waits for
// its last line.
func (m *procMeter) stopHolder(h *procHolder) {
	t := m.t
	if err := h.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.done:
	case <-time.After(holdCloseTimeout + time.Minute):
		t.Fatalf("holder %s did not exit after SIGINT", h.kind)
	}
	r := h.latest()
	if r.Event != "done" {
		t.Fatalf("holder %s ended without its done line (last %+v): %s", h.kind, r, h.stderr())
	}
	t.Logf("HOLDER %s done: held %d of %d locks for %.0fs, %d lost (%d sessions), %.1f keepalives/s, released %d in %.1fs, close errors %v, holder CPU %.1fs, peak RSS %d MiB",
		h.kind, r.LocksHeld, r.LocksOpened, r.HeldS, r.LocksLost, r.SessionsLost, r.KeepalivesPerS, r.Released, r.CloseS, r.CloseErrors, r.ClientCPUS, r.MaxRSSBytes>>20)
	m.holders = append(m.holders, r)
}

// wait lets d pass, a span of the schedule (not a condition to poll for),
// unless the test ends first.
func (m *procMeter) wait(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-m.t.Context().Done():
		m.t.Fatal("test context ended")
	}
}

// pairSettle is the pause after a stopped holder resumes: the keepalives
// that fell due while it was stopped go out at once, and the next window
// starts after them.
const pairSettle = 5 * time.Second

// pairs measures what the keepalives add to the load's acquire latency
// with paired loaded windows, the locks held throughout: in one window of
// each pair the holder runs, in the other it is stopped (SIGSTOP), so
// nothing but the keepalives differs. Which comes first alternates. The
// difference within each pair cancels the machine's drift, which moves
// the p99 of windows minutes apart by more than the goal's 1 ms.
func (m *procMeter) pairs(h *procHolder) {
	t := m.t
	pause := func(sig syscall.Signal) {
		if err := h.cmd.Process.Signal(sig); err != nil {
			t.Fatalf("holder: %v: %v", sig, err)
		}
	}
	t.Cleanup(func() { _ = h.cmd.Process.Signal(syscall.SIGCONT) })
	var d99, d50, drate []float64
	for i := range m.cfg.pairs {
		var with, without BenchResult
		for _, keepalives := range []bool{i%2 == 0, i%2 != 0} {
			if keepalives {
				with = m.runLoad(m.cfg.pairWindow)
				continue
			}
			pause(syscall.SIGSTOP)
			without = m.runLoad(m.cfg.pairWindow)
			pause(syscall.SIGCONT)
			m.wait(pairSettle) // a fixed gap in the schedule: nothing to poll for
		}
		rate := func(r BenchResult) float64 { return float64(r.Cycles) / r.DurationS }
		d99 = append(d99, with.Acquire.P99-without.Acquire.P99)
		d50 = append(d50, with.Acquire.P50-without.Acquire.P50)
		drate = append(drate, rate(with)-rate(without))
		t.Logf("PAIR %d (%s first): p99 with keepalives %.2f ms, without %.2f ms (%+.2f); p50 %.2f / %.2f ms; acquires/s %.0f / %.0f; errors %d %v / %d %v; load average %s",
			i+1, map[bool]string{true: "with", false: "without"}[i%2 == 0], with.Acquire.P99, without.Acquire.P99, d99[i],
			with.Acquire.P50, without.Acquire.P50, rate(with), rate(without), with.Errors, with.ErrorCodes, without.Errors, without.ErrorCodes, loadAvg())
	}
	// The holder must still hold everything: a report after the resume.
	resumed := time.Now()
	testkit.Eventually(t, time.Minute, "a holder report after the last resume", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.last.HeldS > 0 && h.lastAt.After(resumed)
	})
	if r := h.latest(); r.LocksLost > 0 || r.SessionsLost > 0 {
		t.Fatalf("the paired windows cost %d sessions and %d locks: the stopped holder's gap outlived a TTL", r.SessionsLost, r.LocksLost)
	}
	q := func(xs []float64) string {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		at := func(f float64) float64 { // linear between the nearest ranks
			x := f * float64(len(xs)-1)
			lo := int(x)
			hi := min(lo+1, len(xs)-1)
			return xs[lo] + (x-float64(lo))*(xs[hi]-xs[lo])
		}
		pos := 0
		for _, x := range xs {
			if x > 0 {
				pos++
			}
		}
		return fmt.Sprintf("median %+.2f (quartiles %+.2f to %+.2f, min %+.2f, max %+.2f; %d of %d pairs above 0)", at(0.5), at(0.25), at(0.75), xs[0], xs[len(xs)-1], pos, len(xs))
	}
	t.Logf("PAIRS %d pairs of %v: with keepalives minus without, p99 ms %s; p50 ms %s; acquires/s %s", m.cfg.pairs, m.cfg.pairWindow, q(d99), q(d50), q(drate))
}

// report prints every window as a table row, then the medians and spread
// of each phase and the holding's cost above the baseline.
func (m *procMeter) report() {
	t := m.t
	t.Log("| phase | window | node CPU s/s n1 / n2 / n3 (* leader) | sum | holder CPU s/s | raft entries/s | renewals/s | keepalives/s | acquires | p50 ms | p99 ms | leader change |")
	t.Log("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range m.windows {
		var cpus []string
		for i, c := range w.nodeCPU {
			mark := ""
			if uint64(i+1) == w.leader {
				mark = "*"
			}
			cpus = append(cpus, fmt.Sprintf("%.3f%s", c, mark))
		}
		name := w.loadName()
		if w.profiled {
			name += " (profiled)"
		}
		row := fmt.Sprintf("| %s | %s | %s | %.3f | %.3f | %.0f | %.0f | %.0f |", w.phase, name, strings.Join(cpus, " / "), w.nodeSum(), w.holderCPU, w.entries, w.renewals, w.keepalive)
		if w.loaded {
			row += fmt.Sprintf(" %d | %.2f | %.2f |", w.load.Cycles, w.load.Acquire.P50, w.load.Acquire.P99)
		} else {
			row += " | | |"
		}
		t.Log(row + " " + map[bool]string{false: "no", true: w.changed}[w.changed != ""] + " |")
	}
	type stat struct{ med, lo, hi float64 }
	of := func(phase string, loaded bool, f func(procWindow) float64) (stat, int) {
		var xs []float64
		for _, w := range m.windows {
			if w.phase == phase && w.loaded == loaded && !w.profiled {
				xs = append(xs, f(w))
			}
		}
		if len(xs) == 0 {
			return stat{}, 0
		}
		slices.Sort(xs)
		med := xs[len(xs)/2]
		if len(xs)%2 == 0 {
			med = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
		}
		return stat{med, xs[0], xs[len(xs)-1]}, len(xs)
	}
	sum := func(w procWindow) float64 { return w.nodeSum() }
	p99 := func(w procWindow) float64 { return w.load.Acquire.P99 }
	p50 := func(w procWindow) float64 { return w.load.Acquire.P50 }
	rate := func(w procWindow) float64 { return float64(w.load.Cycles) / w.load.DurationS }
	lead := func(w procWindow) float64 {
		if w.leader < 1 || int(w.leader) > len(w.nodeCPU) {
			return 0
		}
		return w.nodeCPU[w.leader-1]
	}
	show := func(s stat) string { return fmt.Sprintf("%.3f (%.3f-%.3f)", s.med, s.lo, s.hi) }
	t.Log("SUMMARY medians (min-max) over the windows not profiled:")
	phases := append([]string{"baseline"}, m.cfg.kinds...)
	for _, ph := range phases {
		q, nq := of(ph, false, sum)
		ql, _ := of(ph, false, lead)
		l, nl := of(ph, true, sum)
		e, _ := of(ph, false, func(w procWindow) float64 { return w.entries })
		ka, _ := of(ph, false, func(w procWindow) float64 { return w.keepalive })
		rr, _ := of(ph, false, func(w procWindow) float64 { return w.rounds })
		hc, _ := of(ph, false, func(w procWindow) float64 { return w.holderCPU })
		a, _ := of(ph, true, p99)
		b, _ := of(ph, true, p50)
		r, _ := of(ph, true, rate)
		t.Logf("SUMMARY %s: quiet (%d windows) node CPU sum %s s/s, leader %s, raft entries/s %s, keepalives/s %s, ReadIndex rounds/s %s, holder CPU %s; loaded (%d windows) node CPU sum %s, acquires/s %s, p50 %s ms, p99 %s ms",
			ph, nq, show(q), show(ql), show(e), show(ka), show(rr), show(hc), nl, show(l), show(r), show(b), show(a))
	}
	bq, _ := of("baseline", false, sum)
	bp, _ := of("baseline", true, p99)
	for _, ph := range m.cfg.kinds {
		q, _ := of(ph, false, sum)
		p, _ := of(ph, true, p99)
		t.Logf("GOAL %s: node CPU above the baseline %.3f s/s (spread %.3f to %.3f; goal < 0.10): %s; p99 added %.2f ms (spread %.2f to %.2f; goal < 1 ms): %s",
			ph, q.med-bq.med, q.lo-bq.hi, q.hi-bq.lo, verdict(q.med-bq.med < 0.10, q.hi-bq.lo < 0.10, q.lo-bq.hi < 0.10),
			p.med-bp.med, p.lo-bp.hi, p.hi-bp.lo, verdict(p.med-bp.med < 1, p.hi-bp.lo < 1, p.lo-bp.hi < 1))
	}
}

// verdict says whether a goal is met by the medians and whether the
// spread agrees.
func verdict(median, worst, best bool) string {
	switch {
	case median && worst:
		return "met (at every spread)"
	case median:
		return "met by the medians, not across the whole spread"
	case best:
		return "not met by the medians (met only at the spread's best)"
	}
	return "not met"
}

// saveProfile saves the CPU profile of the node at addr over secs
// seconds.
func saveProfile(addr string, secs int, save string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, max(secs, 1)), nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode == http.StatusOK {
		_ = os.WriteFile(save, b, 0o644)
	}
}

// loadAvg is the machine's 1-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// waitLoadBelow waits (bounded) for the machine's load average to fall
// below limit: it is shared; a busy start is logged, not fatal.
func waitLoadBelow(t *testing.T, limit float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		l, _ := strconv.ParseFloat(loadAvg(), 64)
		if l < limit {
			t.Logf("load average %.2f at the start", l)
			return
		}
		if time.Now().After(deadline) {
			t.Logf("load average still %.2f after %v: measuring anyway", l, within)
			return
		}
		time.Sleep(5 * time.Second) // polling the machine's load, bounded by within
	}
}
