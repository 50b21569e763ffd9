package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// buildOnce builds the ticketd binary for process-level tests.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "ticketd-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ticketd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

func binary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// proc is a running `ticketd serve`.
type proc struct {
	cmd *exec.Cmd
	log *bytes.Buffer
	out *lockedWriter // cmd's stdout and stderr, writing to log
}

// logString is the output so far; safe while the process runs.
func (p *proc) logString() string {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	return p.log.String()
}

func startServe(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return startServeEnv(t, bin, nil, args...)
}

func startServeEnv(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	var log bytes.Buffer
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	// Not this process's TICKETD_* variables (TICKETD_BIG and friends
	// configure tests): serve reads TICKETD_* as config, and rejects
	// unknown keys.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out := &lockedWriter{w: &log}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: &log, out: out}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("node log:\n%s", log.String())
		}
	})
	return p
}

func (p *proc) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// cli runs a client command and returns stdout, stderr and the exit code.
func cli(t *testing.T, bin string, args ...string) (map[string]any, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("stdout of %v is not one JSON object: %q", args, out.String())
		}
	}
	return v, errb.String(), code
}

func waitReady(t *testing.T, bin, url string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, _, code := cli(t, bin, "status", "--nats", url, "--timeout", "1s")
		if code == 0 && v["state"] == "StateLeader" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node at %s never became leader", url)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func token(t *testing.T, v map[string]any) uint64 {
	t.Helper()
	f, ok := v["token"].(float64)
	if !ok {
		t.Fatalf("no token in %v", v)
	}
	return uint64(f)
}

// TestCLISessionSurvivesKill9 is the CLI session on a real
// process, including kill -9 and restart.
func TestCLISessionSurvivesKill9(t *testing.T) {
	bin := binary(t)
	data := t.TempDir()
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	serveArgs := []string{"--data", data, "--nats-listen", addr, "--tick-ms", "20"}
	p := startServe(t, bin, serveArgs...)
	waitReady(t, bin, url)

	v, _, code := cli(t, bin, "lock", "acquire", "k", "--lease", "30s", "--owner", "alice", "--nats", url)
	if code != 0 {
		t.Fatalf("acquire exit %d", code)
	}
	t1 := token(t, v)
	_, stderr, code := cli(t, bin, "lock", "acquire", "k", "--lease", "30s", "--nats", url)
	if code == 0 || !strings.Contains(stderr, "error: held:") {
		t.Fatalf("second acquire: exit %d stderr %q, want held", code, stderr)
	}
	_, stderr, code = cli(t, bin, "lock", "release", "k", "--token", fmt.Sprint(t1+7), "--nats", url)
	if code == 0 || !strings.Contains(stderr, "error: not_found:") {
		t.Fatalf("wrong release: exit %d stderr %q, want not_found", code, stderr)
	}
	v, _, _ = cli(t, bin, "lock", "get", "k", "--nats", url)
	if v["held"] != true || token(t, v) != t1 {
		t.Fatalf("after wrong release: %v", v)
	}
	if _, stderr, code = cli(t, bin, "lock", "release", "k", "--token", fmt.Sprint(t1), "--nats", url); code != 0 {
		t.Fatalf("release: exit %d %s", code, stderr)
	}
	v, _, code = cli(t, bin, "lock", "acquire", "k", "--lease", "30s", "--owner", "bob", "--nats", url)
	if code != 0 {
		t.Fatalf("re-acquire exit %d", code)
	}
	t2 := token(t, v)
	if t2 <= t1 {
		t.Fatalf("t2=%d not above t1=%d", t2, t1)
	}
	before, _, _ := cli(t, bin, "status", "--nats", url)

	p.kill9(t)
	startServe(t, bin, serveArgs...)
	waitReady(t, bin, url)

	v, _, _ = cli(t, bin, "lock", "get", "k", "--nats", url)
	if v["held"] != true || token(t, v) != t2 || v["owner"] != "bob" {
		t.Fatalf("after kill -9: %v, want held by bob with token %d", v, t2)
	}
	after, _, _ := cli(t, bin, "status", "--nats", url)
	if after["digest"] != before["digest"] || after["last_token"] != before["last_token"] {
		t.Fatalf("state changed across kill -9:\nbefore %v\nafter  %v", before, after)
	}
	v, _, code = cli(t, bin, "lock", "acquire", "k2", "--lease", "5s", "--nats", url)
	if code != 0 || token(t, v) <= t2 {
		t.Fatalf("token after restart %v (exit %d), want above %d", v, code, t2)
	}
	// Bad input from the CLI: typed code on stderr, usage-style exit.
	for _, args := range [][]string{
		{"lock", "acquire", "", "--lease", "1s"},
		{"lock", "acquire", "a", "--lease", "0s"},
		{"lock", "acquire", "a", "--lease", "87600h"},
		{"lock", "acquire", strings.Repeat("x", 10240), "--lease", "1s"},
	} {
		_, stderr, code := cli(t, bin, append(args, "--nats", url)...)
		if code == 0 || !strings.Contains(stderr, "error: invalid_argument:") {
			t.Fatalf("%v: exit %d stderr %q, want invalid_argument", args[:3], code, stderr)
		}
	}
}

// lockedWriter lets a process's stdout and stderr share one buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
