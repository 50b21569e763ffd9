//go:build unix

package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/pgtest"
)

// pgServer is this test binary's PostgreSQL server, started once in
// TestMain (nil: none, and pgSkip says why).
var (
	pgServer *pgtest.Server
	pgSkip   string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := pgtest.Start(ctx)
		cancel()
		switch {
		case err == nil:
			pgServer = s
		case pgtest.SkipReason(err) != "":
			pgSkip = pgtest.SkipReason(err)
		default:
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if pgServer != nil {
		pgServer.Stop()
	}
	os.Exit(code)
}

// Deadlines of the scenario's steps: far above what each takes (about a
// second), so a loaded machine does not fail the test.
const (
	lease        = time.Second
	stepDeadline = 30 * time.Second
)

// TestKleppmann runs README.md's scenario with real processes: a ticketd
// node, PostgreSQL, and two workers on one key. A takes the lock, reads
// the note and stops (SIGSTOP) just before its write; its lease runs out
// while it is stopped; B takes the lock with a higher token, appends its
// line and writes; A resumes and writes the note as it read it plus its
// own line. With the fence, A's write is refused in the database and the
// note holds B's line; without it, A's write lands and B's line is lost.
func TestKleppmann(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	if pgServer == nil {
		t.Skip(pgSkip)
	}
	bins := t.TempDir()
	ticketd, worker := filepath.Join(bins, "ticketd"), filepath.Join(bins, "fencing")
	built := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, b := range [][2]string{{ticketd, "github.com/ticketd/ticketd/cmd/ticketd"}, {worker, "."}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build %s: %w\n%s", b[1], err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("built ticketd and the worker in %v", time.Since(built).Round(time.Millisecond))
	addr := testkit.FreeAddr(t)
	nats := "nats://" + addr
	start(t, "ticketd", ticketd, "serve", "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20", "--disk-ballast-bytes", "-1")
	testkit.Eventually(t, stepDeadline, "the ticketd node to lead", func() bool {
		out, err := exec.Command(ticketd, "status", "--nats", nats, "--timeout", "1s").Output()
		return err == nil && bytes.Contains(out, []byte(`"StateLeader"`))
	})
	// The resource's trust, as an operator configures it: the cluster ID
	// and public keys `ticketd fence pubkey --json` prints. The leader
	// makes the cluster's first key shortly after it leads.
	trusted := filepath.Join(t.TempDir(), "trusted-keys.json")
	testkit.Eventually(t, stepDeadline, "the cluster's first fence key", func() bool {
		out, err := exec.Command(ticketd, "fence", "pubkey", "--json", "--nats", nats, "--timeout", "1s").Output()
		return err == nil && os.WriteFile(trusted, out, 0o600) == nil
	})

	for _, fenced := range []bool{true, false} {
		t.Run(fmt.Sprintf("fence=%v", fenced), func(t *testing.T) {
			key := fmt.Sprintf("notes/fence-%v", fenced)
			db, dsn := pgServer.NewSchema(t)
			run := func(args ...string) []string {
				return append(args, "--pg", dsn, "--key", key, "--nats", nats, "--lease", lease.String(), "--fence="+strconv.FormatBool(fenced))
			}
			if out, err := exec.Command(worker, "setup", "--pg", dsn, "--key", key).CombinedOutput(); err != nil {
				t.Fatalf("setup: %v\n%s", err, out)
			}

			// A's resource trusts the keys from the file, B's asks the
			// cluster (the SDK's FenceKeys): both ways a resource learns them.
			a := start(t, "A", worker, run("work", "--id", "A", "--pause-before-write", "--trusted-keys", trusted)...)
			a.waitFor(t, `A paused \(SIGSTOP\)`)
			paused := time.Now()
			tokA := a.token(t, `A acquired \S+ token=(\d+)`)
			if runtime.GOOS == "linux" {
				testkit.Eventually(t, stepDeadline, "A stopped", func() bool { return procState(t, a.cmd.Process.Pid) == 'T' })
			}

			b := start(t, "B", worker, run("work", "--id", "B", "--wait", stepDeadline.String())...)
			if code := b.exit(t); code != exitOK {
				t.Fatalf("B exited %d, want %d", code, exitOK)
			}
			tokB := b.token(t, `B wrote token=(\d+)`)
			if tokB <= tokA {
				t.Fatalf("B's token %d is not above A's %d", tokB, tokA)
			}
			if s := a.output(); strings.Contains(s, "resumed") {
				t.Fatalf("A ran on before it was resumed:\n%s", s)
			}
			t.Logf("A (token %d) stopped %v; B took the lock with token %d and wrote", tokA, time.Since(paused).Round(time.Millisecond), tokB)

			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			a.waitFor(t, `A resumed after`)
			// A's pause outlasted what it knew of its lock: it writes past
			// its own deadline, believing it holds the lock.
			if valid, stopped := a.duration(t, `A lock valid for another (\S+), writing`), a.duration(t, `A resumed after (\S+)`); stopped <= valid {
				t.Fatalf("A was stopped %v, not past its lock's remaining %v", stopped, valid)
			}
			codeA := a.exit(t)
			note := readNote(t, db, key)
			t.Logf("A's output:\n%s\nB's output:\n%s\nthe note: %+v", a.output(), b.output(), note)
			lineA := fmt.Sprintf("A was here with token %d\n", tokA)
			lineB := fmt.Sprintf("B was here with token %d\n", tokB)
			if fenced {
				if codeA != exitRefused || !strings.Contains(a.output(), "A write refused") || !strings.Contains(a.output(), "fence_stale") {
					t.Fatalf("A exited %d, want %d (refused, fence_stale)", codeA, exitRefused)
				}
				if want := (Note{Key: key, Body: lineB, Writer: "B", Token: tokB, Fence: tokB}); note != want {
					t.Fatalf("the note is %+v\nwant B's write alone: %+v", note, want)
				}
				return
			}
			if codeA != exitOK || !strings.Contains(a.output(), fmt.Sprintf("A wrote token=%d", tokA)) {
				t.Fatalf("A exited %d, want %d (wrote)", codeA, exitOK)
			}
			// The lost update: A wrote what it read before B's write, plus
			// its own line. B's line, written and reported, is gone.
			if want := (Note{Key: key, Body: lineA, Writer: "A", Token: tokA}); note != want {
				t.Fatalf("the note is %+v\nwant A's write over B's (the lost update): %+v", note, want)
			}
		})
	}
}

// proc is a process of the test, its output collected.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs bin with args, without this process's TICKETD_* variables
// (serve reads them as configuration), killed at cleanup; its output is
// logged if the test fails. Each process leads a process group of its
// own, whose parent (this process) is outside it: such a group is never
// orphaned, and the kernel sends SIGHUP and SIGCONT to the stopped
// members of an orphaned group when one of its processes exits, which
// would end A's pause early and kill it.
func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETD_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.output())
		}
	})
	return p
}

// waitFor polls until a line of p's output matches re.
func (p *proc) waitFor(t *testing.T, re string) {
	t.Helper()
	r := regexp.MustCompile(`(?m)^` + re)
	testkit.Eventually(t, stepDeadline, fmt.Sprintf("%s to print %q", p.name, re), func() bool {
		select {
		case <-p.done:
			if !r.MatchString(p.output()) {
				t.Fatalf("%s exited (%v) without printing %q", p.name, p.cmd.ProcessState, re)
			}
		default:
		}
		return r.MatchString(p.output())
	})
}

// token is the number that re's group captures in p's output.
func (p *proc) token(t *testing.T, re string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + re).FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("%s did not print %q", p.name, re)
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// duration is the duration that re's group captures in p's output.
func (p *proc) duration(t *testing.T, re string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + re).FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("%s did not print %q", p.name, re)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// exit waits for p to end and returns its exit status.
func (p *proc) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(stepDeadline):
		t.Fatalf("%s did not exit within %v", p.name, stepDeadline)
	}
	return p.cmd.ProcessState.ExitCode()
}

// procState is the state letter of /proc/PID/stat ('T': stopped).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		t.Fatalf("unexpected /proc/%d/stat: %q", pid, b)
	}
	return b[i+2]
}

// readNote reads key's note as the resource holds it.
func readNote(t *testing.T, db *sql.DB, key string) Note {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	n, err := (&Notes{db: db}).Read(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
