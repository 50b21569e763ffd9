package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// TestStatusWatch runs `ticketd status --watch` against a three-node
// cluster while locks are taken: it refreshes a row per member (one
// leader, two followers) with rates from the second refresh on, each
// member's cluster format, alarms and binary version; a member that stops
// shows as unreachable there and in `status`; it exits 0 on SIGINT.
func TestStatusWatch(t *testing.T) {
	bin := binary(t)
	c := testcluster.New(t, 3)
	c.Leader(10 * time.Second)
	url := c.ClientURL(0)
	cl, err := sdk.New(testkit.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "status", "--watch", "--interval", "200ms", "--nats", url)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var mu sync.Mutex
	var out strings.Builder
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	text := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }

	for i := 0; i < 5; i++ {
		if _, err := cl.Acquire(t.Context(), "watch/"+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	// Three refreshes: the later ones carry rates.
	testkit.Eventually(t, 20*time.Second, "three refreshes", func() bool {
		return strings.Count(text(), "ticketd  ") >= 3
	})
	views := strings.Split(strings.TrimSpace(text()), "\n\n")
	last := views[len(views)-1]
	t.Logf("last view:\n%s", last)
	roles := map[string]int{}
	for _, line := range strings.Split(last, "\n")[2:] {
		if f := strings.Fields(line); len(f) == 13 {
			roles[f[1]]++
			if f[6] != "5" {
				t.Errorf("member %s shows %s locks, want 5", f[0], f[6])
			}
			if f[10] != fmt.Sprint(core.MaxClusterVersion) || f[11] != "-" || f[12] == "-" {
				t.Errorf("member %s: format %s, alarms %s, version %s", f[0], f[10], f[11], f[12])
			}
		}
	}
	if roles["leader"] != 1 || roles["follower"] != 2 {
		t.Errorf("rows by role %v, want one leader and two followers:\n%s", roles, last)
	}
	for _, col := range []string{"ROLE", "TERM", "COMMIT", "APPLIED", "LAG", "LOCKS", "APPLIED/s", "GRANTS/s", "FORMAT", "ALARMS", "VERSION"} {
		if !strings.Contains(last, col) {
			t.Errorf("no %s column:\n%s", col, last)
		}
	}
	if strings.Contains(last, "unreachable") {
		t.Errorf("want every member reachable:\n%s", last)
	}

	// A member stops: its row says unreachable, and so does `status`.
	lead := c.Leader(10 * time.Second)
	stopped := c.Follower(lead)
	if stopped == 0 { // the watch asks node 1's server: stop another
		stopped = 3 - lead
	}
	if err := c.Stop(stopped); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "an unreachable row", func() bool {
		return strings.Contains(text(), fmt.Sprintf("%d  unreachable", stopped+1))
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-readDone
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("status --watch exited %d after SIGINT (%v): %s", code, err, stderr.String())
	}
	var serr strings.Builder
	status := exec.Command(bin, "status", "--nats", url)
	status.Stderr = &serr
	js, err := status.Output()
	if err != nil {
		t.Fatalf("status: %v: %s", err, serr.String())
	}
	var st struct {
		Unreachable  []uint64 `json:"unreachable"`
		MemberStatus []struct {
			ID        uint64 `json:"id"`
			Reachable bool   `json:"reachable"`
			Role      string `json:"role"`
		} `json:"member_status"`
		PluginMismatch []any `json:"plugin_mismatch"`
	}
	if err := json.Unmarshal(js, &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, js)
	}
	if fmt.Sprint(st.Unreachable) != fmt.Sprintf("[%d]", stopped+1) || len(st.MemberStatus) != 3 || st.PluginMismatch != nil {
		t.Fatalf("status with node %d stopped:\n%s", stopped+1, js)
	}
}
