package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// settledCluster starts n in-process nodes and waits until the leader has
// raised the cluster version (renew needs it).
func settledCluster(t *testing.T, n int) *testcluster.Cluster {
	t.Helper()
	c := testcluster.New(t, n)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	return c
}

func sdkClient(t *testing.T, url string) *sdk.Client {
	t.Helper()
	cl, err := sdk.New(testkit.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// cliRun is a finished CLI process.
type cliRun struct {
	stdout, stderr string
	code           int
}

// runCLI runs the binary to completion.
func runCLI(t *testing.T, bin string, args ...string) cliRun {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliRun{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// background is a CLI process still running, its output collected.
type background struct {
	cmd         *exec.Cmd
	out, errOut *lockedWriter
	done        chan struct{}
}

func startCLI(t *testing.T, bin string, args ...string) *background {
	t.Helper()
	b := &background{cmd: exec.Command(bin, args...), out: &lockedWriter{w: &bytes.Buffer{}},
		errOut: &lockedWriter{w: &bytes.Buffer{}}, done: make(chan struct{})}
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.errOut
	// A process it left behind may hold the output pipes open: do not
	// wait for them for long once it exited.
	b.cmd.WaitDelay = 5 * time.Second
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		select {
		case <-b.done:
		default:
			_ = b.cmd.Process.Kill()
			<-b.done
		}
		if t.Failed() {
			t.Logf("%v\nstdout:\n%s\nstderr:\n%s", b.cmd.Args, b.stdout(), b.stderr())
		}
	})
	return b
}

func (b *background) stdout() string {
	b.out.mu.Lock()
	defer b.out.mu.Unlock()
	return b.out.w.String()
}
func (b *background) stderr() string {
	b.errOut.mu.Lock()
	defer b.errOut.mu.Unlock()
	return b.errOut.w.String()
}

// wait waits for the process to exit and returns its status.
func (b *background) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(within):
		t.Fatalf("%v still runs after %v", b.cmd.Args, within)
	}
	return b.cmd.ProcessState.ExitCode()
}

// TestLockExecChildStatusAndEnv: exec runs the command with TICKETD_KEY
// and TICKETD_TOKEN, exits with its status (128+N when signal N ended
// it), and releases the lock afterwards; a command that cannot be found
// is 127.
func TestLockExecChildStatusAndEnv(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 1)
	url := c.ClientURL(0)
	cl := sdkClient(t, url)
	cases := []struct {
		name   string
		script []string
		want   int
	}{
		{"exit 7", []string{"sh", "-c", `echo "key=$TICKETD_KEY token=$TICKETD_TOKEN"; exit 7`}, 7},
		{"exit 0", []string{"sh", "-c", `echo "key=$TICKETD_KEY token=$TICKETD_TOKEN"`}, 0},
		{"killed by SIGTERM", []string{"sh", "-c", `echo "key=$TICKETD_KEY token=$TICKETD_TOKEN"; kill -TERM $$`}, 128 + 15},
		{"not found", []string{"/nonexistent/command"}, exitNotFound},
	}
	var last uint64
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, bin, append([]string{"lock", "exec", "exec/env", "--nats", url, "--lease", "5s", "--"}, tc.script...)...)
			if r.code != tc.want {
				t.Fatalf("exit %d, want %d; stderr %q", r.code, tc.want, r.stderr)
			}
			if tc.want != exitNotFound {
				var key string
				var tok uint64
				if _, err := fmt.Sscanf(strings.TrimSpace(r.stdout), "key=%s token=%d", &key, &tok); err != nil || key != "exec/env" || tok <= last {
					t.Fatalf("child saw %q (want key exec/env and a token above %d)", r.stdout, last)
				}
				last = tok
			}
			h, err := cl.Get(t.Context(), "exec/env")
			if err != nil || h.Held {
				t.Fatalf("after exec: %+v %v, want released", h, err)
			}
		})
	}
	// A background process the command leaves behind in its group does
	// not outlive the lock, which is released right after.
	pidFile := filepath.Join(t.TempDir(), "pid")
	if r := runCLI(t, bin, "lock", "exec", "exec/env", "--nats", url, "--lease", "5s", "--",
		"sh", "-c", `sleep 60 >/dev/null 2>&1 & echo $! > "$0"`, pidFile); r.code != 0 {
		t.Fatalf("exec with a background child: exit %d %q", r.code, r.stderr)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the background child gone", func() bool {
		// Gone, or a zombie about to be reaped by init.
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(st), ") Z ")
	})
	if r := runCLI(t, bin, "lock", "exec", "exec/env", "--nats", url, "sh", "-c", "true"); r.code != exitUsage {
		t.Fatalf("exec without --: exit %d %q", r.code, r.stderr)
	}
	if r := runCLI(t, bin, "lock", "exec", "exec/env", "--nats", url, "--lease", "1s", "--grace", "5s", "--", "true"); r.code != exitUsage {
		t.Fatalf("grace longer than the lease allows: exit %d %q", r.code, r.stderr)
	}
}

// TestLockExecRenewsPastLeases: with a 1 s lease, a 3.5 s command keeps
// the lock the whole time with the same token (renewed past three
// leases), and the lock is released when it ends.
func TestLockExecRenewsPastLeases(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 3)
	url := c.ClientURL(0)
	cl := sdkClient(t, url)
	p := startCLI(t, bin, "lock", "exec", "exec/long", "--nats", url, "--lease", "1s", "--grace", "200ms", "--",
		"sh", "-c", `echo "$TICKETD_TOKEN"; sleep 3.5; echo end`)
	var token uint64
	testkit.Eventually(t, 10*time.Second, "the command started", func() bool {
		token, _ = strconv.ParseUint(strings.TrimSpace(strings.Split(p.stdout(), "\n")[0]), 10, 64)
		return token > 0
	})
	start := time.Now()
	checks := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-p.done:
			running = false
		case <-tick.C:
			h, err := cl.Get(t.Context(), "exec/long")
			if strings.Contains(p.stdout(), "end") { // the command ended: exec releases
				running = false
				continue
			}
			if err != nil || !h.Held || h.Token != token {
				t.Fatalf("%v into the command: %+v %v, want held with token %d", time.Since(start), h, err, token)
			}
			checks++
		}
	}
	ran := time.Since(start)
	if code := p.wait(t, 10*time.Second); code != 0 || ran < 3*time.Second {
		t.Fatalf("exit %d after %v; stderr %q", code, ran, p.stderr())
	}
	h, err := cl.Get(t.Context(), "exec/long")
	if err != nil || h.Held {
		t.Fatalf("after the command: %+v %v, want released", h, err)
	}
	t.Logf("held with token %d for %v across %d checks (lease 1s)", token, ran, checks)
}

var (
	deadlineRE = regexp.MustCompile(`the lock's deadline is (\S+) \(in `)
	endedRE    = regexp.MustCompile(`the command ended (-?\S+) before the lock's deadline`)
)

// TestLockExecStopsChildBeforeDeadline: the whole cluster dies under exec;
// the command gets SIGTERM (and, if it ignores it, SIGKILL after --grace)
// and is dead before the lock's local deadline. The margin is logged.
func TestLockExecStopsChildBeforeDeadline(t *testing.T) {
	bin := binary(t)
	for _, tc := range []struct {
		name, script string
		want         int
	}{
		// Records when SIGTERM arrived, then exits 0.
		{"honours SIGTERM", `trap 'date +%s.%N > "$OUT"; exit 0' TERM; echo up; while :; do sleep 0.05; done`, 0},
		// Ignores SIGTERM; only SIGKILL stops it.
		{"ignores SIGTERM", `trap '' TERM; echo up; while :; do sleep 0.05; done`, 128 + 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := settledCluster(t, 3)
			out := filepath.Join(t.TempDir(), "term")
			p := startCLI(t, bin, "lock", "exec", "exec/kill", "--nats", c.ClientURL(0), "--lease", "2s", "--grace", "300ms", "--",
				"sh", "-c", "OUT="+out+"; "+tc.script)
			testkit.Eventually(t, 10*time.Second, "the command started", func() bool { return strings.Contains(p.stdout(), "up") })
			killed := time.Now()
			c.Close()
			code := p.wait(t, 10*time.Second)
			if code != tc.want {
				t.Fatalf("exit %d, want %d", code, tc.want)
			}
			m := deadlineRE.FindStringSubmatch(p.stderr())
			if m == nil {
				t.Fatalf("no deadline reported: %q", p.stderr())
			}
			deadline, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				t.Fatal(err)
			}
			e := endedRE.FindStringSubmatch(p.stderr())
			if e == nil {
				t.Fatalf("no end reported: %q", p.stderr())
			}
			ended, err := time.ParseDuration(e[1])
			if err != nil || ended <= 0 {
				t.Fatalf("the command ended %q before the deadline, want > 0", e[1])
			}
			if b, err := os.ReadFile(out); err == nil {
				sec, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
				termAt := time.Unix(0, int64(sec*1e9))
				if !termAt.Before(deadline) {
					t.Fatalf("SIGTERM reached the command %v after the deadline", termAt.Sub(deadline))
				}
				t.Logf("SIGTERM reached the command %v before the lock's deadline", deadline.Sub(termAt).Round(time.Millisecond))
			} else if tc.want == 0 {
				t.Fatalf("the command never recorded SIGTERM: %v", err)
			}
			t.Logf("cluster killed; the command was dead %v before the lock's deadline (%v after the kill)", ended, time.Until(deadline)+time.Since(killed)-ended)
		})
	}
}

// TestLockExecCommandDiesWithExec: when `ticketd lock exec` itself is
// killed with SIGKILL (no renewal, no cleanup of its own), the command and
// a background process it started are gone at once, long before the lease
// they were running under can end.
func TestLockExecCommandDiesWithExec(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lock exec's guard needs a parent-death signal (Linux)")
	}
	bin := binary(t)
	c := settledCluster(t, 1)
	pids := filepath.Join(t.TempDir(), "pids")
	p := startCLI(t, bin, "lock", "exec", "exec/orphan", "--nats", c.ClientURL(0), "--lease", "30s", "--",
		"sh", "-c", `sleep 600 & echo "$$ $!" > "$0.tmp"; mv "$0.tmp" "$0"; echo up; wait`, pids)
	testkit.Eventually(t, 10*time.Second, "the command started", func() bool { return strings.Contains(p.stdout(), "up") })
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	var shell, sleeper int
	if _, err := fmt.Sscanf(string(b), "%d %d", &shell, &sleeper); err != nil {
		t.Fatalf("pids %q: %v", b, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(shell, syscall.SIGKILL); _ = syscall.Kill(sleeper, syscall.SIGKILL) })
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{shell, sleeper} {
		testkit.Eventually(t, 5*time.Second, fmt.Sprintf("process %d gone after lock exec was killed", pid), func() bool {
			// Gone, or a zombie about to be reaped by init.
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(st), ") Z ")
		})
	}
	t.Logf("command and its background child gone %v after lock exec was killed (lease 30s)", time.Since(killed).Round(time.Millisecond))
}

// TestLockExecGuardSurvivesGroupSignals: a signal sent to the command's
// process group (SIGQUIT, which would end a Go program with a stack dump,
// and SIGUSR1; the command ignores both) does not end the guard in front
// of it: the command runs on and lock exec exits with its status.
func TestLockExecGuardSurvivesGroupSignals(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lock exec's guard is Linux only")
	}
	bin := binary(t)
	c := settledCluster(t, 1)
	dir := t.TempDir()
	pgidFile, goFile := filepath.Join(dir, "pgid"), filepath.Join(dir, "go")
	p := startCLI(t, bin, "lock", "exec", "exec/signals", "--nats", c.ClientURL(0), "--lease", "30s", "--",
		"sh", "-c", `trap '' QUIT USR1; cut -d' ' -f5 /proc/$$/stat > "$0.tmp"; mv "$0.tmp" "$0"; echo up; while [ ! -e "$1" ]; do sleep 0.02; done`,
		pgidFile, goFile)
	testkit.Eventually(t, 10*time.Second, "the command started", func() bool { return strings.Contains(p.stdout(), "up") })
	b, err := os.ReadFile(pgidFile)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pgid <= 1 {
		t.Fatalf("process group %q: %v", b, err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGQUIT, syscall.SIGUSR1} {
		if err := syscall.Kill(-pgid, sig); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGQUIT and SIGUSR1 to the group, want the command's 0; stderr %q", code, p.stderr())
	}
}

// TestLockLsAndRenew: ls lists exactly the held keys under a prefix, in
// order, across pages; renew lengthens a lock from the CLI.
func TestLockLsAndRenew(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 3)
	url := c.ClientURL(1)
	cl := sdkClient(t, url)
	var want []string
	for i := 0; i < 23; i++ {
		k := fmt.Sprintf("ls/a/%02d", i)
		want = append(want, k)
		if _, err := cl.Acquire(t.Context(), k, sdk.WithLease(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"ls/b/0", "ls/a", "ls/", "lt/a/0"} {
		if _, err := cl.Acquire(t.Context(), k, sdk.WithLease(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// A released one is not listed.
	gone, err := cl.Acquire(t.Context(), "ls/a/zz", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, bin, "lock", "ls", "ls/a/", "--limit", "5", "--nats", url)
	if r.code != 0 {
		t.Fatalf("ls: exit %d %q", r.code, r.stderr)
	}
	var got []string
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var v struct {
			Key   string `json:"key"`
			Token uint64 `json:"token"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v.Token == 0 {
			t.Fatalf("ls line %q: %v", sc.Text(), err)
		}
		got = append(got, v.Key)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ls ls/a/ listed\n%v\nwant\n%v", got, want)
	}

	v, _, code := cli(t, bin, "lock", "acquire", "renew/cli", "--lease", "1s", "--nats", url)
	if code != 0 {
		t.Fatalf("acquire exit %d", code)
	}
	tok := token(t, v)
	v, stderr, code := cli(t, bin, "lock", "renew", "renew/cli", fmt.Sprint(tok), "--lease", "30s", "--nats", url)
	if code != 0 || token(t, v) != tok || v["lease_ms"] != float64(30000) {
		t.Fatalf("renew: exit %d %v %q", code, v, stderr)
	}
	_, stderr, code = cli(t, bin, "lock", "renew", "renew/cli", fmt.Sprint(tok+1000), "--nats", url)
	if code != exitFailure || !strings.Contains(stderr, "error: not_found:") {
		t.Fatalf("renew with a wrong token: exit %d %q", code, stderr)
	}
}

// TestLockWatchPrintsEvents: watch prints a line for the grant, renewal
// and release of the key, each once, in index order, and nothing of other
// keys; SIGINT ends it with status 0.
func TestLockWatchPrintsEvents(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 3)
	url := c.ClientURL(0)
	cl := sdkClient(t, url)
	p := startCLI(t, bin, "lock", "watch", "watch/k", "--nats", url)
	testkit.Eventually(t, 10*time.Second, "watching", func() bool { return strings.Contains(p.stderr(), "watching") })
	if _, err := cl.Acquire(t.Context(), "watch/other"); err != nil {
		t.Fatal(err)
	}
	l, err := cl.Acquire(t.Context(), "watch/k", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	var events []sdk.WatchEvent
	testkit.Eventually(t, 10*time.Second, "three events", func() bool {
		events = events[:0]
		for _, line := range strings.Split(strings.TrimSpace(p.stdout()), "\n") {
			var ev sdk.WatchEvent
			if json.Unmarshal([]byte(line), &ev) == nil {
				events = append(events, ev)
			}
		}
		return len(events) >= 3
	})
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("watch exited %d after SIGINT", code)
	}
	var types []string
	for i, ev := range events {
		if ev.Key != "watch/k" || ev.Token != l.Token || (i > 0 && ev.Index <= events[i-1].Index) {
			t.Fatalf("event %d: %+v", i, ev)
		}
		types = append(types, ev.Type)
	}
	if fmt.Sprint(types) != "[grant renew release]" {
		t.Fatalf("events %v, want grant, renew, release", types)
	}
}
