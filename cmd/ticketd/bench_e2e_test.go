package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// TestBenchAgainstLocalNode runs `ticketd bench` against a real `ticketd
// serve` process: both modes report the harness's figures (cycles/s,
// acquire and release percentiles) and the node's CPU per cycle, for the
// pid given and for the processes found in /proc.
func TestBenchAgainstLocalNode(t *testing.T) {
	bin := binary(t)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	p := startServe(t, bin, "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20")
	waitReady(t, bin, url)
	pid := p.cmd.Process.Pid

	for _, pids := range []string{fmt.Sprint(pid), "auto"} {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, "bench", "--nats", url, "--clients", "4", "--keys", "20", "--duration", "1s",
			"--warmup", "200ms", "--mode", "try,wait", "--wait", "1s", "--cpu-pids", pids, "--json")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench --cpu-pids %s: %v\n%s", pids, err, errb.String())
		}
		var res []BenchResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("bench output %q: %v", out.String(), err)
		}
		if len(res) != 2 || res[0].Mode != "try" || res[1].Mode != "wait" {
			t.Fatalf("bench --cpu-pids %s: results %+v, want try then wait", pids, res)
		}
		for _, r := range res {
			if r.Cycles == 0 || r.CyclesPerSec <= 0 || r.Errors != 0 || r.Acquire.P50 <= 0 || r.Acquire.P99 < r.Acquire.P50 ||
				r.Release.P50 <= 0 || r.Release.P99 < r.Release.P50 {
				t.Errorf("%s: figures %+v", r.Mode, r)
			}
			if !slices.Contains(r.NodePids, pid) || r.NodeCPUS <= 0 || r.NodeCPUUSPerCycle <= 0 {
				t.Errorf("%s --cpu-pids %s: node cpu %v s over %v = %v us/cycle; want pid %d charged", r.Mode, pids, r.NodeCPUS, r.NodePids, r.NodeCPUUSPerCycle, pid)
			}
		}
	}
}

// TestBenchLockKinds: --limit, --shared and --read-ratio reach the
// server. Four clients on one key never conflict as holders of a
// semaphore of 4 or as shared holders (a mutex does), a read-ratio run
// takes both kinds of hold, and every result names its lock.
func TestBenchLockKinds(t *testing.T) {
	bin := binary(t)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	startServe(t, bin, "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20")
	waitReady(t, bin, url)

	run := func(mode string, kind ...string) BenchResult {
		t.Helper()
		var out, errb bytes.Buffer
		args := append([]string{"bench", "--nats", url, "--clients", "4", "--keys", "1", "--duration", "1s",
			"--warmup", "200ms", "--mode", mode, "--wait", "1s", "--cpu-pids", "none", "--json"}, kind...)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench %v: %v\n%s", kind, err, errb.String())
		}
		var res []BenchResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res) != 1 {
			t.Fatalf("bench %v output %q: %v", kind, out.String(), err)
		}
		r := res[0]
		if r.Cycles == 0 || r.Errors != 0 || r.Acquire.P50 <= 0 {
			t.Errorf("bench %v: figures %+v", kind, r)
		}
		return r
	}
	if r := run("try"); r.Lock != "mutex" || r.Held == 0 {
		t.Errorf("mutex, 4 clients on one key: lock %q, %d conflicts; want some", r.Lock, r.Held)
	}
	if r := run("try", "--limit", "4"); r.Lock != "semaphore" || r.Limit != 4 || r.Held != 0 {
		t.Errorf("semaphore of 4, 4 clients: lock %q limit %d, %d conflicts; want none", r.Lock, r.Limit, r.Held)
	}
	if r := run("try", "--shared"); r.Lock != "shared" || r.ReadRatio != 1 || r.SharedCycles != r.Cycles || r.Held != 0 {
		t.Errorf("shared, 4 clients: lock %q ratio %v, %d of %d cycles shared, %d conflicts; want all shared, none", r.Lock, r.ReadRatio, r.SharedCycles, r.Cycles, r.Held)
	}
	if r := run("wait", "--read-ratio", "0.5"); r.Lock != "rw" || r.SharedCycles == 0 || r.SharedCycles == r.Cycles {
		t.Errorf("read-ratio 0.5: lock %q, %d of %d cycles shared; want both kinds", r.Lock, r.SharedCycles, r.Cycles)
	}
}

// Bad lock kind flags are usage errors, before anything is sent.
func TestBenchLockKindUsage(t *testing.T) {
	nowhere := []string{"--nats", "nats://127.0.0.1:1", "--timeout", "1s"}
	for _, tc := range []struct {
		args  []string
		names string
	}{
		{[]string{"--limit", "0"}, "--limit 0 is outside [1, 1024]"},
		{[]string{"--read-ratio", "1.5"}, "--read-ratio 1.5 is outside [0, 1]"},
		{[]string{"--shared", "--read-ratio", "0.5"}, "--shared is --read-ratio 1"},
		{[]string{"--limit", "3", "--shared"}, "a semaphore has no shared holds"},
		{[]string{"--limit", "3", "--read-ratio", "0.2"}, "a semaphore has no shared holds"},
	} {
		code, out, errOut := runInProcess(append(append([]string{"bench"}, tc.args...), nowhere...)...)
		first, _, _ := strings.Cut(errOut, "\n")
		if code != exitUsage || out != "" || !strings.Contains(first, tc.names) {
			t.Errorf("bench %v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", tc.args, code, out, first, tc.names)
		}
	}
}

// TestBenchHold runs `ticketd bench hold` against a real node, both
// kinds: everything it opens is held, kept alive at the SDK's rate (the
// TTL's keepalive interval: (2 s - 200 ms)/3 = 600 ms), nothing is lost,
// and the close releases every lock (the node holds none afterwards).
func TestBenchHold(t *testing.T) {
	bin := binary(t)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	startServe(t, bin, "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20")
	waitReady(t, bin, url)
	waitSessions(t, url, 1)
	for _, tc := range []struct {
		kind           string
		sessions, want int // sessions opened, items kept alive
	}{
		{"sessions", 20, 20},
		{"auto-renew", 0, 60},
	} {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, "bench", "hold", "--nats", url, "--kind", tc.kind, "--sessions", "20", "--locks-per-session", "3",
			"--session-ttl", "2s", "--duration", "3s", "--report-every", "1s", "--concurrency", "8", "--connections", "2", "--json")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench hold --kind %s: %v\n%s", tc.kind, err, errb.String())
		}
		var lines []HoldResult
		dec := json.NewDecoder(&out)
		for dec.More() {
			var r HoldResult
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("bench hold output: %v", err)
			}
			lines = append(lines, r)
		}
		if len(lines) < 3 || lines[0].Event != "opened" || lines[1].Event != "progress" || lines[len(lines)-1].Event != "done" {
			t.Fatalf("--kind %s: events %+v; want opened, progress..., done", tc.kind, lines)
		}
		done := lines[len(lines)-1]
		if done.Kind != tc.kind || done.SessionsOpened != tc.sessions || done.LocksOpened != 60 || done.LocksHeld != 60 || done.LocksLost != 0 ||
			done.Released != 60 || len(done.OpenErrors) != 0 || len(done.CloseErrors) != 0 || done.MaxRSSBytes <= 0 {
			t.Errorf("--kind %s: done %+v", tc.kind, done)
		}
		// 600 ms between keepalives of each item: between half and twice that rate.
		rate := float64(tc.want) / 0.6
		if done.KeepalivesPerS < rate/2 || done.KeepalivesPerS > rate*2 {
			t.Errorf("--kind %s: %.1f keepalives/s, want about %.0f", tc.kind, done.KeepalivesPerS, rate)
		}
		v, _, code := cli(t, bin, "status", "--nats", url, "--timeout", "2s")
		if code != 0 || v["locks"] != float64(0) {
			t.Errorf("--kind %s: after the close the node holds %v locks (status exit %d)", tc.kind, v["locks"], code)
		}
	}
}

// Bad `bench hold` flags are usage errors, before anything is sent.
func TestBenchHoldUsage(t *testing.T) {
	nowhere := []string{"--nats", "nats://127.0.0.1:1", "--timeout", "1s"}
	for _, tc := range []struct {
		args  []string
		names string
	}{
		{[]string{"--kind", "leases"}, `--kind "leases" is neither sessions nor auto-renew`},
		{[]string{"--sessions", "0"}, "--sessions 0 is outside [1, 131072]"},
		{[]string{"--sessions", "200000"}, "--sessions 200000 is outside [1, 131072]"},
		{[]string{"--locks-per-session", "-1"}, "--locks-per-session -1 is outside [0, 10000]"},
		{[]string{"--sessions", "100000", "--locks-per-session", "11"}, "more than a cluster holds (1048576)"},
		{[]string{"--kind", "auto-renew", "--locks-per-session", "0"}, "holds nothing"},
		{[]string{"--session-ttl", "500ms"}, "--session-ttl 500ms is outside [1s, 24h0m0s]"},
		{[]string{"--session-ttl", "1500us"}, "finer than a millisecond"},
		{[]string{"--duration", "0s"}, "--duration 0s is outside (0, 24h0m0s]"},
		{[]string{"--concurrency", "0"}, "--concurrency 0 is outside [1, 1024]"},
		{[]string{"--connections", "65"}, "--connections 65 is outside [1, 64]"},
		{[]string{"--report-every", "10ms"}, "--report-every 10ms is outside [1s, 1h0m0s]"},
		{[]string{"--key-prefix", strings.Repeat("k", 600)}, "--key-prefix"},
	} {
		code, out, errOut := runInProcess(append(append([]string{"bench", "hold"}, tc.args...), nowhere...)...)
		first, _, _ := strings.Cut(errOut, "\n")
		if code != exitUsage || out != "" || !strings.Contains(first, tc.names) {
			t.Errorf("bench hold %v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", tc.args, code, out, first, tc.names)
		}
	}
}

// sessionsClusterVersion is the cluster version that serves sessions
// (lockservice's sessionsVersion).
const sessionsClusterVersion = 4

// waitSessions waits until node id at url runs a cluster version that
// serves sessions: a new leader raises the version after its election.
func waitSessions(t *testing.T, url string, id int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, "a cluster version serving sessions", func() bool {
		st, err := nodeStatus(url, id)
		return err == nil && st.ClusterVersion >= sessionsClusterVersion
	})
}
