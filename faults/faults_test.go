package faults

import (
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Environment variables of the harness (see doc.go).
const (
	envLong     = "TICKETD_FAULTS_LONG"
	envDuration = "TICKETD_FAULTS_DURATION"
	envNodes    = "TICKETD_FAULTS_NODES"
	envSeed     = "TICKETD_FAULTS_SEED"
	envOut      = "TICKETD_FAULTS_OUT"
	envKeep     = "TICKETD_FAULTS_KEEP"
	envReplay   = "TICKETD_FAULTS_REPLAY"
	envControl  = "TICKETD_FAULTS_CONTROL"
	envKinds    = "TICKETD_FAULTS_KINDS"
)

// defaultSemaphoreLimit is the limit of the workload's semaphore key
// (TICKETD_FAULTS_KINDS overrides it; 0 leaves the semaphore and
// read/write keys out).
const defaultSemaphoreLimit = 3

func testConfig(t *testing.T, mode string) Config {
	t.Helper()
	cfg := Config{
		Name:              mode,
		Mode:              mode,
		Nodes:             3,
		Rounds:            2,
		RoundDuration:     12 * time.Second,
		Clients:           8,
		Keys:              3,
		SemaphoreLimit:    defaultSemaphoreLimit,
		LeaseMin:          300 * time.Millisecond,
		LeaseMax:          2 * time.Second,
		MaxWait:           time.Second,
		MaxOpsPerClient:   10000,
		MaxFaultsPerRound: 1000,
		CheckTimeout:      20 * time.Second,
		logf:              t.Logf,
	}
	long := os.Getenv(envLong) == "1"
	switch {
	case long:
		d := 10 * time.Minute
		if v := os.Getenv(envDuration); v != "" {
			var err error
			if d, err = time.ParseDuration(v); err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a positive duration like 10m", envDuration, v)
			}
		}
		cfg.RoundDuration = 30 * time.Second
		cfg.Rounds = max(1, int((d+cfg.RoundDuration-1)/cfg.RoundDuration))
		cfg.Clients, cfg.Keys = 10, 4
		cfg.CheckTimeout = time.Minute
		cfg.Keep = true
	case testing.Short():
		cfg.Rounds, cfg.RoundDuration, cfg.Clients = 1, 7*time.Second, 6
	}
	if v := os.Getenv(envNodes); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 3 && n != 5) {
			t.Fatalf("%s=%q: want 3 or 5", envNodes, v)
		}
		cfg.Nodes = n
	}
	if v := os.Getenv(envKinds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n == 1 || n > kindsMaxLimit {
			t.Fatalf("%s=%q: want a semaphore limit in [2, %d], or 0 for no semaphore and read/write keys", envKinds, v, kindsMaxLimit)
		}
		cfg.SemaphoreLimit = n
	}
	cfg.Seed = rand.Uint64() >> 1
	if v := os.Getenv(envSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", envSeed, v)
		}
		cfg.Seed = s
	}
	cfg.Keep = cfg.Keep || os.Getenv(envKeep) == "1" || os.Getenv(envOut) != ""
	cfg.Kinds = kindsFor(mode, cfg.Nodes)
	// Sessions need a real-rate lease clock on every node: the process
	// driver has no clock jumps (sessions_check.go).
	cfg.Sessions = mode == modeProcess
	// Control-plane mode (in-process only): always on in long mode.
	if mode == modeInProcess && (long || os.Getenv(envControl) == "1") {
		cfg.Control = true
		cfg.Kinds = append(cfg.Kinds, FaultWipeNode)
	}
	dir, err := outDir(cfg.Name, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	cfg.OutDir = dir
	t.Logf("%s run: seed %d (%s=%d reproduces the fault schedule), artifacts in %s", mode, cfg.Seed, envSeed, cfg.Seed, dir)
	return cfg
}

// finish logs the report, keeps the artifacts on failure, and fails the
// test on any violation.
func finish(t *testing.T, cfg Config, h *History, rep *Report) {
	t.Helper()
	sum := rep.summary()
	t.Log("\n" + sum)
	failed := len(rep.Violations) > 0
	if failed || cfg.Keep {
		path, err := saveHistory(cfg.OutDir, cfg, h, rep)
		if err != nil {
			t.Errorf("save history: %v", err)
		}
		_ = os.WriteFile(filepath.Join(cfg.OutDir, "summary.txt"), []byte(sum), 0o644)
		t.Logf("history written to %s (replay: %s=%s go test -run TestReplay ./faults/)", path, envReplay, path)
		for _, f := range rep.Files {
			t.Logf("porcupine visualization: %s", f)
		}
		t.Logf("artifacts kept in %s", cfg.OutDir)
	} else {
		_ = os.RemoveAll(cfg.OutDir)
	}
	if failed {
		t.Errorf("%d safety or liveness violations (history in %s)", len(rep.Violations), cfg.OutDir)
	}
}

func nodeLogger(dir string) (*slog.Logger, func(), error) {
	f, err := os.Create(filepath.Join(dir, "nodes.log"))
	if err != nil {
		return nil, nil, err
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn})), func() { _ = f.Close() }, nil
}

// TestInProcessFaults: 3 (or 5) daemon.Start nodes in this process under
// crashes (Close and restart), partitions and one-way loss (peer
// filters), flaky links, and forward and backward jumps of the leader's
// lease clock, with a concurrent SDK workload; every round is checked.
func TestInProcessFaults(t *testing.T) {
	cfg := testConfig(t, modeInProcess)
	log, closeLog, err := nodeLogger(cfg.OutDir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	start := startInProcess
	if cfg.Control {
		start = startInProcessControl
	}
	c, err := start(t, cfg.Nodes, log, 25, 10)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	rep := run(cfg, c, h)
	c.close()
	finish(t, cfg, h, rep)
}

// TestInProcessWipe: a cluster formed through the control plane, one
// wipe-node fault under the workload (a node closed, its data deleted, a
// fresh node replacing it under a new identity), then every checker. The
// long and TICKETD_FAULTS_CONTROL=1 runs of TestInProcessFaults mix
// wipes with every other fault.
func TestInProcessWipe(t *testing.T) {
	if testing.Short() {
		t.Skip("wipe run skipped in -short mode")
	}
	cfg := testConfig(t, modeInProcess)
	cfg.Name = "inprocess-wipe"
	cfg.Control = true
	cfg.Rounds, cfg.RoundDuration, cfg.Clients = 1, 6*time.Second, 6
	cfg.Kinds, cfg.MaxFaultsPerRound = []string{FaultWipeNode}, 1
	log, closeLog, err := nodeLogger(cfg.OutDir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	c, err := startInProcessControl(t, cfg.Nodes, log, 25, 10)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	rep := run(cfg, c, h)
	c.close()
	if rep.Faults[FaultWipeNode] != 1 {
		t.Errorf("%d wipe-node faults injected, want 1", rep.Faults[FaultWipeNode])
	}
	finish(t, cfg, h, rep)
}

// TestInProcessStorageFaults: only storage faults under the workload: a
// node's log fsync fails (it must stop, fail-stop), a node's disk fills
// (the ballast keeps it going, a leader hands over), a node restarted on
// a full disk (the start must be refused at once), each healed, then
// every checker: no lost acknowledged grant or release, one digest.
func TestInProcessStorageFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("storage fault run skipped in -short mode")
	}
	cfg := testConfig(t, modeInProcess)
	cfg.Name = "inprocess-storage"
	cfg.Rounds, cfg.RoundDuration, cfg.Clients = 1, 10*time.Second, 6
	cfg.Kinds, cfg.MaxFaultsPerRound = []string{FaultDiskSync, FaultDiskFull, FaultDiskFullRestart}, 6
	log, closeLog, err := nodeLogger(cfg.OutDir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeLog()
	c, err := startInProcess(t, cfg.Nodes, log, 25, 10)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	rep := run(cfg, c, h)
	c.close()
	if n := rep.Faults[FaultDiskSync] + rep.Faults[FaultDiskFull] + rep.Faults[FaultDiskFullRestart]; n < 2 {
		t.Errorf("%d storage faults injected, want at least 2", n)
	}
	finish(t, cfg, h, rep)
}

// TestProcessFaults: 3 (or 5) real `ticketd serve` processes under kill -9
// of the leader, of followers, of a majority and of every node,
// SIGSTOP/SIGCONT pauses, and partitions, one-way loss and blackholes on
// proxied raft links.
func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level fault run skipped in -short mode")
	}
	cfg := testConfig(t, modeProcess)
	c := mustStartProcesses(t, cfg.OutDir, cfg.Nodes)
	h := NewHistory()
	rep := run(cfg, c, h)
	c.close()
	finish(t, cfg, h, rep)
}

// TestReplay re-checks a history written by a failed (or kept) run:
//
//	TICKETD_FAULTS_REPLAY=/tmp/ticketd-faults/.../history.json go test -run TestReplay -v ./faults/
func TestReplay(t *testing.T) {
	path := os.Getenv(envReplay)
	if path == "" {
		t.Skip("set " + envReplay + " to a history.json to re-check it")
	}
	hf, err := readHistoryFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rounds := map[int][]Op{}
	for _, o := range hf.Ops {
		rounds[o.Round] = append(rounds[o.Round], o)
	}
	dir := filepath.Join(filepath.Dir(path), "replay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	total := 0
	for r := 0; r < len(rounds); r++ {
		var writes []Write
		for _, w := range hf.Writes {
			if w.Round == r {
				writes = append(writes, w)
			}
		}
		// The round's faults, as the run passed them (the FIFO check
		// judges only pairs no fault came near).
		var faults []Fault
		for _, f := range hf.Faults {
			if f.Round == r {
				faults = append(faults, f)
			}
		}
		res := Check(r, rounds[r], writes, hf.Jumps, CheckOptions{Slack: time.Millisecond, LinearizabilityTimeout: 5 * time.Minute, VisualizeDir: dir, VisualizeAll: true, Faults: faults})
		t.Logf("round %d: %d ops, linearizable %v (only without reserved held answers: %v), writes accepted %d fenced %d, %d excused overlaps",
			r, len(rounds[r]), res.Linearizable, res.ReservedKeys, res.Accepted, res.Fenced, len(res.Excused))
		for _, v := range res.Violations {
			t.Log(v.String())
		}
		total += len(res.Violations)
	}
	t.Logf("visualizations of every key in %s", dir)
	if total > 0 {
		t.Errorf("%d violations", total)
	}
}
