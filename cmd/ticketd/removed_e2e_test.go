package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// TestRemovedMemberExits: a member of a static cluster retired with
// `ticketd admin retire` while it runs logs that it was permanently
// removed and exits with status 5 (exitRemoved); started again, it exits 5
// at once.
func TestRemovedMemberExits(t *testing.T) {
	bin := binary(t)
	const n = 3
	dir := t.TempDir()
	cred := filepath.Join(dir, "control-credential")
	if err := os.WriteFile(cred, []byte("removed-test-control-credential\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := newProcessAddrs(t, n)
	urls := addrs.urls
	var controls []string
	for i := 0; i < n; i++ {
		controls = append(controls, testkit.FreeAddr(t))
	}
	args := func(i int) []string {
		return addrs.serveArgs(i, filepath.Join(dir, fmt.Sprint("node", i+1)),
			"--control-listen", controls[i], "--control-credential-file", cred,
			"--tick-ms", "50", "--election-ticks", "10",
		)
	}
	env := []string{"TICKETD_PEER_SECRET=process-test-secret-0123"}
	procs := make([]*proc, n)
	for i := 0; i < n; i++ {
		procs[i] = startServeEnv(t, bin, env, args(i)...)
	}
	waitLeader := func() int {
		t.Helper()
		lead := -1
		testkit.Eventually(t, 20*time.Second, "a leader", func() bool {
			for i := range procs {
				if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" {
					lead = i
					return true
				}
			}
			return false
		})
		return lead
	}
	lead := waitLeader()
	victim := (lead + 1) % n

	var controlURLs []string
	for _, c := range controls {
		controlURLs = append(controlURLs, "http://"+c)
	}
	admin := func(args ...string) map[string]any {
		t.Helper()
		t.Setenv("TICKETD_CONTROL_CREDENTIAL", "removed-test-control-credential")
		v, stderr, code := cli(t, bin, append([]string{"admin"}, append(args, "--control", strings.Join(controlURLs, ","))...)...)
		if code != 0 {
			t.Fatalf("admin %v: exit %d: %s", args, code, stderr)
		}
		return v
	}
	var inc float64
	for _, m := range admin("members")["members"].([]any) {
		mb := m.(map[string]any)
		if mb["node_id"].(float64) == float64(victim+1) {
			inc = mb["incarnation"].(float64)
		}
	}
	if inc == 0 {
		t.Fatalf("member %d not listed", victim+1)
	}
	admin("retire", "--node", fmt.Sprint(victim+1), "--incarnation", fmt.Sprint(inc))

	exited := make(chan error, 1)
	go func() { exited <- procs[victim].cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the retired member keeps running:\n%s", procs[victim].logString())
	}
	log := procs[victim].logString()
	if code := procs[victim].cmd.ProcessState.ExitCode(); code != exitRemoved {
		t.Fatalf("the retired member exited %d, want %d:\n%s", code, exitRemoved, log)
	}
	if !strings.Contains(log, "the member has been permanently removed from the cluster") {
		t.Fatalf("no removal line in the log:\n%s", log)
	}

	again := startServeEnv(t, bin, env, args(victim)...)
	go func() { exited <- again.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the retired member started again:\n%s", again.logString())
	}
	if code := again.cmd.ProcessState.ExitCode(); code != exitRemoved {
		t.Fatalf("restarted retired member exited %d, want %d:\n%s", code, exitRemoved, again.logString())
	}
	waitLeader() // the other two go on
}
