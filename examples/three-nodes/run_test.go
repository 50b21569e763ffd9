package threenodes_test

// TestRunScript runs run.sh, the script `task cluster` runs, as a new user
// would (docs/operations.md, "The quickstart cluster"): the cluster starts
// with its secrets in files, elects a leader, grants a lock, answers
// `admin members` and `snapshot save`, replaces a member whose data was
// wiped, and stops cleanly; started again, it serves the same locks.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ticketd/ticketd/internal/testkit"
)

// build builds the ticketd binary into dir.
func build(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "ticketd")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ticketd").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// ports are every port the example's configs use.
var ports = []int{4222, 4223, 4224, 6222, 6223, 6224, 7001, 7002, 7003, 7101, 7102, 7103, 9091, 9092, 9093}

// freeHost picks a loopback address on which every port of the example is
// free: the same configs as a user's, moved off 127.0.0.1 so the test
// meets no cluster the machine runs there.
func freeHost(t *testing.T) string {
	t.Helper()
	for range 20 {
		host := fmt.Sprintf("127.%d.%d.1", 1+rand.IntN(250), 1+rand.IntN(250))
		free := true
		for _, p := range ports {
			ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", host, p))
			if err != nil {
				free = false
				break
			}
			_ = ln.Close()
		}
		if free {
			return host
		}
	}
	t.Skip("no loopback address with the example's ports free")
	return ""
}

// example copies this directory's script and configs under root, the
// configs on host instead of 127.0.0.1.
func example(t *testing.T, root, host string) {
	t.Helper()
	dst := filepath.Join(root, "examples", "three-nodes")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"run.sh", "node1.yaml", "node2.yaml", "node3.yaml"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".yaml") {
			b = bytes.ReplaceAll(b, []byte("127.0.0.1"), []byte(host))
		} else {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, mode); err != nil {
			t.Fatal(err)
		}
	}
}

// script is a running run.sh.
type script struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (s *script) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

func (s *script) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// env is the environment of the script and the CLI: none of the test
// process's TICKETD_* variables (serve reads them as settings).
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETD_") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// run starts run.sh with args in root, in a process group of its own.
func run(t *testing.T, root, bin string, args ...string) *script {
	t.Helper()
	s := &script{done: make(chan struct{})}
	s.cmd = exec.Command("examples/three-nodes/run.sh", args...)
	s.cmd.Dir = root
	s.cmd.Env = env("TICKETD_BIN=" + bin)
	s.cmd.Stdout, s.cmd.Stderr = s, s
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
		if t.Failed() {
			t.Logf("run.sh %v output:\n%s", args, s.output())
		}
	})
	return s
}

// stop sends SIGTERM to the script, as Ctrl-C or `kill` would, and waits
// for it to exit 0.
func (s *script) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatal("run.sh did not stop within 30s of SIGTERM")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("run.sh exited %d after SIGTERM", code)
	}
}

// ticketd runs a CLI command in root and decodes its JSON output.
func ticketd(t *testing.T, root, bin string, args ...string) (map[string]any, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	cmd.Env = env("TICKETD_CONTROL_CREDENTIAL_FILE=ticketd-data/control-credential")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ticketd %v: %v: %s", args, err, stderr.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("ticketd %v: %v: %s", args, err, out)
	}
	return v, nil
}

// alive reports whether the process in a pid file still runs.
func alive(t *testing.T, pidFile string) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	return syscall.Kill(pid, 0) == nil
}

func TestRunScript(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped in -short mode")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	root := t.TempDir()
	bin := build(t, t.TempDir())
	host := freeHost(t)
	example(t, root, host)
	nats := func(i int) string { return fmt.Sprintf("nats://%s:%d", host, 4221+i) }
	control := func(ids ...int) string {
		var urls []string
		for _, i := range ids {
			urls = append(urls, fmt.Sprintf("http://%s:%d", host, 7100+i))
		}
		return strings.Join(urls, ",")
	}
	leader := func(url string, within time.Duration) map[string]any {
		t.Helper()
		var st map[string]any
		testkit.Eventually(t, within, "a leader in "+url+"'s status", func() bool {
			v, err := ticketd(t, root, bin, "status", "--nats", url, "--timeout", "2s")
			if err == nil && v["leader"] != float64(0) {
				st = v
				return true
			}
			return false
		})
		return st
	}

	all := run(t, root, bin)
	leader(nats(1), 30*time.Second)
	for _, f := range []string{"peer-secret", "control-credential"} {
		fi, err := os.Stat(filepath.Join(root, "ticketd-data", f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want a 0600 file", f, err, fi.Mode())
		}
	}
	lock, err := ticketd(t, root, bin, "lock", "acquire", "demo", "--lease", "10m", "--owner", "me", "--nats", nats(3))
	if err != nil || lock["token"] != float64(1) {
		t.Fatalf("lock: %v %v", lock, err)
	}
	members, err := ticketd(t, root, bin, "admin", "members", "--control", control(1, 2, 3))
	if err != nil || len(members["members"].([]any)) != 3 {
		t.Fatalf("admin members: %v %v", members, err)
	}
	if _, err := ticketd(t, root, bin, "snapshot", "save", "backup.tkb", "--control", control(1, 2, 3)); err != nil {
		t.Fatalf("snapshot save: %v", err)
	}
	if st, err := ticketd(t, root, bin, "snapshot", "status", "backup.tkb"); err != nil || st["locks"] != float64(1) {
		t.Fatalf("snapshot status: %v %v", st, err)
	}

	// Member 2 dies and its data is lost. The script does not start it
	// again empty; it is replaced.
	pid2 := filepath.Join(root, "ticketd-data", "node2.pid")
	b, _ := os.ReadFile(pid2)
	var pid int
	_, _ = fmt.Sscan(string(b), &pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "member 2 stops", func() bool { return !alive(t, pid2) })
	if err := os.RemoveAll(filepath.Join(root, "ticketd-data", "node2")); err != nil {
		t.Fatal(err)
	}
	refused := exec.Command("examples/three-nodes/run.sh", "2")
	refused.Dir, refused.Env = root, env("TICKETD_BIN="+bin)
	if out, err := refused.CombinedOutput(); err == nil || !strings.Contains(string(out), "replace 2") {
		t.Fatalf("run.sh 2 on a wiped member: %v\n%s", err, out)
	}
	repl := run(t, root, bin, "replace", "2")
	var ident struct {
		NodeID      uint64 `json:"node_id"`
		Incarnation uint64 `json:"incarnation"`
	}
	testkit.Eventually(t, 30*time.Second, "the replacement joins", func() bool {
		b, err := os.ReadFile(filepath.Join(root, "ticketd-data", "node2", "identity.json"))
		return err == nil && json.Unmarshal(b, &ident) == nil && ident.NodeID != 0
	})
	if ident.NodeID != 4 {
		t.Fatalf("replacement is node %d, want 4", ident.NodeID)
	}
	testkit.Eventually(t, 30*time.Second, "the replacement completes once caught up", func() bool {
		_, err := ticketd(t, root, bin, "admin", "replace", "complete", "--control", control(1, 3),
			"--old", "2", "--new", fmt.Sprint(ident.NodeID), "--incarnation", fmt.Sprint(ident.Incarnation))
		return err == nil
	})
	testkit.Eventually(t, 20*time.Second, "members 1, 3 and 4, all reachable", func() bool {
		v, err := ticketd(t, root, bin, "status", "--nats", nats(1))
		return err == nil && v["unreachable"] == nil && fmt.Sprint(memberIDs(v)) == "[1 3 4]"
	})
	testkit.Eventually(t, 10*time.Second, "run.sh replace saying how to finish", func() bool {
		return strings.Contains(repl.output(), fmt.Sprintf("admin replace complete --control %s --old 2 --new 4 --incarnation 4", control(1, 3)))
	})

	// Both scripts stop cleanly, and every node with them.
	repl.stop(t)
	all.stop(t)
	for i := 1; i <= 3; i++ {
		if alive(t, filepath.Join(root, "ticketd-data", fmt.Sprintf("node%d.pid", i))) {
			t.Fatalf("node %d still runs after run.sh stopped", i)
		}
	}

	// Started again, the cluster (with the replacement in member 2's
	// folder) holds the same lock.
	again := run(t, root, bin)
	leader(nats(2), 30*time.Second)
	var got map[string]any
	testkit.Eventually(t, 20*time.Second, "the lock, after the restart", func() bool {
		got, err = ticketd(t, root, bin, "lock", "get", "demo", "--nats", nats(2), "--timeout", "2s")
		return err == nil
	})
	if got["held"] != true || got["token"] != float64(1) {
		t.Fatalf("after the restart: %v", got)
	}
	again.stop(t)
}

// memberIDs are the raft members of a status reply.
func memberIDs(st map[string]any) []uint64 {
	var ids []uint64
	ms, _ := st["members"].([]any)
	for _, m := range ms {
		if mm, ok := m.(map[string]any); ok {
			ids = append(ids, uint64(mm["id"].(float64)))
		}
	}
	return ids
}

// The Taskfile's cluster task runs this script and nothing else: no shell
// of its own (task v3 runs commands with mvdan/sh, whose trap does not
// take INT), and no --initial-cluster-state of its own.
func TestTaskfileRunsScript(t *testing.T) {
	b, err := os.ReadFile("../../Taskfile.yml")
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tasks map[string]struct {
			Cmds []string `yaml:"cmds"`
		} `yaml:"tasks"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	cmds := tf.Tasks["cluster"].Cmds
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "examples/three-nodes/run.sh") || strings.Contains(cmds[0], "initial-cluster-state") {
		t.Fatalf("task cluster runs %q, want examples/three-nodes/run.sh alone", cmds)
	}
}
