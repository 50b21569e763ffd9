package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// TestJoinLogsTrueLines: a node joining a control-plane cluster (and
// restarting) logs under the id the cluster gave it, never under the
// default --id 1; the membership lines say what happened (a learner
// added, then promoted); the cluster version line says from and to only;
// the joining node's handshakes, refused until its admission applies, are
// not warnings; nothing is an ERROR.
func TestJoinLogsTrueLines(t *testing.T) {
	c := newControlCluster(t, 2)
	newLog := func() (*slog.Logger, *testkit.LogBuffer) {
		buf := &testkit.LogBuffer{}
		return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})), buf
	}
	logA, bufA := newLog()
	logB, bufB := newLog()
	startWith := func(cfg Config, log *slog.Logger) *Daemon {
		d, err := Start(context.Background(), cfg, Options{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, d)
		t.Cleanup(d.Close)
		return d
	}
	boot := c.config(0)
	boot.BootstrapCredential = testBoot
	a := startWith(boot, logA)
	testkit.Eventually(t, 10*time.Second, "node 1 leads", func() bool { return a.Locks().IsLeader() })
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot}); err != nil {
		t.Fatal(err)
	}
	mint, err := c.call("/v1/join-credentials", testAdmin, control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.config(1)
	cfg.Join, cfg.JoinCredential = strings.Join(c.urls(), ","), mint.Credential
	b := startWith(cfg, logB)
	c.waitVoters(1, 2)
	b.Close()
	b = startWith(cfg, logB)
	testkit.Eventually(t, 10*time.Second, "the restarted node knows the leader", func() bool { return b.Node().Leader() != 0 })
	a.Close()
	b.Close()

	outA, outB := bufA.String(), bufB.String()
	for name, out := range map[string]string{"node 1": outA, "node 2": outB} {
		if bad := grepLines(out, "level=ERROR"); bad != "" {
			t.Errorf("%s logged ERROR lines:\n%s", name, bad)
		}
		if bad := grepLines(grepLines(out, "level=WARN"), "handshake"); bad != "" {
			t.Errorf("%s warned about a joining node's handshakes:\n%s", name, bad)
		}
	}
	opened := strings.Split(strings.TrimSpace(grepLines(outB, `msg="raft storage opened"`)), "\n")
	if len(opened) != 2 || strings.Contains(opened[0], "node=") || !strings.Contains(opened[1], "node=2 ") {
		t.Errorf("the joining node opened its storage as:\n%s\nwant no id before the join, node=2 after the restart", strings.Join(opened, "\n"))
	}
	if !strings.Contains(outA, `msg="learner added" node=1 component=raftstore member=2`) ||
		!strings.Contains(outA, `msg="learner promoted to voter" node=1 component=raftstore member=2`) {
		t.Errorf("membership lines of the join:\n%s", grepLines(outA, "component=raftstore member="))
	}
	want := fmt.Sprintf("from=1 to=%d", core.MaxClusterVersion)
	if v := grepLines(outA, "cluster version raised"); !strings.Contains(v, want) || strings.Contains(v, "result=") {
		t.Errorf("cluster version line %q, want %s and nothing else", v, want)
	}
}

// grepLines is the lines of out that contain s, each ending in a newline.
func grepLines(out, s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(out, "\n") {
		if strings.Contains(line, s) {
			b.WriteString(line)
		}
	}
	return b.String()
}
