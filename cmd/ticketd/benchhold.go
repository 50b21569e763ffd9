package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/sdk"
)

// Bounds of `ticketd bench hold`'s flags. The lock total is the server's
// own ceiling (--max-locks at most 1,048,576): more could never be held.
const (
	holdMaxLocks       = 1 << 20
	holdMaxConcurrency = 1024
	holdMaxConnections = 64
	holdMaxDuration    = 24 * time.Hour
	holdMinReport      = time.Second
	holdMaxReport      = time.Hour
	// holdCloseTimeout bounds the whole close of everything held.
	holdCloseTimeout = 5 * time.Minute
)

// Kinds of holding.
const (
	holdSessions  = "sessions"
	holdAutoRenew = "auto-renew"
)

// HoldResult is one line of `ticketd bench hold --json`: an "opened" line
// once everything is open, a "progress" line every --report-every, and a
// "done" line after the close.
type HoldResult struct {
	Event           string  `json:"event"` // opened, progress or done
	Kind            string  `json:"kind"`  // sessions or auto-renew
	Sessions        int     `json:"sessions"`
	LocksPerSession int     `json:"locks_per_session"`
	TTLMS           int64   `json:"ttl_ms"` // the session TTL, or each lock's lease
	SessionsOpened  int     `json:"sessions_opened"`
	LocksOpened     int     `json:"locks_opened"` // acquired
	OpenS           float64 `json:"open_s"`       // how long opening everything took
	// HeldS is the time since everything was open; SessionsLost and
	// LocksLost count what ended meanwhile without being closed (a
	// session not kept alive, a lock whose renewal failed), LocksHeld is
	// LocksOpened minus LocksLost.
	HeldS        float64 `json:"held_s"`
	SessionsLost int     `json:"sessions_lost"`
	LocksLost    int     `json:"locks_lost"`
	LocksHeld    int     `json:"locks_held"`
	// Keepalives counts the acknowledged keepalives (sessions) or
	// renewals (auto-renew) since everything was open, seen as moves of
	// each session's or lock's deadline; KeepalivesPerS is its rate.
	Keepalives     int64   `json:"keepalives"`
	KeepalivesPerS float64 `json:"keepalives_per_s"`
	// OpenErrors counts the failed opens and acquires by stable code
	// ("unknown" for an error without one); FirstErrors keeps the first
	// message of each code.
	OpenErrors  map[string]int    `json:"open_errors,omitempty"`
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	// Released is how many locks the close released (a session's close
	// releases all of its locks); CloseErrors counts the failed closes
	// and releases by code.
	Released    int            `json:"released,omitempty"`
	CloseErrors map[string]int `json:"close_errors,omitempty"`
	CloseS      float64        `json:"close_s,omitempty"`
	// Interrupted: a signal ended the run before --duration.
	Interrupted bool `json:"interrupted,omitempty"`
	// ClientCPUS is this process's CPU time so far, MaxRSSBytes its peak
	// resident memory (from /proc/self/status).
	ClientCPUS  float64 `json:"client_cpu_s"`
	MaxRSSBytes int64   `json:"max_rss_bytes,omitempty"`
}

// holdOptions are `bench hold`'s flags.
type holdOptions struct {
	cf                         *clientFlags
	kind, keyPrefix            string
	sessions, perSession       int
	ttl, duration, reportEvery time.Duration
	concurrency, connections   int
	asJSON                     bool
}

func benchHoldCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hold",
		Short: "Hold many locks in sessions (or with per-lock auto-renew) for a while, and report their keepalives",
		Long: `Open --sessions sessions of --session-ttl, each holding --locks-per-session
locks, keep them alive for --duration, then close them (issue 24's scale
figure). With --kind auto-renew the same number of locks (sessions x
locks-per-session, on the same keys) is held without sessions, each with a
lease of --session-ttl renewed on its own (the SDK's WithAutoRenew).
Everything is opened by --concurrency workers over --connections NATS
connections, each request bounded by --timeout. It reports what was opened,
held and lost (a session not kept alive, a lock whose renewal failed), the
acknowledged keepalives or renewals per second, and errors by code; with
--json one JSON object per line: "opened" when everything is open,
"progress" every --report-every, "done" after the close. SIGINT or SIGTERM
ends the holding early: everything is still closed and reported. Keys are
<key-prefix><session>/<lock>.`,
		Example: `  ticketd bench hold --sessions 10000 --locks-per-session 10 --session-ttl 60s --duration 5m
  ticketd bench hold --kind auto-renew --sessions 10000 --locks-per-session 10 --session-ttl 60s --duration 5m --json`,
		Args: exactArgs(),
	}
	o := &holdOptions{cf: addClientFlags(cmd)}
	fs := cmd.Flags()
	fs.StringVar(&o.kind, "kind", holdSessions, "sessions (locks held by sessions' keepalives) or auto-renew (the same locks with leases renewed each on its own)")
	fs.IntVar(&o.sessions, "sessions", 1000, fmt.Sprintf("sessions to open (1..%d)", core.MaxSessions))
	fs.IntVar(&o.perSession, "locks-per-session", 10, fmt.Sprintf("locks each session holds (0..%d; sessions x locks at most %d)", core.MaxLocksPerSession, holdMaxLocks))
	fs.DurationVar(&o.ttl, "session-ttl", 60*time.Second, fmt.Sprintf("session TTL, and each lock's lease with --kind auto-renew (%v..%v)", core.MinSessionTTL, core.MaxSessionTTL))
	fs.DurationVar(&o.duration, "duration", 5*time.Minute, fmt.Sprintf("how long to hold once everything is open (at most %v)", holdMaxDuration))
	fs.IntVar(&o.concurrency, "concurrency", 64, fmt.Sprintf("sessions (or locks) opened at once (1..%d)", holdMaxConcurrency))
	fs.IntVar(&o.connections, "connections", 4, fmt.Sprintf("NATS connections the sessions and locks are spread over (1..%d)", holdMaxConnections))
	fs.DurationVar(&o.reportEvery, "report-every", 10*time.Second, fmt.Sprintf("print progress this often while holding (%v..%v)", holdMinReport, holdMaxReport))
	fs.StringVar(&o.keyPrefix, "key-prefix", "hold/", "prefix of the held keys")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object per line (opened, progress, done)")
	cmd.RunE = bind(o, benchHold)
	return cmd
}

// check refuses flags out of their bounds, before anything is sent.
func (o *holdOptions) check() error {
	switch {
	case o.kind != holdSessions && o.kind != holdAutoRenew:
		return fmt.Errorf("--kind %q is neither %s nor %s", o.kind, holdSessions, holdAutoRenew)
	case o.sessions < 1 || o.sessions > core.MaxSessions:
		return fmt.Errorf("--sessions %d is outside [1, %d]", o.sessions, core.MaxSessions)
	case o.perSession < 0 || o.perSession > core.MaxLocksPerSession:
		return fmt.Errorf("--locks-per-session %d is outside [0, %d]", o.perSession, core.MaxLocksPerSession)
	case o.sessions*o.perSession > holdMaxLocks:
		return fmt.Errorf("--sessions x --locks-per-session is %d locks, more than a cluster holds (%d)", o.sessions*o.perSession, holdMaxLocks)
	case o.kind == holdAutoRenew && o.perSession == 0:
		return fmt.Errorf("--kind %s with --locks-per-session 0 holds nothing", holdAutoRenew)
	case o.ttl < core.MinSessionTTL || o.ttl > core.MaxSessionTTL || o.ttl%time.Millisecond != 0:
		return fmt.Errorf("--session-ttl %v is outside [%v, %v] or finer than a millisecond", o.ttl, core.MinSessionTTL, core.MaxSessionTTL)
	case o.duration <= 0 || o.duration > holdMaxDuration:
		return fmt.Errorf("--duration %v is outside (0, %v]", o.duration, holdMaxDuration)
	case o.concurrency < 1 || o.concurrency > holdMaxConcurrency:
		return fmt.Errorf("--concurrency %d is outside [1, %d]", o.concurrency, holdMaxConcurrency)
	case o.connections < 1 || o.connections > holdMaxConnections:
		return fmt.Errorf("--connections %d is outside [1, %d]", o.connections, holdMaxConnections)
	case o.reportEvery < holdMinReport || o.reportEvery > holdMaxReport:
		return fmt.Errorf("--report-every %v is outside [%v, %v]", o.reportEvery, holdMinReport, holdMaxReport)
	}
	// The longest key is the last one.
	if err := core.ValidateKey(holdKey(o.keyPrefix, o.sessions-1, max(o.perSession-1, 0))); err != nil {
		return fmt.Errorf("--key-prefix %.80q: %w", o.keyPrefix, err)
	}
	return nil
}

// pollEvery is how often the holder looks at every session's or lock's
// deadline: a move is an acknowledged keepalive or renewal. Twice per
// SDK keepalive interval ((TTL - margin)/3, the margin a tenth of the TTL
// within [20 ms, 1 s]; sdk/keepalive.go), at most a second, so that one
// move is one keepalive.
func (o *holdOptions) pollEvery() time.Duration {
	margin := min(max(o.ttl/10, 20*time.Millisecond), time.Second)
	return min(time.Second, (o.ttl-margin)/6)
}

func holdKey(prefix string, session, lock int) string {
	return prefix + strconv.Itoa(session) + "/" + strconv.Itoa(lock)
}

// holding is one session, or one auto-renewed lock, and what the poll
// saw of it.
type holding struct {
	session *sdk.Session // --kind sessions
	lock    *sdk.Lock    // --kind auto-renew
	locks   int          // locks it holds
	last    time.Time    // its deadline at the last poll
	lost    bool
}

func (h *holding) deadline() time.Time {
	if h.session != nil {
		return h.session.Deadline()
	}
	return h.lock.Deadline()
}

func (h *holding) ended() bool {
	if h.session != nil {
		return h.session.Err() != nil
	}
	return h.lock.Err() != nil
}

// holder is one `bench hold` run.
type holder struct {
	o     *holdOptions
	conns []*sdk.Client

	mu          sync.Mutex // guards what follows
	held        []*holding
	sessions    int
	locks       int
	openErrors  map[string]int
	firstErrors map[string]string
	keepalives  int64
	lostS       int
	lostL       int
}

// countErr files err under its code; mu is held.
func countErr(m map[string]int, first map[string]string, err error) {
	code := string(sdk.CodeOf(err))
	if code == "" {
		code = "unknown" // the set of keys stays bounded: codes are a fixed list
	}
	m[code]++
	if first != nil {
		if _, ok := first[code]; !ok {
			first[code] = err.Error()
		}
	}
}

func benchHold(ctx context.Context, o *holdOptions, _ []string, stdout, stderr io.Writer) int {
	if err := o.check(); err != nil {
		return usagef(stderr, "%v", err)
	}
	opts, err := o.cf.sdkOptions()
	if err != nil {
		return fail(stderr, err)
	}
	h := &holder{o: o, openErrors: map[string]int{}, firstErrors: map[string]string{}}
	for range o.connections {
		c, err := connectSDK(o.cf.url, opts...)
		if err != nil {
			h.closeConns()
			return fail(stderr, err)
		}
		h.conns = append(h.conns, c)
	}
	defer h.closeConns()
	out := func(r HoldResult) {
		if o.asJSON {
			printJSON(stdout, r)
			return
		}
		printHold(stdout, r)
	}

	start := time.Now()
	h.open(ctx)
	opened := time.Now()
	res := h.result("opened", start, opened)
	if h.locks == 0 && h.sessions == 0 {
		out(res)
		return fail(stderr, fmt.Errorf("nothing could be opened: %v", res.FirstErrors))
	}
	out(res)

	// Hold: poll the deadlines, report, until --duration or a signal.
	ka0 := h.poll()
	end := opened.Add(o.duration)
	pollT, reportT := time.NewTicker(o.pollEvery()), time.NewTicker(o.reportEvery)
	interrupted := ctx.Err() != nil
	for !interrupted && time.Now().Before(end) {
		t := time.NewTimer(time.Until(end))
		select {
		case <-ctx.Done():
			interrupted = true
		case <-t.C:
		case <-pollT.C:
			h.poll()
		case <-reportT.C:
			h.poll()
			out(h.heldResult("progress", start, opened, ka0))
		}
		t.Stop()
	}
	pollT.Stop()
	reportT.Stop()
	h.poll()
	res = h.heldResult("done", start, opened, ka0)
	res.Interrupted = interrupted

	// Close everything, even after a signal: bounded on its own.
	closing := time.Now()
	res.Released, res.CloseErrors = h.close()
	res.CloseS = time.Since(closing).Seconds()
	res.ClientCPUS = selfCPU().Seconds()
	res.MaxRSSBytes = peakRSS()
	out(res)
	return 0
}

func (h *holder) closeConns() {
	for _, c := range h.conns {
		_ = c.Close()
	}
}

// open opens every session and its locks (or every auto-renewed lock),
// --concurrency at a time, until done or ctx ends.
func (h *holder) open(ctx context.Context) {
	o := h.o
	n := o.sessions
	if o.kind == holdAutoRenew {
		n = o.sessions * o.perSession
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := h.conns[w%len(h.conns)]
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if o.kind == holdAutoRenew {
					h.openLock(ctx, c, i)
				} else {
					h.openSession(ctx, c, i)
				}
			}
		}()
	}
	wg.Wait()
}

func (h *holder) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	countErr(h.openErrors, h.firstErrors, err)
}

func (h *holder) openSession(ctx context.Context, c *sdk.Client, i int) {
	o := h.o
	rctx, cancel := context.WithTimeout(ctx, o.cf.timeout)
	s, err := sdk.NewSession(rctx, c, sdk.WithSessionTTL(o.ttl))
	cancel()
	if err != nil {
		h.fail(err)
		return
	}
	hd := &holding{session: s, last: s.Deadline()}
	for j := range o.perSession {
		rctx, cancel := context.WithTimeout(ctx, o.cf.timeout)
		_, err := s.Acquire(rctx, holdKey(o.keyPrefix, i, j))
		cancel()
		if err != nil {
			h.fail(err)
			continue
		}
		// The Lock is not kept: the session holds it, its Close releases it.
		hd.locks++
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = append(h.held, hd)
	h.sessions++
	h.locks += hd.locks
}

func (h *holder) openLock(ctx context.Context, c *sdk.Client, i int) {
	o := h.o
	rctx, cancel := context.WithTimeout(ctx, o.cf.timeout)
	l, err := c.Acquire(rctx, holdKey(o.keyPrefix, i/o.perSession, i%o.perSession), sdk.WithLease(o.ttl), sdk.WithAutoRenew())
	cancel()
	if err != nil {
		h.fail(err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = append(h.held, &holding{lock: l, locks: 1, last: l.Deadline()})
	h.locks++
}

// poll counts the deadlines that moved (acknowledged keepalives or
// renewals) and what ended, and returns the keepalives so far.
func (h *holder) poll() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hd := range h.held {
		if hd.lost {
			continue
		}
		if d := hd.deadline(); d.After(hd.last) {
			h.keepalives++
			hd.last = d
		}
		if hd.ended() {
			hd.lost = true
			h.lostL += hd.locks
			if hd.session != nil {
				h.lostS++
			}
		}
	}
	return h.keepalives
}

func (h *holder) result(event string, start, opened time.Time) HoldResult {
	o := h.o
	h.mu.Lock()
	defer h.mu.Unlock()
	r := HoldResult{
		Event: event, Kind: o.kind, Sessions: o.sessions, LocksPerSession: o.perSession, TTLMS: o.ttl.Milliseconds(),
		SessionsOpened: h.sessions, LocksOpened: h.locks, OpenS: opened.Sub(start).Seconds(),
		SessionsLost: h.lostS, LocksLost: h.lostL, LocksHeld: h.locks - h.lostL,
		ClientCPUS: selfCPU().Seconds(),
	}
	if len(h.openErrors) > 0 {
		r.OpenErrors, r.FirstErrors = make(map[string]int, len(h.openErrors)), make(map[string]string, len(h.firstErrors))
		for k, v := range h.openErrors {
			r.OpenErrors[k] = v
		}
		for k, v := range h.firstErrors {
			r.FirstErrors[k] = v
		}
	}
	return r
}

func (h *holder) heldResult(event string, start, opened time.Time, ka0 int64) HoldResult {
	r := h.result(event, start, opened)
	r.HeldS = time.Since(opened).Seconds()
	h.mu.Lock()
	r.Keepalives = h.keepalives - ka0
	h.mu.Unlock()
	if r.HeldS > 0 {
		r.KeepalivesPerS = float64(r.Keepalives) / r.HeldS
	}
	return r
}

// close closes every session (each releasing its locks in one command) or
// releases every lock, --concurrency at a time, within holdCloseTimeout.
func (h *holder) close() (released int, errs map[string]int) {
	ctx, cancel := context.WithTimeout(context.Background(), holdCloseTimeout)
	defer cancel()
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	var mu sync.Mutex
	errs = map[string]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range h.o.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(held) {
					return
				}
				hd := held[i]
				rctx, rcancel := context.WithTimeout(ctx, h.o.cf.timeout)
				n, err := 0, error(nil)
				if hd.session != nil {
					n, err = hd.session.Close(rctx)
				} else if err = hd.lock.Release(rctx); err == nil {
					n = 1
				}
				rcancel()
				mu.Lock()
				released += n
				if err != nil {
					countErr(errs, nil, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) == 0 {
		errs = nil
	}
	return released, errs
}

// peakRSS is this process's peak resident memory (VmHWM), 0 where
// /proc/self/status cannot be read.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

func printHold(w io.Writer, r HoldResult) {
	switch r.Event {
	case "opened":
		fmt.Fprintf(w, "opened (%s, TTL %v): %d of %d sessions, %d of %d locks in %.1fs\n", r.Kind, time.Duration(r.TTLMS)*time.Millisecond,
			r.SessionsOpened, r.Sessions, r.LocksOpened, r.Sessions*r.LocksPerSession, r.OpenS)
	case "progress":
		fmt.Fprintf(w, "holding for %.0fs: %d locks held, %d lost (%d sessions); %.1f keepalives/s\n", r.HeldS, r.LocksHeld, r.LocksLost, r.SessionsLost, r.KeepalivesPerS)
	default:
		fmt.Fprintf(w, "done (%s, TTL %v): held %d of %d locks for %.0fs (%d lost, %d sessions); %d keepalives (%.1f/s); closed in %.1fs, %d locks released\n",
			r.Kind, time.Duration(r.TTLMS)*time.Millisecond, r.LocksHeld, r.LocksOpened, r.HeldS, r.LocksLost, r.SessionsLost, r.Keepalives, r.KeepalivesPerS, r.CloseS, r.Released)
		fmt.Fprintf(w, "  client cpu %.2fs, peak rss %d MiB\n", r.ClientCPUS, r.MaxRSSBytes>>20)
	}
	if len(r.OpenErrors) > 0 {
		fmt.Fprintf(w, "  open errors by code: %v (first: %v)\n", r.OpenErrors, r.FirstErrors)
	}
	if len(r.CloseErrors) > 0 {
		fmt.Fprintf(w, "  close errors by code: %v\n", r.CloseErrors)
	}
	if r.Interrupted {
		fmt.Fprintln(w, "  interrupted before --duration")
	}
}
