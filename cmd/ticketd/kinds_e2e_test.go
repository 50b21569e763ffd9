package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestLockKindsCLI: lock acquire --limit N takes up to N slots, each with
// its own token, then fails with held; a mismatched --limit is
// invalid_argument naming the key's; --shared holders coexist; lock get
// and lock ls show every holder with the key's kind; lock exec takes a slot.
func TestLockKindsCLI(t *testing.T) {
	bin := binary(t)
	c := settledCluster(t, 3)
	url := c.ClientURL(0)
	var tokens []float64
	for i := 0; i < 2; i++ {
		v, stderr, code := cli(t, bin, "lock", "acquire", "pool/gpu", "--limit", "2", "--lease", "1m", "--nats", url)
		if code != 0 || v["limit"] != float64(2) {
			t.Fatalf("slot %d: exit %d %v %q", i, code, v, stderr)
		}
		tokens = append(tokens, v["token"].(float64))
	}
	if _, stderr, code := cli(t, bin, "lock", "acquire", "pool/gpu", "--limit", "2", "--nats", url); code != exitFailure || !strings.Contains(stderr, "error: held") {
		t.Fatalf("third slot: exit %d %q, want held", code, stderr)
	}
	if _, stderr, code := cli(t, bin, "lock", "acquire", "pool/gpu", "--limit", "3", "--nats", url); code != exitFailure || !strings.Contains(stderr, "invalid_argument") || !strings.Contains(stderr, "has limit 2") {
		t.Fatalf("--limit 3 on a semaphore of 2: exit %d %q", code, stderr)
	}
	if _, stderr, code := cli(t, bin, "lock", "acquire", "pool/gpu", "--limit", "2", "--shared", "--nats", url); code == 0 || !strings.Contains(stderr, "no shared mode") {
		t.Fatalf("--shared with --limit 2: exit %d %q", code, stderr)
	}
	v, stderr, code := cli(t, bin, "lock", "get", "pool/gpu", "--nats", url)
	holders, _ := v["holders"].([]any)
	if code != 0 || v["limit"] != float64(2) || len(holders) != 2 || holders[1].(map[string]any)["token"] != tokens[1] {
		t.Fatalf("get: exit %d %v %q", code, v, stderr)
	}
	for i := 0; i < 2; i++ {
		if v, stderr, code := cli(t, bin, "lock", "acquire", "config/db", "--shared", "--nats", url); code != 0 || v["mode"] != "shared" {
			t.Fatalf("shared %d: exit %d %v %q", i, code, v, stderr)
		}
	}
	if _, stderr, code := cli(t, bin, "lock", "acquire", "config/db", "--nats", url); code != exitFailure || !strings.Contains(stderr, "error: held") {
		t.Fatalf("exclusive beside readers: exit %d %q", code, stderr)
	}
	r := runCLI(t, bin, "lock", "ls", "", "--nats", url)
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var l struct {
			Key   string `json:"key"`
			Limit int    `json:"limit"`
			Mode  string `json:"mode"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, fmt.Sprintf("%s/%d/%s", l.Key, l.Limit, l.Mode))
	}
	if want := "[config/db/0/shared config/db/0/shared pool/gpu/2/ pool/gpu/2/]"; r.code != 0 || fmt.Sprint(lines) != want {
		t.Fatalf("ls: exit %d %v, want %s (%q)", r.code, lines, want, r.stderr)
	}
	// lock exec holds a slot of its own: the semaphore is full, so it
	// fails held without running the command.
	if r := runCLI(t, bin, "lock", "exec", "pool/gpu", "--limit", "2", "--wait", "0s", "--nats", url, "--", "true"); r.code != exitFailure || !strings.Contains(r.stderr, "held") {
		t.Fatalf("exec on a full semaphore: exit %d %q", r.code, r.stderr)
	}
	if r := runCLI(t, bin, "lock", "exec", "config/db", "--shared", "--nats", url, "--", "sh", "-c", `test -n "$TICKETD_TOKEN"`); r.code != 0 {
		t.Fatalf("exec --shared beside readers: exit %d %q", r.code, r.stderr)
	}
}
