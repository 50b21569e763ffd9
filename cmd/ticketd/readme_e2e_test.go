package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ticketd/ticketd/internal/doctest"
)

// The pages whose shell blocks run (TestDocsRun) and whose ticketd command
// lines parse (TestDocCommandsParse). See internal/doctest for the
// directives a page uses to mark a block that cannot run here.

const (
	// docStepTimeout bounds one step (the README's second acquire waits
	// about 10 s; building an example's binary can take longer on a
	// loaded machine).
	docStepTimeout = 2 * time.Minute
	// docReadyTimeout bounds the wait for a server a step started (its
	// nodes started and a leader serving) and for an output directive.
	docReadyTimeout = time.Minute
	// docLockTimeout bounds the wait for another run of TestDocsRun on
	// this machine to finish with the fixed ports.
	docLockTimeout = 3 * time.Minute
)

// repoRoot is the repository, seen from this package's directory.
var repoRoot = filepath.Join("..", "..")

// docPages are README.md and every examples/*/README.md, relative to the
// repository.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "examples", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(pages)
	pages = append([]string{filepath.Join(repoRoot, "README.md")}, pages...)
	if len(pages) < 5 {
		t.Fatalf("only %d pages found: is the glob rooted at the repository?", len(pages))
	}
	for i, p := range pages {
		pages[i], _ = filepath.Rel(repoRoot, p)
	}
	return pages
}

// Long-running commands a user leaves running in a terminal (or Ctrl-Cs
// before the next line): run in the background. A server is waited for.
var (
	serverRE = regexp.MustCompile(`(^|[\s;&|(])(\S*/)?ticketd\s+serve\b|go run \./cmd/ticketd serve\b|(^|[\s;&|(])task\s+cluster\b|(^|[\s;&|(])(\S*/)?run\.sh\b`)
	watchRE  = regexp.MustCompile(`\block\s+watch\b|\bstatus\b.*\s--watch\b`)
	// What a node logs once it listens, and once it leads.
	nodeStartedRE = regexp.MustCompile(`msg="node started"`)
	leaderServes  = "serving the lock subjects as leader"
	fixedPortRE   = regexp.MustCompile(`(?:127\.0\.0\.1|localhost):(\d{2,5})\b`)
)

// TestDocsRun runs every shell block of README.md and examples/*/README.md
// that a user is told to type, in order, one bash session per page, in a
// copy of the repository's examples, scripts and Taskfile, with the
// ticketd binary built from this tree first on PATH: `go build -o X
// ./cmd/ticketd` copies it, `go run ./cmd/ticketd` runs it, `go run
// PKG@VERSION` builds PKG from the module cache when go.mod requires that
// version, other `go build` builds from the repository, and `task NAME`
// runs NAME's commands from Taskfile.yml. Servers, watches and clusters are
// started in the background and waited for by polling their log; at the end
// of a page every process it started is stopped and killed. The pages name
// fixed ports (4222 is every client's default): they run on those ports,
// after checking that each is free (the test skips, naming the port, when
// one is not), one page at a time, one run of this test per machine at a
// time (a lock file).
func TestDocsRun(t *testing.T) {
	bin := binary(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found on PATH")
	}
	lockDocPorts(t)
	shims := docShims(t, bin)
	for _, page := range docPages(t) {
		t.Run(strings.ReplaceAll(page, "/", "_"), func(t *testing.T) {
			runPage(t, page, shims)
		})
	}
}

// lockDocPorts holds, until the test ends, a lock that every run of
// TestDocsRun on this machine takes: the pages' ports are fixed.
func lockDocPorts(t *testing.T) {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "ticketd-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "docs"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	deadline := time.Now().Add(docLockTimeout)
	for syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			t.Skipf("another run of TestDocsRun held %s for %v: the pages' ports are fixed, so only one runs at a time", f.Name(), docLockTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// docShims is a directory to put first on PATH: ticketd (the binary under
// test), go and task as described on TestDocsRun.
func docShims(t *testing.T, bin string) string {
	t.Helper()
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cache := filepath.Join(dir, "cache")
	tasks := filepath.Join(dir, "tasks")
	for _, d := range []string{filepath.Join(dir, "bin"), cache, tasks} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin", "ticketd")); err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer("@REALGO@", shellQuote(realGo), "@REPO@", shellQuote(repo), "@CACHE@", shellQuote(cache), "@TASKS@", shellQuote(tasks))
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, "bin", name), []byte(r.Replace(text)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write("go", goShim)
	write("task", taskShim)
	writeTaskScripts(t, filepath.Join(repo, "Taskfile.yml"), tasks)
	return filepath.Join(dir, "bin")
}

// goShim is `go` for the pages' commands.
const goShim = `#!/usr/bin/env bash
# go as the pages use it (readme_e2e_test.go): the ticketd binary under test
# for ./cmd/ticketd, the repository for other packages.
set -e
real=@REALGO@ repo=@REPO@ cache=@CACHE@
case "$1" in
run)
	if [ "$2" = ./cmd/ticketd ]; then shift 2; exec ticketd "$@"; fi
	if [[ "$2" == *@* ]]; then
		pkg=${2%@*} ver=${2##*@}
		shift 2
		bin="$cache/${pkg//\//_}@$ver"
		if [ ! -x "$bin" ]; then
			have=$(cd "$repo" && "$real" list -f '{{.Module.Version}}' "$pkg" 2>/dev/null) || have=
			[ "$have" = "$ver" ] || exec "$real" run "$pkg@$ver" "$@"
			(cd "$repo" && "$real" build -o "$bin.tmp" "$pkg" && mv "$bin.tmp" "$bin")
		fi
		exec "$bin" "$@"
	fi
	;;
build)
	if [ "$2" = -o ] && [ $# = 4 ]; then
		out=$(realpath -m "$3")
		mkdir -p "$(dirname "$out")"
		if [ "$4" = ./cmd/ticketd ]; then exec cp "$(command -v ticketd)" "$out"; fi
		cd "$repo" && exec "$real" build -o "$out" "$4"
	fi
	;;
esac
echo "doctest: 'go $*' is not mapped (readme_e2e_test.go, goShim)" >&2
exit 2
`

// taskShim is `task` for the pages' commands: the task's script
// (writeTaskScripts), run from the directory of the nearest Taskfile.yml.
const taskShim = `#!/usr/bin/env bash
name=${1:-default}
shift || true
[ "${1:-}" = -- ] && shift
script=@TASKS@/$name.sh
[ -f "$script" ] || { echo "doctest: task $name: not in Taskfile.yml" >&2; exit 2; }
while [ ! -f Taskfile.yml ] && [ "$PWD" != / ]; do cd ..; done
exec bash "$script" "$@"
`

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// runPage runs one page's blocks.
func runPage(t *testing.T, page, shims string) {
	blocks := parsePage(t, page)
	checkPortsFree(t, page)
	work, outDir := t.TempDir(), t.TempDir()
	for _, d := range []string{"examples", "scripts"} {
		copyTree(t, filepath.Join(repoRoot, d), filepath.Join(work, d))
	}
	copyTree(t, filepath.Join(repoRoot, "Taskfile.yml"), filepath.Join(work, "Taskfile.yml"))

	env := []string{"PATH=" + shims + string(os.PathListSeparator) + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		// serve reads TICKETD_* as settings: not this process's.
		if !strings.HasPrefix(kv, "TICKETD_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	s, err := doctest.Start(work, outDir, env)
	if err != nil {
		t.Fatal(err)
	}
	r := &pageRun{t: t, page: page, s: s, steps: map[int]string{}, pids: map[int]int{}}
	// Registered after the temporary directories: runs before they go.
	t.Cleanup(r.close)

	stopped := ""
	for _, b := range blocks {
		switch {
		case b.Skip != "":
			t.Logf("%s: not run (%s)", b.Where(), b.Skip)
			continue
		case stopped != "":
			t.Logf("%s: not run (%s)", b.Where(), stopped)
			continue
		}
		for _, tool := range b.Needs {
			if _, err := exec.LookPath(tool); err != nil && stopped == "" {
				stopped = fmt.Sprintf("%s needs %s, not found on PATH: neither it nor the rest of the page runs", b.Where(), tool)
			}
		}
		if b.Unprivileged && os.Geteuid() == 0 && stopped == "" {
			stopped = fmt.Sprintf("%s cannot run as root (what it starts refuses root): neither it nor the rest of the page runs", b.Where())
		}
		if stopped != "" {
			t.Logf("%s: not run (%s)", b.Where(), stopped)
			continue
		}
		r.block(b)
	}
	r.close()
	if stopped != "" && r.s.Steps() == 0 {
		t.Skip(stopped)
	}
}

// parsePage parses a page, naming it relative to the repository.
func parsePage(t *testing.T, page string) []doctest.Block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, page))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := doctest.Parse(page, string(b))
	if err != nil {
		t.Fatal(err)
	}
	return blocks
}

// pageRun is one page's session and what its steps were.
type pageRun struct {
	t      *testing.T
	page   string
	s      *doctest.Session
	steps  map[int]string // step number -> where and what, for messages
	pids   map[int]int    // background pid -> step number
	closed bool
}

func (r *pageRun) block(b doctest.Block) {
	t := r.t
	steps, err := doctest.Steps(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, before := range b.Before {
		steps = append([]doctest.Step{{Line: b.Line - 1, Text: before}}, steps...)
	}
	first := r.s.Steps() + 1
	for _, st := range steps {
		r.step(b, st)
	}
	for _, want := range b.Output {
		r.poll(fmt.Sprintf("%s: the output %q", b.Where(), want), func() bool {
			for n := first; n <= r.s.Steps(); n++ {
				if strings.Contains(r.s.Output(n), want) {
					return true
				}
			}
			return false
		})
	}
}

// step runs one step: in the background when it is a server or a watch
// (a server is then waited for), else to its end, checking what it did.
func (r *pageRun) step(b doctest.Block, st doctest.Step) {
	t := r.t
	text := doctest.StripComments(st.Text)
	server := serverRE.MatchString(text)
	background := (server || watchRE.MatchString(text)) && !strings.HasSuffix(text, "&")
	ctx, cancel := context.WithTimeout(context.Background(), docStepTimeout)
	defer cancel()
	res, err := r.s.Run(ctx, st.Text, background)
	where := fmt.Sprintf("%s:%d: %s", r.page, st.Line, st.Text)
	r.steps[res.N] = where
	if err != nil {
		t.Fatalf("%s\n%v\nstdout:\n%s\nstderr:\n%s%s", where, err, res.Stdout, res.Stderr, r.background())
	}
	if background && res.PID != 0 {
		r.pids[res.PID] = res.N
	}
	out, _, _ := strings.Cut(strings.TrimSpace(res.Stdout), "\n")
	if len(out) > 300 {
		out = out[:300] + "..."
	}
	t.Logf("%s\n\texit %d, stdout: %s", where, res.Status, out)
	if background {
		if res.Status != 0 {
			t.Fatalf("%s: could not be started: exit status %d\n%s", where, res.Status, res.Stderr)
		}
		if server {
			r.waitServer(b, res, where)
		}
		return
	}
	if err := st.Check(res); err != nil {
		t.Fatalf("%s\n%v\nstdout:\n%s\nstderr:\n%s%s", where, err, res.Stdout, res.Stderr, r.background())
	}
}

// waitServer polls the log of a server step until its nodes have started
// and one of them serves as leader.
func (r *pageRun) waitServer(b doctest.Block, res doctest.Result, where string) {
	nodes := max(b.Nodes, 1)
	r.poll(fmt.Sprintf("%s: %d node(s) started and a leader serving", where, nodes), func() bool {
		out := r.s.Output(res.N)
		if res.PID != 0 && !doctest.Alive(res.PID) {
			if strings.Contains(out, "address already in use") {
				r.t.Skipf("%s: a port it needs is taken (another process listens there):\n%s", where, tail(out))
			}
			r.t.Fatalf("%s: exited before it was ready:\n%s", where, tail(out))
		}
		return len(nodeStartedRE.FindAllString(out, -1)) >= nodes && strings.Contains(out, leaderServes)
	})
}

// poll waits until cond holds, failing the test after docReadyTimeout.
func (r *pageRun) poll(what string, cond func() bool) {
	deadline := time.Now().Add(docReadyTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %v waiting for %s%s", docReadyTimeout, what, r.background())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// background is the output of every step still listed as running, for a
// failure message.
func (r *pageRun) background() string {
	var b strings.Builder
	for pid, n := range r.pids {
		fmt.Fprintf(&b, "\n--- background %s (pid %d, running %v):\n%s", r.steps[n], pid, doctest.Alive(pid), tail(r.s.Output(n)))
	}
	return b.String()
}

// close stops every process of the page; a background step that had
// exited with a non-zero status before fails the test.
func (r *pageRun) close() {
	if r.closed {
		return
	}
	r.closed = true
	bg := r.background()
	exits, err := r.s.Close()
	if err != nil {
		r.t.Errorf("%s: stopping its processes: %v%s", r.page, err, bg)
	}
	for _, e := range exits {
		if e.Status != 0 {
			r.t.Errorf("%s: ended with exit status %d before the page was done%s", r.steps[r.pids[e.PID]], e.Status, bg)
		}
	}
	if r.t.Failed() {
		r.t.Logf("bash's own output:\n%s", r.s.Log())
	}
}

// checkPortsFree skips the page when a fixed port it names (or 4222, the
// default of serve and every client) is taken on 127.0.0.1.
func checkPortsFree(t *testing.T, page string) {
	t.Helper()
	texts := []string{page}
	if dir := filepath.Dir(page); dir != "." {
		files, _ := filepath.Glob(filepath.Join(repoRoot, dir, "*"))
		for _, f := range files {
			if filepath.Ext(f) != ".go" { // a test's own addresses are not the page's
				texts = append(texts, strings.TrimPrefix(f, repoRoot+string(filepath.Separator)))
			}
		}
	}
	ports := map[int]bool{4222: true}
	for _, f := range texts {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			continue // a directory
		}
		for _, m := range fixedPortRE.FindAllStringSubmatch(string(b), -1) {
			if p, err := strconv.Atoi(m[1]); err == nil && p > 0 && p < 65536 {
				ports[p] = true
			}
		}
	}
	for p := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Skipf("port %d on 127.0.0.1 is taken (%v): %s runs on the fixed ports it names", p, err, page)
		}
		ln.Close()
	}
}

// copyTree copies a file or a directory (without node_modules), keeping
// the permission bits.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return os.MkdirAll(dst, 0o755)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, info.Mode().Perm())
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

// tail is the end of a long output.
func tail(s string) string {
	const keep = 6000
	if len(s) > keep {
		return "...\n" + s[len(s)-keep:]
	}
	return s
}

// writeTaskScripts writes, for each task of the Taskfile, a bash script
// running what `task NAME -- ARGS` runs: its deps' scripts, its env and
// its commands, with the templates evaluated as task would (variables from
// the Taskfile's vars and this test's environment when the scripts are
// written, not a page's exports; CLI_ARGS the script's arguments). A task
// this cannot map (dir:, a command that is not a string, a template
// function other than default) gets a script that says so and exits 2.
func writeTaskScripts(t *testing.T, taskfile, dir string) {
	t.Helper()
	b, err := os.ReadFile(taskfile)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Vars  map[string]string `yaml:"vars"`
		Tasks map[string]struct {
			Deps []string          `yaml:"deps"`
			Env  map[string]string `yaml:"env"`
			Dir  string            `yaml:"dir"`
			Cmds []any             `yaml:"cmds"`
		} `yaml:"tasks"`
	}
	if err := yaml.Unmarshal(b, &tf); err != nil {
		t.Fatalf("%s: %v", taskfile, err)
	}
	funcs := template.FuncMap{"default": func(def string, v any) string {
		if s, _ := v.(string); s != "" {
			return s
		}
		return def
	}}
	vars := map[string]any{"CLI_ARGS": `"$@"`}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && !strings.HasPrefix(k, "TICKETD_") {
			vars[k] = v
		}
	}
	expand := func(s string) (string, error) {
		tmpl, err := template.New("").Funcs(funcs).Option("missingkey=zero").Parse(s)
		if err != nil {
			return "", err
		}
		var out strings.Builder
		if err := tmpl.Execute(&out, vars); err != nil {
			return "", err
		}
		return strings.ReplaceAll(out.String(), "<no value>", ""), nil
	}
	for k, v := range tf.Vars {
		if x, err := expand(v); err == nil {
			vars[k] = x
		}
	}
	for name, task := range tf.Tasks {
		script, err := func() (string, error) {
			if task.Dir != "" {
				return "", fmt.Errorf("dir: is not mapped")
			}
			var s strings.Builder
			s.WriteString("set -e\n")
			for _, d := range task.Deps {
				fmt.Fprintf(&s, "bash %s\n", shellQuote(filepath.Join(dir, d+".sh")))
			}
			envNames := make([]string, 0, len(task.Env))
			for k := range task.Env {
				envNames = append(envNames, k)
			}
			sort.Strings(envNames)
			for _, k := range envNames {
				v, err := expand(task.Env[k])
				if err != nil {
					return "", err
				}
				fmt.Fprintf(&s, "export %s=%s\n", k, shellQuote(v))
			}
			for _, c := range task.Cmds {
				text, ok := c.(string)
				if !ok {
					return "", fmt.Errorf("a command that is not a string (%v) is not mapped", c)
				}
				x, err := expand(text)
				if err != nil {
					return "", err
				}
				s.WriteString(x + "\n")
			}
			return s.String(), nil
		}()
		if err != nil {
			script = fmt.Sprintf("echo %s >&2\nexit 2\n", shellQuote(fmt.Sprintf("doctest: task %s: %v (readme_e2e_test.go, writeTaskScripts)", name, err)))
		}
		if err := os.WriteFile(filepath.Join(dir, name+".sh"), []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
