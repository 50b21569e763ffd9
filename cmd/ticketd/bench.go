package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// maxSamples bounds the latency samples one bench run keeps.
const maxSamples = 4 << 20

// BenchResult is what `ticketd bench` reports for one mode: the figures
// of the peer harness (../shared/peers, lockbench): cycles/s and the
// acquire and release latencies, plus, against local nodes, the CPU time
// they used per cycle.
type BenchResult struct {
	Mode string `json:"mode"` // try or wait
	// Lock is the kind of lock each cycle takes: mutex, semaphore (Limit
	// slots per key), shared (every acquire a shared hold of a read/write
	// lock) or rw (a ReadRatio share of the acquires shared, the rest
	// exclusive; SharedCycles of the Cycles were shared).
	Lock         string  `json:"lock"`
	Limit        int     `json:"limit,omitempty"`
	ReadRatio    float64 `json:"read_ratio,omitempty"`
	SharedCycles int     `json:"shared_cycles,omitempty"`
	Clients      int     `json:"clients"`
	Keys         int     `json:"keys"`
	DurationS    float64 `json:"duration_s"`
	Cycles       int     `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_s"`
	// Held counts acquires that did not get the key: held (try) or
	// timed out waiting (wait); the harness's "conflicts".
	Held   int `json:"held"`
	Errors int `json:"errors"`
	// ErrorCodes counts the errors by stable code.
	ErrorCodes map[string]int `json:"error_codes,omitempty"`
	Acquire    Latencies      `json:"acquire_ms"`
	Release    Latencies      `json:"release_ms"`
	// NodePids are the local node processes whose CPU time (user+system,
	// from /proc during the measured run, warm-up excluded) NodeCPUUSPerCycle
	// divides by Cycles; empty when none were found or asked for.
	NodePids          []int   `json:"node_pids,omitempty"`
	NodeCPUS          float64 `json:"node_cpu_s,omitempty"`
	NodeCPUUSPerCycle float64 `json:"node_cpu_us_per_cycle,omitempty"`
	// ClientCPUS is the CPU time of this load generator in the run.
	ClientCPUS float64 `json:"client_cpu_s"`
}

// Latencies are percentiles in milliseconds.
type Latencies struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// benchConfig is one run's shape.
type benchConfig struct {
	url      string
	mode     string // try or wait
	clients  int
	keys     int
	duration time.Duration
	warmup   time.Duration
	lease    time.Duration
	wait     time.Duration // how long a wait-mode acquire queues
	// limit > 1 makes every key a semaphore of limit slots; readRatio is
	// the share of acquires that are shared holds of a read/write lock.
	limit     int
	readRatio float64
	cpu       nodeCPU
	opts      []sdk.Option
}

// benchOptions are bench's flags.
type benchOptions struct {
	cf                            *clientFlags
	clients, keys                 int
	duration, warmup, lease, wait time.Duration
	modes, pids                   string
	asJSON                        bool
	limit                         int
	shared                        bool
	readRatio                     float64
}

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive acquire+release cycles against a cluster and print figures",
		Long: `Run --clients clients (each its own NATS connection) doing acquire+release
cycles on --keys keys for --duration per mode, after a --warmup, and print
cycles/s, acquire and release latency percentiles and, against local nodes,
the nodes' CPU time per cycle. Each cycle takes a mutex, or with --limit N
one of N slots of a counting semaphore, with --shared a shared hold of a
read/write lock, with --read-ratio R a shared hold R of the time and an
exclusive one otherwise (cluster version 5 for all three).

'ticketd bench hold' holds many locks in sessions, or with per-lock
auto-renew, for a while: what their keepalives cost (issue 24).`,
		Example: `  ticketd bench --clients 16 --keys 1000 --duration 10s
  ticketd bench --mode try --duration 30s --json
  ticketd bench --mode try --keys 8 --limit 4
  ticketd bench --mode wait --keys 8 --read-ratio 0.9`,
		Args:        exactArgs(),
		Annotations: map[string]string{alsoRunsAnnotation: "true"},
	}
	o := &benchOptions{cf: addClientFlags(cmd)}
	fs := cmd.Flags()
	fs.IntVar(&o.clients, "clients", 16, "concurrent clients (each its own NATS connection)")
	fs.IntVar(&o.keys, "keys", 1000, "distinct keys")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure each mode (at most 10m)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured run before each mode, as the peer harness does")
	fs.DurationVar(&o.lease, "lease", 10*time.Second, "lease of each acquire")
	fs.StringVar(&o.modes, "mode", "try,wait", "try (acquire once, held counts as a conflict), wait (queue up to --wait), or both")
	fs.DurationVar(&o.wait, "wait", 5*time.Second, "how long a wait-mode acquire queues for its key")
	fs.StringVar(&o.pids, "cpu-pids", "auto", "node processes to charge CPU to: auto (every local `ticketd serve` process, from /proc), none, or pid,pid,...")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON (one result per mode)")
	fs.IntVar(&o.limit, "limit", 1, fmt.Sprintf("make every key a counting semaphore of N slots (1..%d; 1: a mutex)", protocol.MaxLimit))
	fs.BoolVar(&o.shared, "shared", false, "make every acquire a shared hold of a read/write lock (--read-ratio 1)")
	fs.Float64Var(&o.readRatio, "read-ratio", 0, "share of acquires that are shared holds of a read/write lock, the rest exclusive (0..1; 0: a mutex)")
	cmd.RunE = bind(o, bench)
	cmd.AddCommand(benchHoldCmd())
	return cmd
}

func bench(ctx context.Context, o *benchOptions, _ []string, stdout, stderr io.Writer) int {
	if o.clients < 1 || o.clients > 1024 || o.keys < 1 || o.duration <= 0 || o.duration > 10*time.Minute || o.warmup < 0 || o.wait <= 0 {
		return usagef(stderr, "bench needs 1..1024 clients, >=1 key, duration in (0, 10m], warmup >= 0, wait > 0")
	}
	ms, err := parseModes(o.modes)
	if err != nil {
		return usagef(stderr, "%v", err)
	}
	ratio, err := o.lockKind()
	if err != nil {
		return usagef(stderr, "%v", err)
	}
	cfg := benchConfig{url: o.cf.url, clients: o.clients, keys: o.keys, duration: o.duration, warmup: o.warmup, lease: o.lease, wait: o.wait,
		limit: o.limit, readRatio: ratio}
	if cfg.cpu.pids, err = parsePids(o.pids); err != nil {
		return usagef(stderr, "%v", err)
	}
	if cfg.opts, err = o.cf.sdkOptions(); err != nil {
		return fail(stderr, err)
	}
	var results []BenchResult
	for _, m := range ms {
		cfg.mode = m
		res, err := runBench(ctx, cfg)
		if err != nil {
			return fail(stderr, err)
		}
		results = append(results, res)
		if !o.asJSON {
			printBench(stdout, res)
		}
	}
	if o.asJSON {
		printJSON(stdout, results)
	}
	return 0
}

// lockKind checks --limit, --shared and --read-ratio, and returns the
// share of shared acquires.
func (o *benchOptions) lockKind() (float64, error) {
	ratio := o.readRatio
	switch {
	case o.limit < 1 || o.limit > protocol.MaxLimit:
		return 0, fmt.Errorf("--limit %d is outside [1, %d]", o.limit, protocol.MaxLimit)
	case !(ratio >= 0 && ratio <= 1):
		return 0, fmt.Errorf("--read-ratio %v is outside [0, 1]", ratio)
	case o.shared && ratio != 0 && ratio != 1:
		return 0, fmt.Errorf("--shared is --read-ratio 1, not %v: give one of them", ratio)
	case o.shared:
		ratio = 1
	}
	if o.limit > 1 && ratio > 0 {
		return 0, fmt.Errorf("--limit %d with shared holds: a semaphore has no shared holds (a key is a semaphore or a read/write lock)", o.limit)
	}
	return ratio, nil
}

// lockName is a result's Lock.
func (cfg benchConfig) lockName() string {
	switch {
	case cfg.limit > 1:
		return "semaphore"
	case cfg.readRatio == 1:
		return "shared"
	case cfg.readRatio > 0:
		return "rw"
	}
	return "mutex"
}

func parseModes(spec string) ([]string, error) {
	var out []string
	for _, m := range strings.Split(spec, ",") {
		if m != "try" && m != "wait" {
			return nil, fmt.Errorf("--mode: %q is neither try nor wait", m)
		}
		out = append(out, m)
	}
	return out, nil
}

func printBench(w io.Writer, res BenchResult) {
	lock := ""
	switch res.Lock {
	case "semaphore":
		lock = fmt.Sprintf(" lock=semaphore limit=%d", res.Limit)
	case "shared":
		lock = " lock=shared"
	case "rw":
		lock = fmt.Sprintf(" lock=rw read-ratio=%g shared-cycles=%d", res.ReadRatio, res.SharedCycles)
	}
	fmt.Fprintf(w, "mode=%s%s clients=%d keys=%d duration=%.1fs cycles=%d (%.0f cycles/s) held=%d errors=%d\n",
		res.Mode, lock, res.Clients, res.Keys, res.DurationS, res.Cycles, res.CyclesPerSec, res.Held, res.Errors)
	if len(res.ErrorCodes) > 0 {
		fmt.Fprintf(w, "  errors by code: %v\n", res.ErrorCodes)
	}
	fmt.Fprintf(w, "  acquire ms: p50=%.2f p90=%.2f p99=%.2f max=%.2f\n", res.Acquire.P50, res.Acquire.P90, res.Acquire.P99, res.Acquire.Max)
	fmt.Fprintf(w, "  release ms: p50=%.2f p90=%.2f p99=%.2f max=%.2f\n", res.Release.P50, res.Release.P90, res.Release.P99, res.Release.Max)
	if len(res.NodePids) > 0 {
		fmt.Fprintf(w, "  node cpu: %.2fs over pids %v = %.0f us/cycle (client cpu %.2fs)\n", res.NodeCPUS, res.NodePids, res.NodeCPUUSPerCycle, res.ClientCPUS)
	} else {
		fmt.Fprintf(w, "  node cpu: no local node processes (--cpu-pids); client cpu %.2fs\n", res.ClientCPUS)
	}
}

// benchStats are one run's figures, guarded by mu.
type benchStats struct {
	mu                 sync.Mutex
	acq, rel           []time.Duration
	cycles, held, errs int
	sharedCycles       int
	codes              map[string]int
}

func (b *benchStats) countErr(err error) { // mu held
	b.errs++
	code := string(sdk.CodeOf(err))
	if code == "" {
		code = err.Error()
	}
	b.codes[code]++
}

// runBench runs cfg.warmup unmeasured, then cfg.duration measured, of
// acquire+release cycles on random keys from cfg.clients connections.
func runBench(ctx context.Context, cfg benchConfig) (BenchResult, error) {
	conns := make([]*sdk.Client, cfg.clients)
	for i := range conns {
		c, err := connectSDK(cfg.url, cfg.opts...)
		if err != nil {
			for _, c := range conns[:i] {
				_ = c.Close()
			}
			return BenchResult{}, err
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	if cfg.warmup > 0 {
		runCycles(ctx, cfg, conns, cfg.warmup)
	}
	cpu0, err := cfg.cpu.total()
	if err != nil {
		return BenchResult{}, err
	}
	self0 := selfCPU()
	start := time.Now()
	st := runCycles(ctx, cfg, conns, cfg.duration)
	elapsed := time.Since(start)
	cpu1, err := cfg.cpu.total()
	if err != nil {
		return BenchResult{}, err
	}
	res := BenchResult{
		Mode: cfg.mode, Lock: cfg.lockName(), Limit: cfg.limit, ReadRatio: cfg.readRatio, SharedCycles: st.sharedCycles,
		Clients: cfg.clients, Keys: cfg.keys, DurationS: elapsed.Seconds(),
		Cycles: st.cycles, CyclesPerSec: float64(st.cycles) / elapsed.Seconds(), Held: st.held, Errors: st.errs,
		ErrorCodes: st.codes, Acquire: percentiles(st.acq), Release: percentiles(st.rel),
		ClientCPUS: (selfCPU() - self0).Seconds(),
	}
	if len(cfg.cpu.pids) > 0 {
		res.NodePids = cfg.cpu.pids
		res.NodeCPUS = (cpu1 - cpu0).Seconds()
		if st.cycles > 0 {
			res.NodeCPUUSPerCycle = float64((cpu1 - cpu0).Microseconds()) / float64(st.cycles)
		}
	}
	return res, nil
}

// runCycles runs acquire+release cycles on every connection for d.
func runCycles(ctx context.Context, cfg benchConfig, conns []*sdk.Client, d time.Duration) *benchStats {
	st := &benchStats{codes: map[string]int{}}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			owner := fmt.Sprintf("bench-%d", i)
			for ctx.Err() == nil && time.Now().Before(end) {
				key := fmt.Sprintf("bench/%d", rng.IntN(cfg.keys))
				cycle(ctx, cfg, c, st, key, owner, cfg.readRatio > 0 && rng.Float64() < cfg.readRatio)
			}
		}()
	}
	wg.Wait()
	return st
}

// cycle is one acquire and, if granted, its release. Each operation has
// its own deadline, not the run's: a request must not be cut short (and
// turned indeterminate) by the end of the run.
// A shared cycle takes a shared hold of a read/write lock.
func cycle(ctx context.Context, cfg benchConfig, c *sdk.Client, st *benchStats, key, owner string, shared bool) {
	opts := []sdk.AcquireOption{sdk.WithLease(cfg.lease), sdk.WithOwner(owner)}
	if cfg.limit > 1 {
		opts = append(opts, sdk.WithLimit(cfg.limit))
	}
	if shared {
		opts = append(opts, sdk.WithShared())
	}
	if cfg.mode == "wait" {
		opts = append(opts, sdk.WithWait(cfg.wait))
	}
	t0 := time.Now()
	actx, acancel := context.WithTimeout(ctx, cfg.wait+10*time.Second)
	l, err := c.Acquire(actx, key, opts...)
	acancel()
	t1 := time.Now()
	if err != nil {
		st.mu.Lock()
		if errors.Is(err, sdk.ErrHeld) || errors.Is(err, sdk.ErrTimeout) {
			st.held++
		} else {
			st.countErr(err)
		}
		st.mu.Unlock()
		return
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = c.Release(rctx, key, l.Token)
	rcancel()
	t2 := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		st.countErr(err)
		return
	}
	st.cycles++
	if shared {
		st.sharedCycles++
	}
	if len(st.acq) < maxSamples {
		st.acq = append(st.acq, t1.Sub(t0))
		st.rel = append(st.rel, t2.Sub(t1))
	}
}

func percentiles(d []time.Duration) Latencies {
	if len(d) == 0 {
		return Latencies{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	at := func(q float64) float64 {
		i := int(q * float64(len(d)-1))
		return float64(d[i].Microseconds()) / 1000
	}
	return Latencies{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: float64(d[len(d)-1].Microseconds()) / 1000}
}
