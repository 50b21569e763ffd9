package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/core"
)

// runInProcess runs the CLI in-process and returns its exit status and output.
func runInProcess(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// commandPaths is every visible command of the tree, groups included
// (nil: the root), and whether it is a leaf.
func commandPaths(t *testing.T) (paths [][]string, leaf map[string]bool) {
	t.Helper()
	leaf = map[string]bool{}
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		if !c.HasAvailableSubCommands() {
			leaf[strings.Join(path, " ")] = true
		}
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() && s.Name() != "help" {
				walk(s, append(append([]string(nil), path...), s.Name()))
			}
		}
	}
	walk(rootCmd(), nil)
	if len(leaf) < 20 {
		t.Fatalf("only %d leaf commands found", len(leaf))
	}
	return paths, leaf
}

// Every command and group answers --help, -h and "ticketd help PATH" on
// stdout with exit 0: a one-line description, a Usage line, and for a leaf
// its flags and at least one example.
func TestEveryCommandAnswersHelp(t *testing.T) {
	paths, leaf := commandPaths(t)
	for _, path := range paths {
		name := "ticketd " + strings.Join(path, " ")
		for _, args := range [][]string{
			append(append([]string(nil), path...), "--help"),
			append(append([]string(nil), path...), "-h"),
			append([]string{"help"}, path...),
		} {
			code, out, errOut := runInProcess(args...)
			if code != 0 || errOut != "" {
				t.Errorf("ticketd %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
				continue
			}
			if first, _, _ := strings.Cut(out, "\n"); strings.TrimSpace(first) == "" || strings.HasPrefix(first, "Usage:") {
				t.Errorf("%s --help: no description first: %q", name, first)
			}
			if !strings.Contains(out, "\nUsage:\n  "+strings.TrimSpace(name)) {
				t.Errorf("%s --help: no Usage line:\n%s", name, out)
			}
			if leaf[strings.Join(path, " ")] && !strings.Contains(out, "\nExamples:\n  ticketd ") {
				t.Errorf("%s --help: no examples:\n%s", name, out)
			}
			if args[0] != "help" && !strings.Contains(out, "\nFlags:\n") {
				t.Errorf("%s --help: no flags:\n%s", name, out)
			}
		}
	}
}

// A leaf's help shows its positional arguments in capitals, and only its
// own flags (each admin command shows its flags, not the other admin
// commands').
func TestHelpShowsArgumentsAndOnlyOwnFlags(t *testing.T) {
	for _, tc := range []struct {
		path          []string
		want, notWant []string
	}{
		{[]string{"lock", "renew"}, []string{"ticketd lock renew KEY TOKEN [flags]", "--lease"}, []string{"--token"}},
		{[]string{"lock", "release"}, []string{"ticketd lock release KEY --token N [flags]", "--token"}, nil},
		{[]string{"lock", "exec"}, []string{"ticketd lock exec KEY [KEY...] [flags] -- COMMAND [ARGS...]", "--grace", "--session-ttl"}, nil},
		{[]string{"snapshot", "status"}, []string{"ticketd snapshot status FILE", "Verify", "--control-credential-file"}, []string{"--control string"}},
		{[]string{"admin", "members"}, []string{"--control", "--timeout"}, []string{"--old", "--node", "--bootstrap-credential-file"}},
		{[]string{"admin", "retire"}, []string{"--node", "--incarnation"}, []string{"--old", "--new "}},
		{[]string{"admin", "replace", "complete"}, []string{"--old", "--new", "--incarnation"}, []string{"--node"}},
		{[]string{"admin", "bootstrap"}, []string{"--bootstrap-credential-file"}, []string{"--old", "--node"}},
		{nil, []string{"Exit status:", "  3    indeterminate", "  4    resource_exhausted", "version"}, nil},
	} {
		code, out, _ := runInProcess(append(tc.path, "--help")...)
		if code != 0 {
			t.Errorf("%v --help: exit %d", tc.path, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v --help lacks %q:\n%s", tc.path, w, out)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(out, w) {
				t.Errorf("%v --help shows %q, another command's flag:\n%s", tc.path, w, out)
			}
		}
	}
}

// Every unknown flag on every command (groups included) is named, followed
// by that command's usage on stderr, exit status 2, nothing on stdout.
func TestEveryCommandRefusesUnknownFlag(t *testing.T) {
	paths, _ := commandPaths(t)
	for _, path := range paths {
		args := append(append([]string(nil), path...), "--bogus")
		if len(path) > 0 && path[len(path)-1] == "exec" {
			args = append(args, "k", "--", "true")
		}
		code, out, errOut := runInProcess(args...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, "Error: unknown flag: --bogus\nUsage:\n  ticketd") {
			t.Errorf("ticketd %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
		}
	}
}

// Bad values, wrong arguments and unknown commands: "Error: " naming the
// mistake, the command's usage, exit 2. None of these reach a server (the
// NATS URL points nowhere).
func TestUsageErrorsNameTheMistake(t *testing.T) {
	nowhere := []string{"--nats", "nats://127.0.0.1:1", "--timeout", "1s"}
	for _, tc := range []struct {
		args  []string
		names string // in the first line of stderr
		usage string // the usage line that follows
	}{
		{[]string{"lock", "acquire", "orders/1", "--leese", "10s"}, "unknown flag: --leese", "ticketd lock acquire KEY [flags]"},
		{[]string{"lock", "acquire", "orders/1", "--lease", "banana"}, `invalid argument "banana" for "--lease" flag`, "ticketd lock acquire KEY"},
		{[]string{"lock", "acquire"}, "missing KEY", "ticketd lock acquire KEY"},
		{[]string{"lock", "acquire", "a", "b"}, "got 2 arguments", "ticketd lock acquire KEY"},
		{[]string{"lock", "renew", "orders/42", "1", "--token", "1"}, "unknown flag: --token", "ticketd lock renew KEY TOKEN"},
		{[]string{"lock", "renew", "orders/42"}, "missing TOKEN", "ticketd lock renew KEY TOKEN"},
		{append([]string{"lock", "renew", "orders/42", "zero"}, nowhere...), `TOKEN must be a positive integer, got "zero"`, "ticketd lock renew KEY TOKEN"},
		{[]string{"lock", "release", "orders/42"}, `required flag(s) "token" not set`, "ticketd lock release KEY"},
		{[]string{"lock", "release", "orders/42", "--token", "-1"}, `invalid argument "-1" for "--token"`, "ticketd lock release KEY"},
		{append([]string{"lock", "ls", "a/", "--limit", "0"}, nowhere...), "--limit 0 is outside", "ticketd lock ls PREFIX"},
		{[]string{"lock", "exec", "k", "true"}, `needs KEY [KEY...] -- COMMAND`, "ticketd lock exec KEY"},
		{append([]string{"lock", "exec", "k", "--lease", "1s", "--grace", "1s", "--", "true"}, nowhere...), "--lease 1s is too short for --grace 1s", "ticketd lock exec KEY"},
		{[]string{"status", "extra"}, `takes no arguments, got ["extra"]`, "ticketd status [flags]"},
		{append([]string{"status", "--watch", "--interval", "0s"}, nowhere...), "--interval must be positive", "ticketd status [flags]"},
		{[]string{"bench", "--clients", "many"}, `invalid argument "many" for "--clients"`, "ticketd bench [flags]"},
		{append([]string{"bench", "--mode", "fast"}, nowhere...), `"fast" is neither try nor wait`, "ticketd bench [flags]"},
		{[]string{"snapshot", "save"}, "missing FILE", "ticketd snapshot save FILE"},
		{[]string{"snapshot", "restore", "f.tkb"}, `required flag(s) "data" not set`, "ticketd snapshot restore FILE --data DIR"},
		{[]string{"admin", "retire", "--node", "x"}, `invalid argument "x" for "--node"`, "ticketd admin retire [flags]"},
		{[]string{"admin", "replace", "complete", "--old", "2"}, `required flag(s)`, "ticketd admin replace complete [flags]"},
		{[]string{"admin", "replace"}, `"ticketd admin replace" needs a command`, "ticketd admin replace [command]"},
		{[]string{"lock", "nope"}, `unknown command "nope" for "ticketd lock"`, "ticketd lock [command]"},
		{[]string{"lokc"}, `unknown command "lokc" for "ticketd"`, "ticketd [command]"},
		{[]string{"help", "lock", "nope"}, `unknown help topic "lock nope"`, "ticketd help [COMMAND...]"},
		{[]string{"version", "--bogus"}, "unknown flag: --bogus", "ticketd version [flags]"},
		{[]string{"serve", "--tick-ms", "fast"}, `invalid argument "fast" for "--tick-ms"`, "ticketd serve [flags]"},
	} {
		code, out, errOut := runInProcess(tc.args...)
		first, rest, _ := strings.Cut(errOut, "\n")
		if code != exitUsage || out != "" || !strings.HasPrefix(first, "Error: ") || !strings.Contains(first, tc.names) ||
			!strings.HasPrefix(rest, "Usage:\n  "+tc.usage) {
			t.Errorf("ticketd %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2, Error: ...%s, then Usage: %s", strings.Join(tc.args, " "), code, out, errOut, tc.names, tc.usage)
		}
	}
}

// version and --version print the release, the revision, the Go version
// and the highest cluster version this binary supports.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runInProcess(args...)
		if code != 0 || errOut != "" {
			t.Fatalf("ticketd %v: exit %d, stderr %q", args, code, errOut)
		}
		for _, re := range []string{`^ticketd \S+\n`, `\nrevision: +\S`, `\ngo: +` + regexp.QuoteMeta(runtime.Version()), fmt.Sprintf(`\ncluster version: %d \(highest supported`, core.MaxClusterVersion)} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("ticketd %v: output does not match %s:\n%s", args, re, out)
			}
		}
	}
}
