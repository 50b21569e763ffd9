package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// A static member whose data directory was wiped does not bootstrap
// again unless told the cluster is new; told so with another cluster's
// token, it would be a node of another cluster on the same NATS mesh, and
// its start is refused (ErrForeignCluster: two clusters would serve the
// same lock subjects). Started apart from the mesh (no other member's
// route listens), it bootstraps, and the members refuse it in the
// handshake even though it knows the secret.
func TestWipedStaticMember(t *testing.T) {
	c := testcluster.New(t, 3)
	c.Leader(10 * time.Second)
	id := c.Node(0).ClusterID()
	for i := range 3 {
		if got := c.Node(i).ClusterID(); got == 0 || got != id {
			t.Fatalf("node %d has cluster ID %x, node 1 %x", i+1, got, id)
		}
	}
	if err := c.Stop(2); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.Config(2).Data); err != nil {
		t.Fatal(err)
	}
	c.UpdateConfig(2, func(cfg *daemon.Config) { cfg.InitialClusterState = daemon.ClusterStateExisting })
	if err := c.Start(2); !errors.Is(err, daemon.ErrWipedMember) {
		t.Fatalf("restart on a wiped data directory: %v, want ErrWipedMember", err)
	}

	c.Leader(10 * time.Second) // the two members have a leader to answer (node 3 may have led)
	c.UpdateConfig(2, func(cfg *daemon.Config) {
		cfg.InitialClusterState, cfg.InitialClusterToken = daemon.ClusterStateNew, "another-cluster"
	})
	if err := c.Start(2); !errors.Is(err, daemon.ErrForeignCluster) || !strings.Contains(err.Error(), "same lock subjects") {
		t.Fatalf("a new member of another cluster on the running cluster's NATS mesh: %v, want ErrForeignCluster", err)
	}
	if err := os.RemoveAll(c.Config(2).Data); err != nil {
		t.Fatal(err)
	}
	c.UpdateConfig(2, func(cfg *daemon.Config) { // off the mesh: nothing to ask
		cfg.NATSRoutes, cfg.NATSClusterListen = "", testkit.FreeAddr(t)
	})
	if err := c.Start(2); err != nil {
		t.Fatal(err)
	}
	if c.Node(2).ClusterID() == id {
		t.Fatal("another token derived the same cluster ID")
	}
	testkit.Eventually(t, 10*time.Second, "the members refuse the other cluster's node", func() bool {
		return c.Node(0).Peers().Stats().HandshakeFailures > 0 && c.Node(1).Peers().Stats().HandshakeFailures > 0
	})
	if got := c.Node(2).Node().Status().Lead; got != 0 {
		t.Fatalf("the other cluster's node follows leader %d", got)
	}
	c.Leader(10 * time.Second) // the two members still form the cluster
}

// A wiped member started again with --initial-cluster-state new, as the
// old Taskfile did, is refused: its leader remembers its log (raft would
// later panic, "tocommit is out of range"), so the data was lost and the
// member must be replaced. Once it is removed, the same start is refused
// because the leader no longer lists it.
func TestWipedMemberToldNewIsRefused(t *testing.T) {
	logs := make([]*testkit.LogBuffer, 3)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) {
		cfg.ControlListen = testkit.FreeAddr(t)
		cfg.ControlCredential = staticAdmin
	}), testcluster.WithOptions(func(i int, o *daemon.Options) {
		o.Logger, logs[i] = testkit.CaptureLogger()
	}))
	leader := c.Leader(10 * time.Second)
	victim := c.Follower(leader)
	c.Converged(10 * time.Second)
	if err := c.Stop(victim); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.Config(victim).Data); err != nil {
		t.Fatal(err)
	}
	err := c.Start(victim) // its config says new, like every member's here
	if !errors.Is(err, daemon.ErrWipedMember) || !strings.Contains(err.Error(), "--replace") {
		t.Fatalf("wiped member started as new: %v, want ErrWipedMember naming --replace; its log:\n%s", err, logs[victim])
	}
	rep, err := adminCall(t, controlURLs(c), "/v1/members", control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range rep.Members {
		if m.NodeID == uint64(victim+1) {
			if _, err := adminCall(t, controlURLs(c), "/v1/retire", control.Request{NodeID: m.NodeID, Incarnation: m.Incarnation}); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.Eventually(t, 10*time.Second, "the leader drops the retired member", func() bool {
		return len(c.Node(leader).Node().ConfState().Voters) == 2
	})
	if err := os.RemoveAll(c.Config(victim).Data); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(victim); !errors.Is(err, daemon.ErrWipedMember) || !strings.Contains(err.Error(), "does not list") {
		t.Fatalf("removed member started as new: %v", err)
	}
}

const staticAdmin = "static-admin-credential-0123"

// staticControlCluster is a three-node static cluster whose nodes each
// serve the control API on loopback with the admin credential.
func staticControlCluster(t *testing.T) *testcluster.Cluster {
	return testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) {
		cfg.ControlListen = testkit.FreeAddr(t)
		cfg.ControlCredential = staticAdmin
	}))
}

// controlURLs are the control URLs of c's running nodes.
func controlURLs(c *testcluster.Cluster) []string {
	var out []string
	for _, d := range c.Nodes() {
		if d != nil {
			out = append(out, "http://"+d.ControlAddr())
		}
	}
	return out
}

func adminCall(t *testing.T, urls []string, path string, req control.Request) (control.Reply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return control.Call(ctx, urls, path, staticAdmin, req)
}

// A static cluster replaces a wiped member the way a control-plane cluster
// does: the admin API records the static members in the control state,
// a new node joins with --replace, the replacement completes by joint
// consensus, clients keep taking locks throughout, and the old identity
// is retired for good: its peers refuse it.
func TestStaticClusterReplacesWipedMember(t *testing.T) {
	c := staticControlCluster(t)
	leader := c.Leader(10 * time.Second)
	victim := c.Follower(leader)
	victimID := uint64(victim + 1)

	cl, err := sdk.New(testkit.Connect(t, c.ClientURL(leader)))
	if err != nil {
		t.Fatal(err)
	}
	var (
		stop   atomic.Bool
		wg     sync.WaitGroup
		tokens sync.Map
		taken  atomic.Int64
		failed atomic.Int64
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 20000; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l, err := cl.Acquire(ctx, fmt.Sprintf("static/%d", i), sdk.WithLease(time.Minute))
			cancel()
			if err != nil {
				failed.Add(1)
				continue
			}
			if _, dup := tokens.LoadOrStore(l.Token, i); dup {
				t.Errorf("token %d issued twice", l.Token)
			}
			taken.Add(1)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	// The member dies and its data directory is lost. Keep a copy of what
	// it held, to bring the old identity back later.
	if err := c.Stop(victim); err != nil {
		t.Fatal(err)
	}
	oldCfg := c.Config(victim)
	saved := filepath.Join(t.TempDir(), "old")
	if err := os.CopyFS(saved, os.DirFS(oldCfg.Data)); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(oldCfg.Data); err != nil {
		t.Fatal(err)
	}

	urls := controlURLs(c)
	rep, err := adminCall(t, urls, "/v1/members", control.Request{})
	if err != nil || len(rep.Members) != 3 {
		t.Fatalf("members of the static cluster: %+v %v", rep, err)
	}
	for _, m := range rep.Members {
		if m.Role != "voter" || m.Address != c.Config(int(m.NodeID-1)).PeerListen {
			t.Fatalf("member %+v does not match the static list", m)
		}
	}

	// The replacement: a fresh data directory, the dead member's
	// addresses, joining through the control API.
	repl := oldCfg
	repl.Data = filepath.Join(t.TempDir(), "replacement")
	repl.InitialCluster, repl.InitialClusterState = "", daemon.ClusterStateExisting
	repl.Join, repl.Replace = strings.Join(urls, ","), victimID
	nd, err := daemon.Start(context.Background(), repl, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatalf("replacement: %v", err)
	}
	t.Cleanup(nd.Close)
	ident, ok, err := control.ReadIdentity(repl.Data)
	if err != nil || !ok || ident.NodeID != 4 {
		t.Fatalf("replacement identity %+v %v %v", ident, ok, err)
	}
	// Until the swap it is a learner, and its status says so.
	testkit.Eventually(t, 10*time.Second, "the replacement reports itself a learner", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := cl.NodeStatus(ctx, ident.NodeID)
		return err == nil && st.Role == "learner"
	})
	testkit.Eventually(t, 30*time.Second, "the replacement completes once caught up", func() bool {
		_, err := adminCall(t, urls, "/v1/replacements/complete", control.Request{OldNodeID: victimID, NodeID: ident.NodeID, Incarnation: ident.Incarnation})
		return err == nil
	})
	var want []uint64
	for _, id := range []uint64{1, 2, 3, 4} {
		if id != victimID {
			want = append(want, id)
		}
	}
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("voters %v everywhere", want), func() bool {
		for _, d := range append(c.Nodes(), nd) {
			if d == nil {
				continue
			}
			cs := d.Node().ConfState()
			if fmt.Sprint(cs.Voters) != fmt.Sprint(want) || len(cs.Learners) != 0 || len(cs.VotersOutgoing) != 0 {
				return false
			}
		}
		return true
	})
	// The cluster keeps serving, the new member included.
	before := taken.Load()
	testkit.Eventually(t, 20*time.Second, "locks granted after the replacement", func() bool { return taken.Load() >= before+20 })
	testkit.Eventually(t, 20*time.Second, "the replacement applies the lock table", func() bool {
		return testcluster.StateOf(nd).LastToken >= testcluster.StateOf(c.Node(leader)).LastToken-5 && testcluster.StateOf(nd).LastToken > 0
	})

	// The old identity is retired: the replicated state says so, and the
	// members refuse the old node when it comes back with its data.
	var identErr error
	c.Node(leader).Node().View(func(m *core.Machine) { identErr = m.CheckIdentity(victimID, 0) })
	if !errors.Is(identErr, core.ErrNodeRetired) {
		t.Fatalf("CheckIdentity of the replaced member: %v", identErr)
	}
	old := oldCfg
	old.Data = saved
	old.PeerListen, old.NATSListen, old.NATSClusterListen, old.ControlListen = testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t), ""
	failures := func() (n uint64) {
		for _, d := range c.Nodes() {
			if d != nil {
				n += d.Peers().Stats().HandshakeFailures
			}
		}
		return n
	}
	refusedBefore := failures()
	od, err := daemon.Start(context.Background(), old, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatalf("old node: %v", err)
	}
	t.Cleanup(od.Close)
	testkit.Eventually(t, 10*time.Second, "the members refuse the replaced node", func() bool { return failures() > refusedBefore })
	if lead := od.Node().Status().Lead; lead != 0 {
		t.Fatalf("the replaced node follows leader %d", lead)
	}
	// It never applied its removal (it was down), yet it learns it from
	// the leader's status and stops itself instead of campaigning forever.
	select {
	case <-od.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the replaced node keeps running")
	}
	if err := od.Err(); !errors.Is(err, daemon.ErrRemoved) {
		t.Fatalf("the replaced node stopped with %v, want ErrRemoved", err)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d locks granted, %d acquires failed during the replacement", taken.Load(), failed.Load())
}

// A member retired while it runs applies its own retirement and stops
// itself, saying so once at ERROR; started again, it refuses, at once or
// once the leader tells it.
func TestRetiredMemberStopsItself(t *testing.T) {
	logs := make([]*testkit.LogBuffer, 3)
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) {
		cfg.ControlListen = testkit.FreeAddr(t)
		cfg.ControlCredential = staticAdmin
	}), testcluster.WithOptions(func(i int, o *daemon.Options) {
		o.Logger, logs[i] = testkit.CaptureLogger()
	}))
	leader := c.Leader(10 * time.Second)
	victim := c.Follower(leader)
	urls := controlURLs(c)
	rep, err := adminCall(t, urls, "/v1/members", control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	var inc uint64
	for _, m := range rep.Members {
		if m.NodeID == uint64(victim+1) {
			inc = m.Incarnation
		}
	}
	if _, err := adminCall(t, urls, "/v1/retire", control.Request{NodeID: uint64(victim + 1), Incarnation: inc}); err != nil {
		t.Fatal(err)
	}
	d := c.Node(victim)
	select {
	case <-d.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the retired member keeps running")
	}
	if err := d.Err(); !errors.Is(err, daemon.ErrRemoved) {
		t.Fatalf("stopped with %v, want ErrRemoved", err)
	}
	if n := strings.Count(logs[victim].String(), "the member has been permanently removed from the cluster"); n != 1 {
		t.Fatalf("%d removal log lines:\n%s", n, logs[victim].String())
	}
	if err := c.Stop(victim); err != nil {
		t.Fatal(err)
	}
	// Started again, it refuses at once when it applied its retirement
	// before it stopped. It may instead have learned of it from the leader
	// over NATS (the leader removed it from raft before it heard that its
	// Retire committed); then it starts, finds no leader that lists it,
	// asks, and stops itself again.
	err = c.Start(victim)
	if err == nil {
		again := c.Node(victim)
		select {
		case <-again.Done():
			err = again.Err()
		case <-time.After(30 * time.Second):
			t.Fatal("the retired member, started again, keeps running")
		}
	}
	if !errors.Is(err, daemon.ErrRemoved) {
		t.Fatalf("restart of a retired member: %v, want ErrRemoved", err)
	}
	// The other two go on as a two-voter cluster.
	c.Leader(10 * time.Second)
}
