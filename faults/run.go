package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ticketd/ticketd/sdk"
)

// Config is one harness run.
type Config struct {
	Name  string
	Mode  string // modeInProcess or modeProcess
	Nodes int
	// Rounds of RoundDuration each: workload and faults, then heal,
	// final reads, drain (every lease ends) and convergence; each round is
	// checked on its own, starting from all keys free.
	Rounds        int
	RoundDuration time.Duration
	Clients       int
	Keys          int
	// SemaphoreLimit > 0 adds two keys to the Keys mutex keys: a
	// counting semaphore of that limit and a read/write lock
	// (kinds_workload.go).
	SemaphoreLimit int
	LeaseMin       time.Duration
	LeaseMax       time.Duration
	MaxWait        time.Duration
	// MaxOpsPerClient and MaxFaultsPerRound bound the loops besides time.
	MaxOpsPerClient   int
	MaxFaultsPerRound int
	Seed              uint64
	// OutDir receives the run's artifacts (node logs, history, porcupine
	// visualizations); kept on failure or when Keep is set.
	OutDir       string
	Keep         bool
	CheckTimeout time.Duration
	Kinds        []string
	// Control forms the in-process cluster through the control plane
	// (bootstrap and joins) and adds the wipe-node fault.
	Control bool
	// Sessions runs the sessions workload beside the lock workload
	// (sessions_workload.go, checked by CheckSessions).
	Sessions bool
	logf     func(format string, args ...any)
}

// Report is what a run found.
type Report struct {
	Config     Config
	Elapsed    time.Duration
	Faults     map[string]int
	Ops        map[OpKind]map[string]int // kind -> ok / fail / indeterminate / outcome detail
	Writes     struct{ Accepted, Fenced int }
	Lin        map[porcupine.CheckResult]int
	Violations []Violation
	Excused    []string
	Notes      []string
	Files      []string
	// Anomalies are legal but notable events, counted.
	Anomalies map[string]int
	// ByLock counts operations per kind of key (mutex, semaphore, rw) as
	// "op:outcome", acquires of a read/write key as "acquire-shared:..."
	// or "acquire-exclusive:..."; FIFOPairs the pairs of grants the FIFO
	// check judged (kinds_check.go).
	ByLock    map[LockKind]map[string]int
	FIFOPairs int
	// Sessions is the sessions workload's line (Config.Sessions), and
	// sessions its history (saved as sessions.json with the artifacts).
	Sessions string
	sessions *SessionHistory
}

func (r *Report) summary() string {
	var b strings.Builder
	keys := fmt.Sprintf("%d keys", r.Config.Keys)
	if r.Config.SemaphoreLimit > 0 {
		keys = fmt.Sprintf("%d mutex keys + a semaphore of %d + a read/write lock", r.Config.Keys, r.Config.SemaphoreLimit)
	}
	fmt.Fprintf(&b, "%s: %d %s nodes, %d rounds x %v, %d clients, %s, seed %d, elapsed %v\n",
		r.Config.Name, r.Config.Nodes, r.Config.Mode, r.Config.Rounds, r.Config.RoundDuration, r.Config.Clients, keys, r.Config.Seed, r.Elapsed.Round(time.Millisecond))
	kinds := sortedKeys(r.Faults)
	total := 0
	for _, k := range kinds {
		total += r.Faults[k]
	}
	fmt.Fprintf(&b, "  faults injected: %d", total)
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s=%d", k, r.Faults[k])
	}
	b.WriteString("\n")
	for _, k := range []OpKind{OpAcquire, OpRelease, OpRenew, OpGet} {
		m := r.Ops[k]
		fmt.Fprintf(&b, "  %-8s ok=%d", k, m["ok"])
		switch k {
		case OpAcquire:
			fmt.Fprintf(&b, " held=%d timeout=%d", m["held"], m["timeout"])
		case OpRelease, OpRenew:
			fmt.Fprintf(&b, " not_found=%d", m["not_found"])
		}
		fmt.Fprintf(&b, " fail=%d indeterminate=%d", m["fail"], m["indeterminate"])
		var details []string
		for _, d := range sortedKeys(m) {
			if strings.Contains(d, ":") {
				details = append(details, fmt.Sprintf("%s=%d", d, m[d]))
			}
		}
		if len(details) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(details, " "))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  resource writes accepted=%d fenced=%d; linearizability per key-round: Ok=%d Illegal=%d Unknown=%d\n",
		r.Writes.Accepted, r.Writes.Fenced, r.Lin[porcupine.Ok], r.Lin[porcupine.Illegal], r.Lin[porcupine.Unknown])
	for _, k := range []LockKind{LockMutex, LockSemaphore, LockRW} {
		m := r.ByLock[k]
		if len(m) == 0 {
			continue
		}
		name := string(k)
		if k == LockMutex {
			name = "mutex"
		}
		fmt.Fprintf(&b, "  %-9s", name)
		for _, d := range sortedKeys(m) {
			fmt.Fprintf(&b, " %s=%d", d, m[d])
		}
		b.WriteString("\n")
	}
	if r.Config.SemaphoreLimit > 0 {
		fmt.Fprintf(&b, "  fifo: grant pairs judged (queued by one leader, no fault near): %d\n", r.FIFOPairs)
	}
	fmt.Fprintf(&b, "  lease overlaps excused by forward clock jumps (fencing held): %d\n", len(r.Excused))
	for _, a := range sortedKeys(r.Anomalies) {
		fmt.Fprintf(&b, "  %s: %d\n", a, r.Anomalies[a])
	}
	if r.Sessions != "" {
		fmt.Fprintf(&b, "  %s\n", r.Sessions)
	}
	fmt.Fprintf(&b, "  violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		b.WriteString("    ")
		b.WriteString(v.String())
		b.WriteString("\n")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// run drives one cluster through the configured rounds and checks them.
func run(cfg Config, c cluster, h *History) *Report {
	start := time.Now()
	rep := &Report{Config: cfg, Faults: map[string]int{}, Ops: map[OpKind]map[string]int{}, Lin: map[porcupine.CheckResult]int{}, Anomalies: map[string]int{},
		ByLock: map[LockKind]map[string]int{}}
	logf := cfg.logf
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7469636b657464))
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("faults/%s/k%d", cfg.Name, i)
	}
	kkeys, kinds := kindKeys(cfg.Name, cfg.SemaphoreLimit)
	keys = append(keys, kkeys...)
	wl := &workload{h: h, res: newResource(h, kinds), keys: keys, kinds: kinds, leaseMin: cfg.LeaseMin, leaseMax: cfg.LeaseMax, maxWait: cfg.MaxWait, opTimeout: 1500 * time.Millisecond}
	workers := make([]*worker, cfg.Clients)
	for i := range workers {
		cl, err := connectClient(c.clientURLs())
		if err != nil {
			rep.Violations = append(rep.Violations, Violation{Checker: "setup", Message: fmt.Sprintf("client %d: %v", i, err)})
			return rep
		}
		defer cl.Close()
		workers[i] = &worker{id: i, cl: cl, rng: rand.New(rand.NewPCG(rng.Uint64(), uint64(i))), w: wl}
	}
	checker, err := connectClient(c.clientURLs())
	if err != nil {
		rep.Violations = append(rep.Violations, Violation{Checker: "setup", Message: err.Error()})
		return rep
	}
	defer checker.Close()
	checkerID := cfg.Clients
	nem := &nemesis{c: c, h: h, rng: rand.New(rand.NewPCG(rng.Uint64(), 1)), kinds: cfg.Kinds, base: c.electionTimeout(), logf: logf, leaseMax: cfg.LeaseMax}
	var sw *sessionWorkload
	if cfg.Sessions {
		sw = newSessionWorkload(c, h, cfg.Name, logf)
		nem.beforeLeaderCrash = sw.beforeLeaderCrash
	}

	liveness := func(round int, what string) {
		rep.Violations = append(rep.Violations, Violation{Checker: "liveness", Round: round, Message: what})
	}
	if cfg.SemaphoreLimit > 0 {
		if !waitLeader(c, 30*time.Second) {
			liveness(0, "no leader within 30s of the start")
		} else if err := waitKinds(checker, cfg.Name, 30*time.Second); err != nil {
			rep.Violations = append(rep.Violations, Violation{Checker: "setup", Message: fmt.Sprintf("the cluster did not serve semaphores within 30s: %v", err)})
			return rep
		}
	}
	reportedExits := 0
	for round := 0; round < cfg.Rounds; round++ {
		h.setRound(round)
		if !waitLeader(c, 30*time.Second) {
			liveness(round, "no leader within 30s before the round")
			for _, e := range c.unexpectedExits()[reportedExits:] {
				rep.Violations = append(rep.Violations, Violation{Checker: "crash", Round: round, Message: e})
			}
			break
		}
		// Every key starts free: a round is checked from a known state.
		if held := drain(h, checker, checkerID, keys, 30*time.Second); len(held) > 0 {
			liveness(round, fmt.Sprintf("keys still held 30s after the previous round: %v", held))
		}
		roundStart := h.Now()
		until := time.Now().Add(cfg.RoundDuration)
		logf("round %d: workload and faults for %v", round, cfg.RoundDuration)
		var wg sync.WaitGroup
		for _, wk := range workers {
			wg.Add(1)
			go func() { defer wg.Done(); wk.run(until, cfg.MaxOpsPerClient) }()
		}
		if sw != nil {
			wg.Add(1)
			seed := rng.Uint64()
			go func() { defer wg.Done(); sw.round(until, seed) }()
		}
		nemDone := make(chan struct{})
		go func() {
			defer close(nemDone)
			// Stop injecting a little before the clients stop, so the
			// last faults are healed under load.
			nem.run(until.Add(-3*c.electionTimeout()), cfg.MaxFaultsPerRound)
		}()
		wg.Wait()
		<-nemDone
		for _, v := range nem.takeViolations() {
			v.Round = round
			rep.Violations = append(rep.Violations, v)
		}
		healedAt := h.Now()
		if !waitLeader(c, 30*time.Second) {
			liveness(round, "no leader within 30s after healing every fault")
		}
		// Final reads right after healing: every acknowledged grant whose
		// lease cannot have ended must still be there.
		for _, k := range keys {
			recordGet(h, checker, checkerID, k, 3*time.Second)
		}
		maxBack := h.backwardJumps()
		if held := drain(h, checker, checkerID, keys, cfg.LeaseMax+maxBack+15*time.Second); len(held) > 0 {
			liveness(round, fmt.Sprintf("keys still held %v after healing (longest lease %v): %v",
				cfg.LeaseMax+maxBack+15*time.Second, cfg.LeaseMax, held))
		}
		if sw != nil {
			if held := sw.drain(checker, sessionTTL+sessionLockDelay+15*time.Second); len(held) > 0 {
				liveness(round, fmt.Sprintf("session keys still held %v after healing: %v", sessionTTL+sessionLockDelay+15*time.Second, held))
			}
		}
		if msg := waitConverged(c, 30*time.Second); msg != "" {
			rep.Violations = append(rep.Violations, Violation{Checker: "convergence", Round: round, Message: msg})
		}
		exits := c.unexpectedExits()
		for _, e := range exits[reportedExits:] {
			rep.Violations = append(rep.Violations, Violation{Checker: "crash", Round: round, Message: e})
		}
		reportedExits = len(exits)
		ops, writes, jumps, faults := h.snapshot(round)
		for _, f := range faults {
			rep.Faults[f.Kind]++
		}
		countOps(rep, ops)
		checkStart := time.Now()
		copt := CheckOptions{Slack: time.Millisecond, LinearizabilityTimeout: cfg.CheckTimeout, VisualizeDir: cfg.OutDir, Faults: faults}
		res := Check(round, ops, writes, jumps, copt)
		if len(res.Violations) > 0 {
			// Visualize every key of a failed round, not only the
			// non-linearizable ones.
			copt.VisualizeAll = true
			res = Check(round, ops, writes, jumps, copt)
		}
		rep.Violations = append(rep.Violations, res.Violations...)
		rep.Excused = append(rep.Excused, res.Excused...)
		rep.Files = append(rep.Files, res.Visualizations...)
		rep.Writes.Accepted += res.Accepted
		rep.Writes.Fenced += res.Fenced
		rep.FIFOPairs += res.FIFOPairs
		for _, k := range res.ReservedKeys {
			rep.Notes = append(rep.Notes, fmt.Sprintf("round %d key %s: linearizable only with the held answers given while another client's acquire was in flight left out (a leader-side reservation, or on a semaphore or read/write key a waiter queued first: see doc.go)", round, k))
			rep.Anomalies["key-rounds linearizable only without held answers a reservation may explain"]++
		}
		for _, v := range res.Linearizable {
			rep.Lin[v]++
		}
		for _, k := range sortedKeys(res.Linearizable) {
			if res.Linearizable[k] == porcupine.Unknown {
				rep.Notes = append(rep.Notes, fmt.Sprintf("round %d key %s: porcupine timed out after %v (inconclusive)", round, k, cfg.CheckTimeout))
			}
		}
		logf("round %d: %d ops, %d faults, healed at %s, checked in %v: %d violations so far",
			round, len(ops), len(faults), ms(healedAt-roundStart), time.Since(checkStart).Round(time.Millisecond), len(rep.Violations))
	}
	// Tokens keep increasing across rounds too (every round starts after
	// the previous one's faults, crashes of every node included).
	all, _, _, _ := h.snapshot(-1)
	byKey := map[string][]Op{}
	for _, o := range all {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	for _, k := range sortedKeys(byKey) {
		check := checkTokens
		if kind, _ := keyKind(byKey[k]); kind != LockMutex {
			check = checkKindsTokens
		}
		for _, v := range check(k, byKey[k]) {
			if v.Ops[0].Round != v.Ops[len(v.Ops)-1].Round {
				v.Checker, v.Round = "tokens-across-rounds", v.Ops[len(v.Ops)-1].Round
				rep.Violations = append(rep.Violations, v)
			}
		}
	}
	if sw != nil {
		sh := sw.history()
		res := CheckSessions(sh)
		for _, v := range res.Violations {
			v.Round = cfg.Rounds - 1
			rep.Violations = append(rep.Violations, v)
		}
		rep.Sessions = sw.summary(sh, res)
		rep.sessions = &sh
	}
	rep.Elapsed = time.Since(start)
	return rep
}

func countOps(rep *Report, ops []Op) {
	for _, o := range ops {
		m := rep.Ops[o.Kind]
		if m == nil {
			m = map[string]int{}
			rep.Ops[o.Kind] = m
		}
		switch o.Result {
		case OutUnknown:
			m["indeterminate"]++
			m["indeterminate:"+o.Code]++
		case OutFail:
			m["fail"]++
			m["fail:"+o.Code]++
		default:
			m[string(o.Result)]++
		}
		if o.Kind == OpAcquire && o.Result == OutTimeout && strings.Contains(o.Err, "after the requester's deadline") {
			rep.Anomalies["acquire timeouts after a grant the server then released itself"]++
		}
	}
	known := map[string]bool{}
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			known[fmt.Sprintf("%s/%d", o.Key, o.Token)] = true
		}
	}
	seen := map[string]bool{}
	for _, o := range ops {
		if o.Kind != OpGet || o.Result != OutOK {
			continue
		}
		for _, t := range shownHolders(o) {
			if id := fmt.Sprintf("%s/%d", o.Key, t); !known[id] && !seen[id] {
				seen[id] = true
				rep.Anomalies["tokens seen by gets that no acquire returned (indeterminate or timed-out grants)"]++
			}
		}
	}
	countByLock(rep, ops)
}

// countByLock counts a round's operations per kind of key.
func countByLock(rep *Report, ops []Op) {
	byKey := map[string][]Op{}
	for _, o := range ops {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	for _, kops := range byKey {
		kind, _ := keyKind(kops)
		m := rep.ByLock[kind]
		if m == nil {
			m = map[string]int{}
			rep.ByLock[kind] = m
		}
		for _, o := range kops {
			name := string(o.Kind)
			if o.Kind == OpAcquire && kind == LockRW {
				name = "acquire-exclusive"
				if o.Shared {
					name = "acquire-shared"
				}
			}
			m[name+":"+string(o.Result)]++
		}
	}
}

// waitLeader polls until some node leads.
func waitLeader(c cluster, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c.leader() >= 0 {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// drain polls every key with recorded gets until all are free, and
// returns the keys still held at the deadline.
func drain(h *History, cl *sdk.Client, client int, keys []string, within time.Duration) []string {
	deadline := time.Now().Add(within)
	pending := append([]string(nil), keys...)
	for len(pending) > 0 && time.Now().Before(deadline) {
		var still []string
		for _, k := range pending {
			held, ok := recordGet(h, cl, client, k, time.Second)
			if held || !ok {
				still = append(still, k)
			}
		}
		pending = still
		if len(pending) > 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return pending
}

// waitConverged polls until every node reports the same applied index and
// lock-table digest; it returns a description of the divergence otherwise.
func waitConverged(c cluster, within time.Duration) string {
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		var views []string
		same := true
		var first string
		for i := 0; i < c.size(); i++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.status(ctx, i)
			cancel()
			if err != nil {
				same = false
				views = append(views, fmt.Sprintf("node %d: %v", i+1, err))
				continue
			}
			v := fmt.Sprintf("applied %d digest %.12s locks %d last_token %d", st.AppliedIndex, st.Digest, st.Locks, st.LastToken)
			views = append(views, fmt.Sprintf("node %d: %s term %d %s", i+1, v, st.Term, st.State))
			if first == "" {
				first = v
			} else if v != first {
				same = false
			}
		}
		if same {
			return ""
		}
		last = strings.Join(views, "; ")
		time.Sleep(50 * time.Millisecond)
	}
	return "replicas did not converge within " + within.String() + ": " + last
}

// outDir creates the directory for a run's artifacts.
func outDir(name string, seed uint64) (string, error) {
	base := os.Getenv("TICKETD_FAULTS_OUT")
	if base == "" {
		base = filepath.Join(os.TempDir(), "ticketd-faults")
	}
	dir := filepath.Join(base, fmt.Sprintf("%s-%s-seed%d", name, time.Now().Format("20060102-150405"), seed))
	return dir, os.MkdirAll(dir, 0o755)
}

// saveHistory writes the JSON history next to the visualizations.
func saveHistory(dir string, cfg Config, h *History, rep *Report) (string, error) {
	ops, writes, jumps, faults := h.snapshot(-1)
	hf := historyFile{Name: cfg.Name, Seed: cfg.Seed, Nodes: cfg.Nodes, Mode: cfg.Mode, Ops: ops, Writes: writes, Jumps: jumps, Faults: faults, Violations: rep.Violations, Excused: rep.Excused}
	path := filepath.Join(dir, "history.json")
	if rep.sessions != nil {
		if err := writeJSON(filepath.Join(dir, "sessions.json"), rep.sessions); err != nil {
			return path, err
		}
	}
	return path, writeJSON(path, hf)
}
