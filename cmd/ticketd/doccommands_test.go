package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/doctest"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestDocCommandsParse checks every ticketd command line in the shell
// blocks of README.md and examples/*/README.md, those that run and those
// marked not to run here: each names an existing command, its flags exist
// and take the values given, and it has the positional arguments the
// command wants. The lines are found the way a user's shell finds them:
// bash runs each page's blocks in a directory of its own with no command
// on PATH, every ticketd (and `go run ./cmd/ticketd`) replaced by a
// function that records its arguments after expansion, anything else a
// no-op. The recorded lines are parsed by the command tree in-process
// (cobra's Find, ParseFlags, ValidateArgs); nothing runs.
func TestDocCommandsParse(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found on PATH")
	}
	for _, page := range docPages(t) {
		t.Run(strings.ReplaceAll(page, "/", "_"), func(t *testing.T) {
			blocks := parsePage(t, page)
			calls, err := recordCalls(t.TempDir(), blocks)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range calls {
				check := checkCommandLine
				if call[0] == "nats" {
					check = checkNATSRequest
				}
				if err := check(call[1:]); err != nil {
					t.Errorf("%s: %s: %v", page, strings.Join(call, " "), err)
				}
			}
			t.Logf("%s: %d command lines parsed", page, len(calls))
		})
	}
}

// TestCheckCommandLine: the check refuses what ticketd would refuse.
func TestCheckCommandLine(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		ok   bool
	}{
		{[]string{"lock", "acquire", "orders/42", "--lease", "10s", "--owner", "w"}, true},
		{[]string{"lock", "renew", "orders/42", "2", "--lease", "1m"}, true},
		{[]string{"serve", "--data", "d1", "--peer-listen", "10.0.0.1:7001"}, true},
		{[]string{"admin", "replace", "complete", "--old", "1", "--new", "4", "--incarnation", "1"}, true},
		{[]string{"lock", "acquire", "orders/42", "--leese", "10s"}, false},
		{[]string{"lock", "acquire", "orders/42", "--lease", "banana"}, false},
		{[]string{"lock", "renew", "orders/42", "--lease", "1m"}, false},
		{[]string{"lock", "grab", "orders/42"}, false},
		{[]string{"lock"}, false},
		{[]string{"srve"}, false},
		{nil, false},
		{[]string{"serve", "--peer-secret", "x"}, false},
	} {
		if err := checkCommandLine(tc.argv); (err == nil) != tc.ok {
			t.Errorf("ticketd %s: %v", strings.Join(tc.argv, " "), err)
		}
	}
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"req", "ticketd.v1.lock.acquire", `{"key":"orders/42","lease_ms":10000}`}, true},
		{[]string{"req", "ticketd.v1.lock.get", `{"key":"orders/42"}`}, true},
		{[]string{"req", "ticketd.v1.lock.acquire", `{"key":"orders/42","lease":10000}`}, false},
		{[]string{"req", "ticketd.v1.lock.aquire", `{"key":"orders/42"}`}, false},
		{[]string{"req", "ticketd.v1.lock.get"}, false},
		{[]string{"micro", "ls"}, true},
	} {
		if err := checkNATSRequest(tc.args); (err == nil) != tc.ok {
			t.Errorf("nats %s: %v", strings.Join(tc.args, " "), err)
		}
	}
}

// natsRequests decode and check each client request body as the server
// does, by subject.
var natsRequests = map[string]func([]byte) error{
	protocol.SubjectAcquire: func(b []byte) error {
		var r protocol.AcquireRequest
		if err := protocol.Decode(b, &r); err != nil {
			return err
		}
		_, _, _, err := r.Validate()
		return err
	},
	protocol.SubjectRelease: func(b []byte) error {
		var r protocol.ReleaseRequest
		if err := protocol.Decode(b, &r); err != nil {
			return err
		}
		return r.Validate()
	},
	protocol.SubjectGet: func(b []byte) error {
		var r protocol.GetRequest
		if err := protocol.Decode(b, &r); err != nil {
			return err
		}
		return r.Validate()
	},
	protocol.SubjectRenew: func(b []byte) error {
		r, err := protocol.DecodeRenew(b)
		if err != nil {
			return err
		}
		return r.Validate()
	},
	protocol.SubjectList: func(b []byte) error {
		r, err := protocol.DecodeList(b)
		if err != nil {
			return err
		}
		_, err = r.Validate()
		return err
	},
	protocol.SubjectStatus: func([]byte) error { return nil },
}

// checkNATSRequest checks a `nats req SUBJECT BODY` line of a page: a
// client subject, and a body the server accepts. Other nats commands
// (nats micro ls) are not checked.
func checkNATSRequest(args []string) error {
	var pos []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
		}
	}
	if len(pos) == 0 || pos[0] != "req" {
		return nil
	}
	if len(pos) != 3 {
		return fmt.Errorf("want `nats req SUBJECT BODY`")
	}
	check, ok := natsRequests[pos[1]]
	if !ok {
		return fmt.Errorf("%q is not a client request subject", pos[1])
	}
	return check([]byte(pos[2]))
}

// checkCommandLine parses argv with the command tree, running nothing.
func checkCommandLine(argv []string) error {
	root := rootCmd()
	cmd, rest, err := root.Find(argv)
	if err != nil {
		return err
	}
	if cmd.HasSubCommands() && cmd.Annotations[alsoRunsAnnotation] == "" {
		if len(rest) > 0 {
			return fmt.Errorf("unknown command %q for %q", rest[0], cmd.CommandPath())
		}
		return fmt.Errorf("%q needs a command", cmd.CommandPath())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	return cmd.ValidateArgs(cmd.Flags().Args())
}

// recordScript is the prologue of the recording shell: each ticketd or
// nats call goes to fd 9, the program's name then its arguments, 0x1f
// after each, 0x1e after each call; any other command is not found, and
// not-found is a no-op.
const recordScript = `exec 9>>"$DOCTEST_RECORD"
__doctest_rec() {
	local r=""
	if (($#)); then printf -v r '%s\x1f' "$@"; fi
	printf '%s\x1e' "$r" >&9 # one write: calls in the background do not interleave
}
command_not_found_handle() {
	case "$1" in
	ticketd) shift; __doctest_rec ticketd "$@" ;;
	nats) shift; __doctest_rec nats "$@" ;;
	go) if [ "$2" = run ] && [ "$3" = ./cmd/ticketd ]; then shift 3; __doctest_rec ticketd "$@"; fi ;;
	esac
	return 0
}
PATH=/doctest-no-commands
`

// ticketdPathRE finds ticketd called by a path (bin/ticketd, ../bin/ticketd):
// such a call is not looked up on PATH, so it gets a function of its name.
var ticketdPathRE = regexp.MustCompile(`(?:^|[\s;&|(])((?:[\w.-]*/)+ticketd)(?:\s|$)`)

// recordCalls runs a page's blocks, all of them, in order, in one
// recording bash in dir, and returns its ticketd and nats calls, each
// the program's name and its arguments.
func recordCalls(dir string, blocks []doctest.Block) ([][]string, error) {
	var script strings.Builder
	script.WriteString(recordScript)
	names := map[string]bool{}
	for _, b := range blocks {
		for _, m := range ticketdPathRE.FindAllStringSubmatch(b.Text, -1) {
			names[m[1]] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		fmt.Fprintf(&script, "%s() { __doctest_rec ticketd \"$@\"; }\n", n)
	}
	for _, b := range blocks {
		script.WriteString(b.Text + "\n")
	}
	record := filepath.Join(dir, ".record")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = []string{"DOCTEST_RECORD=" + record, "HOME=" + dir}
	// Its own process group: a `kill 0` on a page ends only the recording.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("recording the ticketd lines: %w\n%s", ctx.Err(), out.String())
	}
	b, err := os.ReadFile(record)
	if err != nil {
		return nil, fmt.Errorf("no ticketd line recorded: %w\n%s", err, out.String())
	}
	var lines [][]string
	if len(b) == 0 {
		return nil, nil
	}
	for _, call := range strings.Split(strings.TrimSuffix(string(b), "\x1e"), "\x1e") {
		lines = append(lines, strings.Split(strings.TrimSuffix(call, "\x1f"), "\x1f"))
	}
	return lines, nil
}
