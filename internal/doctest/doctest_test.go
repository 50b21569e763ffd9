package doctest

import (
	"context"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

func needBash(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found on PATH")
	}
}

const page = "# Title\n\n```sh\necho one\n```\n\n" +
	"<!-- doctest: skip (needs three machines) -->\n```sh\nssh 10.0.0.1\n```\n\n" +
	"```go\nx := 1\n```\n" +
	"<!-- doctest: needs openssl jq -->\n\n<!-- doctest: before printf x > f -->\n<!-- doctest: nodes 3 -->\n<!-- doctest: output elected token= -->\n<!-- doctest: unprivileged -->\n" +
	"```bash\ncat f\n```\n" +
	"````sh\n```\nnot a fence\n````\n"

func TestParse(t *testing.T) {
	blocks, err := Parse("p.md", page)
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{File: "p.md", Line: 3, Text: "echo one"},
		{File: "p.md", Line: 8, Text: "ssh 10.0.0.1", Directives: Directives{Skip: "needs three machines"}},
		{File: "p.md", Line: 21, Text: "cat f", Directives: Directives{
			Needs: []string{"openssl", "jq"}, Unprivileged: true, Before: []string{"printf x > f"}, Nodes: 3, Output: []string{"elected token="}}},
		{File: "p.md", Line: 24, Text: "```\nnot a fence"},
	}
	if !reflect.DeepEqual(blocks, want) {
		t.Fatalf("blocks\n%+v\nwant\n%+v", blocks, want)
	}
}

// A directive that would be ignored is an error, so a typo never turns a
// check off.
func TestParseRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"unknown":        "<!-- doctest: skipp (x) -->\n```sh\nls\n```\n",
		"skip no reason": "<!-- doctest: skip -->\n```sh\nls\n```\n",
		"text between":   "<!-- doctest: skip (x) -->\nprose\n```sh\nls\n```\n",
		"not shell":      "<!-- doctest: skip (x) -->\n```go\nx\n```\n",
		"nothing after":  "```sh\nls\n```\n<!-- doctest: skip (x) -->\n",
		"unclosed":       "```sh\nls\n",
		"bad nodes":      "<!-- doctest: nodes three -->\n```sh\nls\n```\n",
		"two lines":      "<!-- doctest: skip\n(x) -->\n```sh\nls\n```\n",
	} {
		if _, err := Parse("p.md", text); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestSteps(t *testing.T) {
	needBash(t)
	text := `go build -o bin/ticketd ./cmd/ticketd
# a comment line

bin/ticketd lock acquire a/42 --lease 30s $alice     # {"key":"a/42","token":1,...}
bin/ticketd lock acquire b/1 --lease 30s    # error: permission_denied: not yours
openssl req -x509 \
  -subj /CN=x # done
for u in a b; do
  echo "$u # not a comment"
done
tls="--a x \
     --b y"
echo '#' ${#tls} # {"n":1}`
	steps, err := Steps(Block{File: "p.md", Line: 10, Text: text})
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	for _, s := range steps {
		lines = append(lines, s.Line)
	}
	if want := []int{11, 14, 15, 16, 18, 21, 23}; !reflect.DeepEqual(lines, want) {
		t.Fatalf("steps start on lines %v, want %v: %+v", lines, want, steps)
	}
	if !reflect.DeepEqual(steps[1].ExpectJSON, map[string]any{"key": "a/42", "token": float64(1)}) || steps[1].ExpectError != "" {
		t.Errorf("step 2 expects %+v", steps[1])
	}
	if steps[2].ExpectError != "permission_denied" || steps[2].ExpectJSON != nil {
		t.Errorf("step 3 expects %+v", steps[2])
	}
	if steps[4].ExpectJSON != nil || len(Comments(steps[4].Text)) != 0 {
		t.Errorf("a # inside quotes is a comment: %q", Comments(steps[4].Text))
	}
	if !reflect.DeepEqual(steps[6].ExpectJSON, map[string]any{"n": float64(1)}) {
		t.Errorf("last step expects %+v", steps[6])
	}
	if got := StripComments(steps[1].Text); got != "bin/ticketd lock acquire a/42 --lease 30s $alice" {
		t.Errorf("StripComments: %q", got)
	}

	for name, text := range map[string]string{
		"unclosed quote": "echo \"abc",
		"unclosed loop":  "for i in 1; do",
		"syntax":         "echo )",
		"bad sample":     "ls # {key: 1}",
		"bad error":      "ls # error:",
	} {
		if _, err := Steps(Block{File: "p.md", Text: text}); err == nil {
			t.Errorf("%s: cut into steps", name)
		}
	}
}

func TestCheck(t *testing.T) {
	ok := Step{}
	json := Step{ExpectJSON: map[string]any{"token": float64(1)}}
	fail := Step{ExpectError: "permission_denied"}
	for _, tc := range []struct {
		name string
		s    Step
		r    Result
		pass bool
	}{
		{"success", ok, Result{}, true},
		{"failure", ok, Result{Status: 1}, false},
		{"json", json, Result{Stdout: `{"key":"a","token":1}` + "\n"}, true},
		{"json other value", json, Result{Stdout: `{"token":2}`}, false},
		{"json missing", json, Result{Stdout: `{}`}, false},
		{"not json", json, Result{Stdout: "token 1"}, false},
		{"expected error", fail, Result{Status: 1, Stderr: "error: permission_denied: no"}, true},
		{"other error", fail, Result{Status: 1, Stderr: "error: not_found: no"}, false},
		{"no error", fail, Result{}, false},
	} {
		if err := tc.s.Check(tc.r); (err == nil) != tc.pass {
			t.Errorf("%s: Check = %v", tc.name, err)
		}
	}
}

func TestSession(t *testing.T) {
	needBash(t)
	dir := t.TempDir()
	s, err := Start(dir, t.TempDir(), []string{"PATH=/usr/bin:/bin"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(text string, background bool) Result {
		t.Helper()
		r, err := s.Run(ctx, text, background)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// State carries over from step to step, as in a terminal.
	run("mkdir -p sub && cd sub\nexport X=1 y=2", false)
	if r := run(`echo "$X $y $(basename "$PWD")"; echo oops >&2; false`, false); r.Status != 1 || r.Stdout != "1 2 sub\n" || r.Stderr != "oops\n" {
		t.Fatalf("step: %+v", r)
	}
	// A step cannot read the session's input (the steps still to come).
	if r := run("cat", false); r.Status != 0 || r.Stdout != "" {
		t.Fatalf("cat: %+v", r)
	}
	// Background: a server that keeps running, one that fails early.
	srv := run("while :; do echo tick; sleep 0.01; done # runs until stopped", true)
	if srv.PID == 0 || !Alive(srv.PID) {
		t.Fatalf("background step: %+v", srv)
	}
	testkit.Eventually(t, 10*time.Second, "the background step's output", func() bool {
		return strings.Contains(s.Output(srv.N), "tick")
	})
	bad := run("sh -c 'exit 7'", true)
	testkit.Eventually(t, 10*time.Second, "the failing step to end", func() bool { return !Alive(bad.PID) })
	exits, err := s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(exits, []Exit{{PID: bad.PID, Status: 7}}) {
		t.Fatalf("exits %+v, want pid %d status 7", exits, bad.PID)
	}
	if Alive(srv.PID) {
		t.Fatalf("background step %d still running after Close", srv.PID)
	}
}

// A step that outlives its deadline is an error, and Close still ends it.
func TestSessionStepDeadline(t *testing.T) {
	needBash(t)
	s, err := Start(t.TempDir(), t.TempDir(), []string{"PATH=/usr/bin:/bin"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Run(ctx, "sleep 60", false); err == nil {
		t.Fatal("a step past its deadline returned")
	}
	start := time.Now()
	if _, err := s.Close(); err == nil {
		t.Error("Close with a step still running reported nothing")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
}
