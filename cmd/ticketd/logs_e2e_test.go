package main

import (
	"strings"
	"syscall"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit"
)

// interrupt sends SIGINT and waits for the process to exit; it returns the
// exit status.
func (p *proc) interrupt(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	return p.cmd.ProcessState.ExitCode()
}

// TestServeLogIsQuiet runs `ticketd serve` at the default level through
// start-up, a leader election, a lock and a shutdown: the log holds the
// lifecycle events, one line each, and none of raft's or Pebble's own
// narration.
func TestServeLogIsQuiet(t *testing.T) {
	bin := binary(t)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	p := startServe(t, bin, "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20")
	waitReady(t, bin, url)
	if _, stderr, code := cli(t, bin, "lock", "acquire", "quiet", "--lease", "5s", "--nats", url); code != 0 {
		t.Fatalf("acquire: %s", stderr)
	}
	if code := p.interrupt(t); code != 0 {
		t.Fatalf("serve exited %d after SIGINT", code)
	}
	out := p.log.String()
	for _, chatter := range []string{
		"subsystem=raft", "subsystem=pebble", "Found 0 WALs", "MsgPreVoteResp", "MsgVoteResp",
		"became follower", "became candidate", "became pre-candidate", "switched to configuration",
		"newRaft", "cannot campaign", "level=DEBUG",
	} {
		if strings.Contains(out, chatter) {
			t.Errorf("the default log holds %q:\n%s", chatter, out)
		}
	}
	for _, event := range []string{`msg="leader elected"`, `msg="node started"`, `msg="node stopped"`} {
		if n := strings.Count(out, event); n != 1 {
			t.Errorf("the log holds %s %d times, want once:\n%s", event, n, out)
		}
	}
	t.Logf("%d lines at the default level:\n%s", strings.Count(out, "\n"), out)
}
