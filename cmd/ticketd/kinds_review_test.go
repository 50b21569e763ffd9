package main

import (
	"strings"
	"testing"
)

// TestReviewKindsCLIErrors (review of issue 25): lock acquire and lock
// exec print a bad kind as a typed error with its stable code, exit with
// a failure, and take nothing: --limit 0 (outside the flag's 1..1024;
// the wire would read it as a mutex, and the CLI took the key
// exclusively), --limit 100000, --shared with --limit 3.
func TestReviewKindsCLIErrors(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 1)
	url := c.ClientURL(0)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "0"}, "limit 0 is outside [1, 1024]"},
		{[]string{"--limit", "-3"}, "limit -3 is outside [1, 1024]"},
		{[]string{"--limit", "100000"}, "limit 100000 is outside [1, 1024]"},
		{[]string{"--limit", "0", "--session-ttl", "10s"}, "limit 0 is outside [1, 1024]"},
		{[]string{"--limit", "3", "--shared"}, "a semaphore (limit 3) has no shared mode"},
	} {
		for _, sub := range [][]string{{"lock", "acquire", "cli/k"}, {"lock", "exec", "cli/k"}} {
			if sub[1] == "acquire" && tc.args[len(tc.args)-2] == "--session-ttl" {
				continue // exec only
			}
			args := append(append(append([]string{}, sub...), tc.args...), "--nats", url)
			if sub[1] == "exec" {
				args = append(args, "--", "true")
			}
			r := runCLI(t, bin, args...)
			if r.code != exitFailure || !strings.Contains(r.stderr, "invalid_argument") || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d and invalid_argument %q", args, r.code, r.stdout, r.stderr, exitFailure, tc.want)
			}
		}
	}
	if v, stderr, code := cli(t, bin, "lock", "get", "cli/k", "--nats", url); code != 0 || v["held"] != false {
		t.Fatalf("cli/k after the refusals: exit %d %v %q", code, v, stderr)
	}
}
