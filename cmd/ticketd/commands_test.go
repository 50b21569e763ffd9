package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestEveryCommandAnswersHelp walks the command tree: every group and leaf
// answers --help, -h and "ticketd help PATH" on stdout with exit 0, and an
// unknown command is a usage error naming it.
func TestEveryCommandAnswersHelp(t *testing.T) {
	var paths [][]string
	var walk func(c *command, path []string)
	walk = func(c *command, path []string) {
		paths = append(paths, path)
		for _, s := range c.subs {
			walk(s, append(append([]string(nil), path...), s.name))
		}
	}
	walk(commands(), nil)
	// admin dispatches its own subcommands.
	for _, sub := range [][]string{{"bootstrap"}, {"mint-join"}, {"members"}, {"replace", "complete"}, {"replace", "abort"}, {"retire"}} {
		paths = append(paths, append([]string{"admin"}, sub...))
	}
	for _, path := range paths {
		for _, args := range [][]string{
			append(append([]string(nil), path...), "--help"),
			append(append([]string(nil), path...), "-h"),
			append([]string{"help"}, path...),
		} {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), args, &out, &errOut); code != 0 || out.Len() == 0 {
				t.Errorf("ticketd %s: exit %d, %d bytes on stdout, stderr %q", strings.Join(args, " "), code, out.Len(), errOut.String())
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"lock", "nope"}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), `unknown command "nope"`) {
		t.Errorf("ticketd lock nope: exit %d, stderr %q", code, errOut.String())
	}
}
