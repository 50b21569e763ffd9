package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// maxSamples bounds the latency samples one bench run keeps.
const maxSamples = 4 << 20

// BenchResult is what `ticketd bench` reports.
type BenchResult struct {
	Clients      int     `json:"clients"`
	Keys         int     `json:"keys"`
	DurationS    float64 `json:"duration_s"`
	Cycles       int     `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_s"`
	Held         int     `json:"held"`
	Errors       int     `json:"errors"`
	// ErrorCodes counts the errors by stable code.
	ErrorCodes map[string]int `json:"error_codes,omitempty"`
	Acquire    Latencies      `json:"acquire_ms"`
	Release    Latencies      `json:"release_ms"`
}

// Latencies are percentiles in milliseconds.
type Latencies struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("bench", stderr)
	clients := cf.fs.Int("clients", 16, "concurrent clients (each its own NATS connection)")
	keys := cf.fs.Int("keys", 1000, "distinct keys")
	duration := cf.fs.Duration("duration", 10*time.Second, "how long to run (at most 10m)")
	lease := cf.fs.Duration("lease", 10*time.Second, "lease of each acquire")
	asJSON := cf.fs.Bool("json", false, "print JSON")
	if _, code, ok := cf.parse(args, 0, stderr); !ok {
		return code
	}
	if *clients < 1 || *clients > 1024 || *keys < 1 || *duration <= 0 || *duration > 10*time.Minute {
		fmt.Fprintln(stderr, "ticketd bench: need 1..1024 clients, >=1 key, duration in (0, 10m]")
		return exitUsage
	}
	opts, err := cf.sdkOptions()
	if err != nil {
		return fail(stderr, err)
	}
	res, err := runBench(ctx, *cf.url, *clients, *keys, *duration, *lease, opts...)
	if err != nil {
		return fail(stderr, err)
	}
	if *asJSON {
		printJSON(stdout, res)
		return 0
	}
	fmt.Fprintf(stdout, "clients=%d keys=%d duration=%.1fs cycles=%d (%.0f cycles/s) held=%d errors=%d\n",
		res.Clients, res.Keys, res.DurationS, res.Cycles, res.CyclesPerSec, res.Held, res.Errors)
	if len(res.ErrorCodes) > 0 {
		fmt.Fprintf(stdout, "errors by code: %v\n", res.ErrorCodes)
	}
	fmt.Fprintf(stdout, "acquire ms: p50=%.2f p90=%.2f p99=%.2f max=%.2f\n", res.Acquire.P50, res.Acquire.P90, res.Acquire.P99, res.Acquire.Max)
	fmt.Fprintf(stdout, "release ms: p50=%.2f p90=%.2f p99=%.2f max=%.2f\n", res.Release.P50, res.Release.P90, res.Release.P99, res.Release.Max)
	return 0
}

func runBench(ctx context.Context, url string, clients, keys int, duration, lease time.Duration, opts ...sdk.Option) (BenchResult, error) {
	conns := make([]*sdk.Client, clients)
	for i := range conns {
		c, err := sdk.Connect(url, opts...)
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
	end := time.Now().Add(duration)
	var (
		mu                 sync.Mutex
		acq, rel           []time.Duration
		cycles, held, errs int
		codes              = map[string]int{}
		wg                 sync.WaitGroup
	)
	countErr := func(err error) { // mu held
		errs++
		code := string(sdk.CodeOf(err))
		if code == "" {
			code = err.Error()
		}
		codes[code]++
	}
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func(i int, c *sdk.Client) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			owner := fmt.Sprintf("bench-%d", i)
			// Each operation has its own deadline, not the run's: a request
			// must not be cut short (and turned indeterminate) by the end of
			// the run.
			for ctx.Err() == nil && time.Now().Before(end) {
				key := fmt.Sprintf("bench/%d", rng.IntN(keys))
				t0 := time.Now()
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				l, err := c.Acquire(actx, key, sdk.WithLease(lease), sdk.WithOwner(owner))
				acancel()
				t1 := time.Now()
				if err != nil {
					mu.Lock()
					if errors.Is(err, sdk.ErrHeld) {
						held++
					} else {
						countErr(err)
					}
					mu.Unlock()
					continue
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = c.Release(rctx, key, l.Token)
				rcancel()
				t2 := time.Now()
				mu.Lock()
				if err != nil {
					countErr(err)
				} else {
					cycles++
					if len(acq) < maxSamples {
						acq = append(acq, t1.Sub(t0))
						rel = append(rel, t2.Sub(t1))
					}
				}
				mu.Unlock()
			}
		}(i, c)
	}
	wg.Wait()
	elapsed := time.Since(start)
	return BenchResult{
		Clients:      clients,
		Keys:         keys,
		DurationS:    elapsed.Seconds(),
		Cycles:       cycles,
		CyclesPerSec: float64(cycles) / elapsed.Seconds(),
		Held:         held,
		Errors:       errs,
		ErrorCodes:   codes,
		Acquire:      percentiles(acq),
		Release:      percentiles(rel),
	}, nil
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
