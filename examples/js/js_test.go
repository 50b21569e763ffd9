// Package js_test runs the JavaScript example against a real ticketd
// cluster: Node.js and the nats npm package, nothing of ticketd's but
// docs/protocol.md.
package js_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// install copies the example into a temporary directory and installs its
// locked dependencies there (the repository never holds node_modules).
func install(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("npm install and a three-node cluster skipped in -short mode")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found on PATH: install Node.js (Debian: apt-get install nodejs npm) to run the JavaScript example", tool)
		}
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "lock.mjs", "demo.mjs"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		for _, offline := range []string{"ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET", "network", "fetch failed"} {
			if strings.Contains(string(out), offline) || ctx.Err() != nil {
				t.Skipf("the npm registry is unreachable, so the nats package cannot be installed: %v\n%s", err, out)
			}
		}
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	return dir
}

// TestJavaScriptClient runs demo.mjs against a three-node cluster: it
// takes a lock, is refused a second try, reads the holder, renews it,
// queues a waiter that gets the key with
// a larger token once the first holder releases, and releases twice; then
// a semaphore of 2 (a third slot held until one leaves) and a read/write
// lock (a reader after a waiting writer is held; the writer's token is
// above the readers').
func TestJavaScriptClient(t *testing.T) {
	dir := install(t)
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	url := c.ClientURL(c.Follower(lead)) // requests go through a follower too
	args := []string{"demo.mjs", url, "--key", "js/demo", "--renew"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("node %s:\n%s%s", strings.Join(args, " "), stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("the example failed: %v", err)
	}

	steps := map[string]map[string]any{}
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		name, _ := v["step"].(string)
		steps[name] = v
		order = append(order, name)
	}
	want := []string{"acquired", "held", "get", "renewed", "released", "waited", "done", "session", "session_closed", "semaphore", "rwlock"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("steps %v, want %v", order, want)
	}
	first, second := steps["acquired"]["token"].(float64), steps["waited"]["token"].(float64)
	if first < 1 || second <= first || steps["get"]["token"].(float64) != first {
		t.Fatalf("tokens: acquired %v, get %v, waited %v", first, steps["get"]["token"], second)
	}
	sem, rw := steps["semaphore"], steps["rwlock"]
	holders, _ := sem["holders"].([]any)
	readers, _ := rw["readers"].([]any)
	if sem["limit"] != float64(2) || len(holders) != 2 || sem["freed_slot_token"].(float64) <= holders[1].(float64) ||
		len(readers) != 2 || rw["writer"].(float64) <= readers[1].(float64) {
		t.Fatalf("kinds: semaphore %v, rwlock %v", sem, rw)
	}
	// The cluster agrees: the key is free, and the next token is larger.
	cl, err := sdk.New(testkit.Connect(t, c.ClientURL(lead)))
	if err != nil {
		t.Fatal(err)
	}
	if h, err := cl.Get(ctx, "js/demo"); err != nil || h.Held {
		t.Fatalf("after the example: %+v %v", h, err)
	}
	l, err := cl.Acquire(ctx, "js/demo")
	if err != nil || float64(l.Token) <= second {
		t.Fatalf("next grant %+v %v, want a token above %v", l, err, second)
	}
}
