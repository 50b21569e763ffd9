package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestFullDisk runs a real node on a 64 MiB tmpfs (root only) and fills
// the disk under it:
//   - below the alarm level: status shows the nospace alarm, an acquire is
//     refused with resource_exhausted (exit 4), a release still works;
//   - completely full: expiries and releases still apply;
//   - writes keep coming (releases of unknown keys, which are proposals
//     too) until even the ballast is spent: the node stops with one clear
//     log line and a non-zero exit, never a panic or a spin;
//   - restarted on the full disk it exits non-zero within seconds with
//     advice; with space freed it starts, and every acknowledged release
//     is still there.
func TestFullDisk(t *testing.T) {
	bin := binary(t)
	disk := testkit.Tmpfs(t, 64<<20)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	args := []string{"--data", filepath.Join(disk, "data"), "--nats-listen", addr, "--tick-ms", "20",
		"--disk-alarm-bytes", fmt.Sprint(16 << 20), "--disk-ballast-bytes", fmt.Sprint(4 << 20)}
	p := startServe(t, bin, args...)
	waitReady(t, bin, url)
	status := func() map[string]any {
		v, _, _ := cli(t, bin, "status", "--nats", url, "--timeout", "2s")
		return v
	}
	alarmed := func() bool {
		v := status()
		a, _ := v["alarms"].([]any)
		return len(a) == 1 && a[0] == "nospace"
	}

	v, _, code := cli(t, bin, "lock", "acquire", "long", "--lease", "60s", "--nats", url)
	if code != 0 {
		t.Fatalf("acquire exit %d", code)
	}
	long := token(t, v)
	for i := 0; i < 10; i++ {
		if _, stderr, code := cli(t, bin, "lock", "acquire", fmt.Sprintf("short%d", i), "--lease", "2s", "--nats", url); code != 0 {
			t.Fatalf("acquire short%d: %s", i, stderr)
		}
	}
	v, _, code = cli(t, bin, "lock", "acquire", "other", "--lease", "60s", "--nats", url)
	if code != 0 {
		t.Fatalf("acquire exit %d", code)
	}
	other := token(t, v)

	// Below the alarm level.
	testkit.Fill(t, disk, 10<<20)
	testkit.Eventually(t, 10*time.Second, "the nospace alarm in status", alarmed)
	_, stderr, code := cli(t, bin, "lock", "acquire", "refused", "--lease", "60s", "--nats", url)
	if code != 4 || !strings.Contains(stderr, "error: "+string(protocol.CodeResourceExhausted)+":") {
		t.Fatalf("acquire on a low disk: exit %d, stderr %q; want 4 and resource_exhausted", code, stderr)
	}
	if _, stderr, code := cli(t, bin, "lock", "release", "other", "--token", fmt.Sprint(other), "--nats", url); code != 0 {
		t.Fatalf("release on a low disk: %s", stderr)
	}

	// Completely full: the short leases still expire, a release applies.
	testkit.Fill(t, disk, 0)
	testkit.Eventually(t, 20*time.Second, "the short leases expire on a full disk", func() bool {
		l, _ := status()["locks"].(float64)
		return l == 1
	})
	if _, stderr, code := cli(t, bin, "lock", "release", "long", "--token", fmt.Sprint(long), "--nats", url); code != 0 {
		t.Fatalf("release on a full disk: %s", stderr)
	}
	before := status()

	// Keep writing until the ballast is spent too: the node must stop
	// cleanly (one line, non-zero exit).
	nc := testkit.Connect(t, url)
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	var exitErr error
spam:
	for i := 0; ; i++ {
		select {
		case exitErr = <-exited:
			break spam
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the node kept running on a full disk with its ballast spent for 90s")
		}
		// Token 1 was issued (and is held by none of these keys): each
		// release is proposed and writes an entry. A token above the last
		// one issued would be refused before proposing.
		body := fmt.Sprintf(`{"key":"nosuch/%0400d","token":1}`, i)
		_, _ = nc.Request(protocol.SubjectRelease, []byte(body), 2*time.Second)
	}
	if exitErr == nil {
		t.Fatal("the node exited 0 after a storage failure")
	}
	log := p.log.String()
	if n := strings.Count(log, "storage failure: stopping the node (fail-stop)"); n != 1 || strings.Contains(log, "goroutine ") || !strings.Contains(log, "no space left on device") {
		t.Fatalf("want exactly one storage-failure line naming ENOSPC and no stack trace; got %d lines in:\n%s", n, log)
	}

	// Restart on the full disk: out within seconds, with advice.
	start := time.Now()
	out, code := serveUntilExit(t, bin, 20*time.Second, args...)
	if code == 0 || time.Since(start) > 5*time.Second || !strings.Contains(out, "free space on that disk") {
		t.Fatalf("restart on a full disk: exit %d after %v, output %q", code, time.Since(start), out)
	}

	// Room again: the node starts and the acknowledged releases held.
	testkit.Unfill(t, disk)
	startServe(t, bin, args...)
	waitReady(t, bin, url)
	for _, key := range []string{"long", "other"} {
		if v, _, _ := cli(t, bin, "lock", "get", key, "--nats", url); v["held"] != false {
			t.Fatalf("%s after the restart: %v, want released", key, v)
		}
	}
	if after := status(); after["last_token"] != before["last_token"] {
		t.Fatalf("last token %v before the failure, %v after", before["last_token"], after["last_token"])
	}
	if _, stderr, code := cli(t, bin, "lock", "acquire", "again", "--lease", "5s", "--nats", url); code != 0 {
		t.Fatalf("acquire after space was freed: %s", stderr)
	}
}

// serveUntilExit runs `ticketd serve args` expecting it to exit by itself
// within timeout, and returns its combined output and exit code.
func serveUntilExit(t *testing.T, bin string, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	p := startServe(t, bin, args...)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("serve %v did not exit within %v", args, timeout)
	}
	return p.log.String(), p.cmd.ProcessState.ExitCode()
}
