package daemon_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// infoLogger logs at the default level (info) into a buffer, as `ticketd
// serve` does into its stderr.
func infoLogger() (*slog.Logger, *testkit.LogBuffer) {
	buf := &testkit.LogBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})), buf
}

// TestHealthyClusterLogsNoError starts a 3-node cluster (embedded NATS
// servers routed to each other), keeps it busy for 2 s with one node
// down, and restarts that node: nothing of this is an ERROR (every start
// used to log 2-6 "Error trying to connect to route" at ERROR, and a node
// down ~4 a second on each other node), the route retries are WARN and at
// most one per node in the whole run, and the restarted node logs its own
// id and a real term.
func TestHealthyClusterLogsNoError(t *testing.T) {
	log, buf := infoLogger()
	c := testcluster.New(t, 3, testcluster.WithOptions(func(i int, o *daemon.Options) { o.Logger = log }))
	leader := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster version raised", func() bool { return testcluster.Settled(c.Node(leader)) })
	down := (leader + 1) % 3
	if err := c.Stop(down); err != nil {
		t.Fatal(err)
	}
	_, cl := connect(t, c.Node(leader))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// An observation window, not a wait for a condition: the cluster keeps
	// granting while the embedded servers retry their routes to the node
	// that is down (about four attempts a second each).
	window := time.Now().Add(2 * time.Second)
	for i := 0; i < 10000 && time.Now().Before(window); i++ {
		l, err := cl.Acquire(ctx, fmt.Sprintf("logs/%d", i), sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("acquire with one node down: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(down); err != nil {
		t.Fatal(err)
	}
	c.Converged(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "the restarted node knows the leader", func() bool {
		return c.Node(down).Node().Leader() != 0
	})
	c.Close()

	out := buf.String()
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("ERROR lines in a healthy run:\n%s", daemon.GrepLines(out, "level=ERROR"))
	}
	if retries := daemon.GrepLines(out, "Error trying to connect to route"); strings.Count(retries, "\n") > 3 || strings.Contains(retries, "level=ERROR") {
		t.Errorf("route retries, want at most one WARN per node:\n%s", retries)
	}
	if terms := daemon.GrepLines(out, `msg="leader elected"`); strings.Contains(terms, "term=0") {
		t.Errorf("a leader elected in term 0:\n%s", terms)
	}
	opened := regexp.MustCompile(`msg="raft storage opened" node=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(opened) != 4 {
		t.Fatalf("%d raft storage opened lines, want 4 (3 starts, 1 restart):\n%s", len(opened), out)
	}
	if last := opened[3][1]; last != fmt.Sprint(down+1) {
		t.Errorf("the restarted node %d opened its storage as node %s", down+1, last)
	}
}
