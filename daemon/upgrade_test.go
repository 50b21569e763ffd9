package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestMixedVersionRefusesSessionsUntilUpgrade (issue 24 item 4): in a
// 3-node cluster whose third member acts as a binary of cluster version 3
// (daemon.Options.MaxClusterVersion, test-only), the cluster stays at
// version 3 and every session subject and session field is refused with
// unsupported, also while that member leads; once it runs the newest
// version (restarted without the option) the leader raises the cluster
// version and sessions work. The old member applies only entry formats up
// to v3 (it would stop on a v4 entry, as an old binary does), so a session
// command that slipped past the gate would stop it: checked too.
func TestMixedVersionRefusesSessionsUntilUpgrade(t *testing.T) {
	const oldNode = 2
	c, oldVersion := startMixedVersion(t, oldNode, 3)
	versions := func() []uint64 { return clusterVersions(c) }
	allAt := func(v uint64) func() bool { return allAtVersion(c, v) }
	c.Leader(10 * time.Second)
	testkit.Eventually(t, 15*time.Second, "every node at cluster version 3", allAt(3))
	cl, err := sdk.Connect(c.ClientURL(0), sdk.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	st, err := cl.NodeStatus(ctx, oldNode+1)
	if err != nil || st.MaxClusterVersion != 3 {
		t.Fatalf("old member's status: max_cluster_version %v (err %v), want 3", st, err)
	}
	refused := func(when string) {
		t.Helper()
		if _, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(5*time.Second)); !errors.Is(err, sdk.ErrUnsupported) {
			t.Errorf("%s: session open: %v, want unsupported", when, err)
		}
		for _, rq := range []struct{ subject, body string }{
			{protocol.SubjectSessionOpen, `{"ttl_ms":5000}`},
			{protocol.SubjectSessionKeepAlive, `{"session":"1"}`},
			{protocol.SubjectSessionClose, `{"session":"1"}`},
			{protocol.SubjectAcquire, `{"key":"mixed/a","session":"1"}`},
			{protocol.SubjectAcquire, `{"key":"mixed/a","lease_ms":5000,"lock_delay_ms":100}`},
		} {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := cl.Conn().RequestWithContext(rctx, rq.subject, []byte(rq.body))
			rcancel()
			if err != nil {
				t.Errorf("%s: %s %s: %v", when, rq.subject, rq.body, err)
				continue
			}
			var perr *protocol.Error
			if err := protocol.ParseReply(m.Data, &struct{}{}); !errors.As(err, &perr) || perr.Code != protocol.CodeUnsupported {
				t.Errorf("%s: %s %s answered %s, want unsupported", when, rq.subject, rq.body, m.Data)
			}
		}
		// A plain lock still works at version 3.
		l, err := cl.Acquire(ctx, "mixed/plain", sdk.WithLease(5*time.Second))
		if err != nil {
			t.Errorf("%s: plain acquire: %v", when, err)
			return
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: release: %v", when, err)
		}
	}
	refused("old member following")

	// The old member leads: it must not raise the version past its own.
	if lead := c.Leader(10 * time.Second); lead != oldNode {
		if err := c.Node(lead).Node().TransferLeadership(ctx, oldNode+1); err != nil {
			t.Fatalf("hand leadership to the old member: %v", err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the old member leads", func() bool {
		d := c.Node(oldNode)
		return d.Locks().IsLeader() && d.API().Serving()
	})
	refused("old member leading")
	// The leader checks its members' versions every second: watch through
	// a few checks that the version never rises (bounded: 2.5 s).
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for i, v := range versions() {
			if v != 3 {
				t.Fatalf("node %d at cluster version %d while the old member leads, want 3", i+1, v)
			}
		}
	}
	refused("old member leading, 2.5 s later")

	// Upgrade: the old member restarts as the newest binary.
	oldVersion.Store(0)
	if err := c.Stop(oldNode); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(oldNode); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("every node at cluster version %d", core.MaxClusterVersion), allAt(core.MaxClusterVersion))
	s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(5*time.Second), sdk.WithSessionLockDelay(100*time.Millisecond))
	if err != nil {
		t.Fatalf("session open after the upgrade: %v", err)
	}
	l, err := s.Acquire(ctx, "mixed/a")
	if err != nil {
		t.Fatalf("acquire in a session after the upgrade: %v", err)
	}
	if n, err := s.Close(ctx); err != nil || n != 1 {
		t.Fatalf("session close: %d locks released, %v; want 1", n, err)
	}
	if h, err := cl.Get(ctx, "mixed/a"); err != nil || h.Held {
		t.Fatalf("after the session closed, get: %+v %v (token %d was the session's)", h, err, l.Token)
	}
	c.Converged(10 * time.Second)
}

// startMixedVersion starts a 3-node cluster whose member oldNode acts as a
// binary of cluster version v (daemon.Options.MaxClusterVersion,
// test-only). Store 0 in the returned value before restarting that member
// to upgrade it to the newest version.
func startMixedVersion(t testing.TB, oldNode int, v uint64) (*testcluster.Cluster, *atomic.Uint64) {
	var oldVersion atomic.Uint64
	oldVersion.Store(v)
	c := testcluster.New(t, 3, testcluster.WithOptions(func(i int, o *daemon.Options) {
		if i == oldNode {
			o.MaxClusterVersion = oldVersion.Load()
		}
	}))
	return c, &oldVersion
}

// clusterVersions is each node's cluster version (0 for a stopped node).
func clusterVersions(c *testcluster.Cluster) []uint64 {
	out := make([]uint64, c.Size())
	for i, d := range c.Nodes() {
		if d != nil {
			d.Node().View(func(m *core.Machine) { out[i] = m.ClusterVersion() })
		}
	}
	return out
}

// allAtVersion reports, when called, whether every node is at cluster
// version v.
func allAtVersion(c *testcluster.Cluster, v uint64) func() bool {
	return func() bool {
		for _, got := range clusterVersions(c) {
			if got != v {
				return false
			}
		}
		return true
	}
}
