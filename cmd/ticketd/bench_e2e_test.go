package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit"
)

// TestBenchAgainstLocalNode runs `ticketd bench` against a real `ticketd
// serve` process: both modes report the harness's figures (cycles/s,
// acquire and release percentiles) and the node's CPU per cycle, for the
// pid given and for the processes found in /proc.
func TestBenchAgainstLocalNode(t *testing.T) {
	bin := binary(t)
	addr := testkit.FreeAddr(t)
	url := "nats://" + addr
	p := startServe(t, bin, "--data", t.TempDir(), "--nats-listen", addr, "--tick-ms", "20")
	waitReady(t, bin, url)
	pid := p.cmd.Process.Pid

	for _, pids := range []string{fmt.Sprint(pid), "auto"} {
		var out, errb bytes.Buffer
		cmd := exec.Command(bin, "bench", "--nats", url, "--clients", "4", "--keys", "20", "--duration", "1s",
			"--warmup", "200ms", "--mode", "try,wait", "--wait", "1s", "--cpu-pids", pids, "--json")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench --cpu-pids %s: %v\n%s", pids, err, errb.String())
		}
		var res []BenchResult
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("bench output %q: %v", out.String(), err)
		}
		if len(res) != 2 || res[0].Mode != "try" || res[1].Mode != "wait" {
			t.Fatalf("bench --cpu-pids %s: results %+v, want try then wait", pids, res)
		}
		for _, r := range res {
			if r.Cycles == 0 || r.CyclesPerSec <= 0 || r.Errors != 0 || r.Acquire.P50 <= 0 || r.Acquire.P99 < r.Acquire.P50 ||
				r.Release.P50 <= 0 || r.Release.P99 < r.Release.P50 {
				t.Errorf("%s: figures %+v", r.Mode, r)
			}
			if !slices.Contains(r.NodePids, pid) || r.NodeCPUS <= 0 || r.NodeCPUUSPerCycle <= 0 {
				t.Errorf("%s --cpu-pids %s: node cpu %v s over %v = %v us/cycle; want pid %d charged", r.Mode, pids, r.NodeCPUS, r.NodePids, r.NodeCPUUSPerCycle, pid)
			}
		}
	}
}
