package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

const (
	testAdmin = "admin-credential-for-tests"
	testBoot  = "bootstrap-credential-for-tests"
)

// controlCluster starts nodes that form a cluster through the control
// plane; every node's NATS server routes to every other. It is not
// testcluster's fixed slots: nodes join, are replaced and come back under
// stale identities, and these tests read unexported state (the control
// plane's members, the store's first index), so they stay in package
// daemon, which testcluster (it imports daemon) cannot serve.
type controlCluster struct {
	t      *testing.T
	routes []string
	nodes  []*Daemon
	cfgs   []Config
}

func newControlCluster(t *testing.T, slots int) *controlCluster {
	c := &controlCluster{t: t}
	for i := 0; i < slots; i++ {
		c.routes = append(c.routes, testkit.FreeAddr(t))
	}
	t.Cleanup(func() {
		for _, d := range c.nodes {
			if d != nil {
				d.Close()
			}
		}
	})
	return c
}

func (c *controlCluster) config(slot int) Config {
	cfg := Defaults()
	cfg.Data = c.t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.NATSClusterListen = c.routes[slot]
	cfg.NATSRoutes = strings.Join(c.routes, ",")
	cfg.PeerListen = testkit.FreeAddr(c.t)
	cfg.PeerSecret = "control-test-peer-secret-0123"
	cfg.ControlListen = testkit.FreeAddr(c.t)
	cfg.ControlCredential = testAdmin
	cfg.TickMS = testkit.TickMS
	cfg.ElectionTicks = testkit.ElectionTicks
	return cfg
}

func (c *controlCluster) start(cfg Config) (*Daemon, error) {
	d, err := Start(context.Background(), cfg, Options{Logger: testkit.QuietLogger()})
	if err == nil {
		c.nodes = append(c.nodes, d)
		c.cfgs = append(c.cfgs, cfg)
		// Registered after config's TempDir, so it runs before the
		// directory is removed (cleanups run last-in first-out).
		c.t.Cleanup(d.Close)
	}
	return d, err
}

// client is an SDK client on a new connection to d.
func (c *controlCluster) client(d *Daemon) *sdk.Client {
	cl, err := sdk.New(testkit.Connect(c.t, d.ClientURL()))
	if err != nil {
		c.t.Fatalf("sdk: %v", err)
	}
	return cl
}

// tableDigest is the digest of d's lock table.
func tableDigest(d *Daemon) (sum [32]byte) {
	d.Node().View(func(m *core.Machine) { sum = m.Digest() })
	return sum
}

func (c *controlCluster) urls() []string {
	var out []string
	for _, d := range c.nodes {
		if d != nil {
			out = append(out, "http://"+d.ControlAddr())
		}
	}
	return out
}

func (c *controlCluster) call(path, cred string, body control.Request) (control.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return control.Call(ctx, c.urls(), path, cred, body)
}

func (c *controlCluster) leader() *Daemon {
	var l *Daemon
	testkit.Eventually(c.t, 10*time.Second, "a leader", func() bool {
		for _, d := range c.nodes {
			if d != nil && d.Locks().IsLeader() {
				l = d
				return true
			}
		}
		return false
	})
	return l
}

// waitVoters waits until the leader's raft membership is exactly voters
// with no learner and no joint configuration.
func (c *controlCluster) waitVoters(voters ...uint64) {
	c.t.Helper()
	want := fmt.Sprint(voters)
	testkit.Eventually(c.t, 20*time.Second, "voters "+want, func() bool {
		for _, d := range c.nodes {
			if d != nil && d.Locks().IsLeader() {
				cs := d.Node().ConfState()
				return fmt.Sprint(cs.Voters) == want && len(cs.Learners) == 0 && len(cs.VotersOutgoing) == 0
			}
		}
		return false
	})
}

func rejectedWith(err error, reason string) bool {
	var ce *control.Error
	return errors.As(err, &ce) && ce.Code == control.CodeRejected && ce.Reason == reason
}

// TestControlPlane forms a cluster by bootstrap and two joins, replaces a
// killed voter while clients keep taking locks, aborts a replacement, and
// refuses every reuse of an identity or credential.
func TestControlPlane(t *testing.T) {
	c := newControlCluster(t, 6)
	boot := c.config(0)
	boot.BootstrapCredential = testBoot
	a, err := c.start(boot)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "node 1 leads", func() bool { return a.Locks().IsLeader() })

	// Bootstrap: the admin credential is required, then the bootstrap one.
	if _, err := c.call("/v1/bootstrap", "", control.Request{Credential: testBoot}); err == nil || !strings.Contains(err.Error(), control.CodeUnauthorized) {
		t.Fatalf("bootstrap without admin credential: %v", err)
	}
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: "wrong"}); err == nil || !strings.Contains(err.Error(), control.CodeUnauthorized) {
		t.Fatalf("bootstrap with a wrong credential: %v", err)
	}
	rep, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot})
	if err != nil || rep.NodeID != 1 || rep.Incarnation != 1 {
		t.Fatalf("bootstrap: %+v %v", rep, err)
	}
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot}); !rejectedWith(err, "already_bootstrapped") {
		t.Fatalf("second bootstrap: %v", err)
	}

	// Two joins with one-time credentials.
	var creds []string
	for i := 0; i < 3; i++ {
		rep, err := c.call("/v1/join-credentials", testAdmin, control.Request{})
		if err != nil || len(rep.Credential) != 64 {
			t.Fatalf("mint: %+v %v", rep, err)
		}
		creds = append(creds, rep.Credential)
	}
	for i, cred := range creds[:2] {
		cfg := c.config(i + 1)
		cfg.Join = strings.Join(c.urls(), ",")
		cfg.JoinCredential = cred
		if _, err := c.start(cfg); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	c.waitVoters(1, 2, 3)
	// The bootstrap credential is consumed on every node: asking through
	// any of them is refused by the replicated state.
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot}); !rejectedWith(err, "already_bootstrapped") {
		t.Fatalf("bootstrap after joins: %v", err)
	}
	// A join credential works once.
	reuse := c.config(3)
	reuse.Join, reuse.JoinCredential = strings.Join(c.urls(), ","), creds[0]
	if _, err := c.start(reuse); !rejectedWith(err, "credential_reused") {
		t.Fatalf("reused join credential: %v", err)
	}
	for _, d := range c.nodes {
		testkit.Eventually(t, 10*time.Second, "three members everywhere", func() bool { return len(d.ctl.Members()) == 3 })
	}

	// Clients keep taking locks through node 1 while a voter is replaced.
	cl := c.client(a)
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		held     = map[string]uint64{}
		maxToken uint64
		failures []error
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; !stop.Load() && i < 10000; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				key := fmt.Sprintf("w%d/%d", w, i)
				l, err := cl.Acquire(ctx, key, sdk.WithLease(5*time.Minute))
				cancel()
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
				} else {
					if l.Token > maxToken {
						maxToken = l.Token
					}
					held[key] = l.Token
				}
				mu.Unlock()
			}
		}(w)
	}
	var victim *Daemon
	var victimIdx int
	for i, d := range c.nodes {
		if d != nil && d != a && !d.Locks().IsLeader() {
			victim, victimIdx = d, i
			break
		}
	}
	victimID := victim.cfg.ID
	victimCfg := c.cfgs[victimIdx]
	victim.Close()
	c.nodes[victimIdx] = nil

	repl := c.config(4)
	repl.Join, repl.Replace = strings.Join(c.urls(), ","), victimID
	e, err := c.start(repl)
	if err != nil {
		t.Fatalf("replacement node: %v", err)
	}
	newID := e.cfg.ID
	id, _, _ := control.ReadIdentity(repl.Data)
	var done control.Reply
	testkit.Eventually(t, 20*time.Second, "replacement completes once caught up", func() bool {
		done, err = c.call("/v1/replacements/complete", testAdmin, control.Request{OldNodeID: victimID, NodeID: newID, Incarnation: id.Incarnation})
		return err == nil
	})
	voters := []uint64{1, 2, 3, 4}
	var want []uint64
	for _, v := range voters {
		if v != victimID {
			want = append(want, v)
		}
	}
	c.waitVoters(want...)

	// Abort path: prepare a replacement of node 1, then abort it.
	abortCfg := c.config(5)
	abortCfg.Join, abortCfg.Replace = strings.Join(c.urls(), ","), 1
	f, err := c.start(abortCfg)
	if err != nil {
		t.Fatalf("second replacement: %v", err)
	}
	fid, _, _ := control.ReadIdentity(abortCfg.Data)
	if _, err := c.call("/v1/replacements/abort", testAdmin, control.Request{OldNodeID: 1, NodeID: fid.NodeID, Incarnation: fid.Incarnation}); err != nil {
		t.Fatalf("abort: %v", err)
	}
	c.waitVoters(want...)
	if _, err := c.call("/v1/replacements/abort", testAdmin, control.Request{OldNodeID: 1, NodeID: fid.NodeID, Incarnation: fid.Incarnation}); !rejectedWith(err, "no_replacement") {
		t.Fatalf("second abort: %v", err)
	}
	f.Close()

	stop.Store(true)
	wg.Wait()
	// The retired voter may not come back with its old identity.
	if _, err := c.start(victimCfg); err == nil || !strings.Contains(err.Error(), "refuses identity") {
		t.Fatalf("retired node restarted: %v", err)
	}
	// Nor may a node claim a current NodeID under an old incarnation.
	stale := c.config(5)
	if err := os.MkdirAll(stale.Data, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := control.WriteIdentity(stale.Data, control.Identity{NodeID: want[1], Incarnation: 1, ControlURLs: c.urls()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.start(stale); err == nil || !strings.Contains(err.Error(), "refuses identity") {
		t.Fatalf("old incarnation accepted: %v", err)
	}
	// Retired identities and consumed credentials stay refused by the
	// replicated state itself.
	var identErr error
	c.leader().Node().View(func(m *core.Machine) { identErr = m.CheckIdentity(victimID, 0) })
	if identErr == nil {
		t.Fatal("retired NodeID passes CheckIdentity")
	}

	// No lock was lost and tokens only grew.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mu.Lock()
	defer mu.Unlock()
	if len(held) < 10 {
		t.Fatalf("only %d locks taken during the replacement (failures %v)", len(held), failures)
	}
	for _, err := range failures {
		if !errors.Is(err, sdk.ErrIndeterminate) && !errors.Is(err, sdk.ErrUnavailable) {
			t.Errorf("client error during replacement: %v", err)
		}
	}
	seen := map[uint64]string{}
	for key, tok := range held {
		if other, dup := seen[tok]; dup {
			t.Fatalf("token %d issued to %s and %s", tok, other, key)
		}
		seen[tok] = key
		h, err := cl.Get(ctx, key)
		if err != nil || !h.Held || h.Token != tok {
			t.Fatalf("%s lost: %+v %v, want token %d", key, h, err, tok)
		}
	}
	t.Logf("%d locks taken during the replacement, %d client failures, replacement result %s", len(held), len(failures), done.Result)
}

// TestDeadLearnerIsNotPromoted: a node admitted but never started (or one
// that lost its join reply) stays a learner; promoting it would cost a
// one-voter cluster its quorum. It can then be retired.
func TestDeadLearnerIsNotPromoted(t *testing.T) {
	c := newControlCluster(t, 1)
	boot := c.config(0)
	boot.BootstrapCredential = testBoot
	a, err := c.start(boot)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "node 1 leads", func() bool { return a.Locks().IsLeader() })
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot}); err != nil {
		t.Fatal(err)
	}
	mint, err := c.call("/v1/join-credentials", testAdmin, control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	ghost, err := c.call("/v1/join", "", control.Request{Credential: mint.Credential, Address: testkit.FreeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "ghost added as learner", func() bool {
		cs := a.Node().ConfState()
		return len(cs.Learners) == 1 && cs.Learners[0] == ghost.NodeID
	})
	// Give the promoter many rounds to get it wrong.
	deadline := time.Now().Add(20 * control.ReconcileIntervalDefault)
	for time.Now().Before(deadline) {
		if cs := a.Node().ConfState(); len(cs.Voters) != 1 {
			t.Fatalf("a learner that never replicated was promoted: voters %v", cs.Voters)
		}
		time.Sleep(control.ReconcileIntervalDefault / 2)
	}
	if _, err := c.call("/v1/retire", testAdmin, control.Request{NodeID: ghost.NodeID, Incarnation: ghost.Incarnation}); err != nil {
		t.Fatalf("retire the ghost: %v", err)
	}
	c.waitVoters(1)
}

// TestJoinAfterCompaction: a node that joins after the log it would need
// was compacted can only catch up from a snapshot, and raft refuses a
// snapshot whose ConfState does not name it. The leader must therefore
// snapshot when the membership changes; otherwise (with no write traffic)
// the learner never catches up and is never promoted.
func TestJoinAfterCompaction(t *testing.T) {
	c := newControlCluster(t, 2)
	boot := c.config(0)
	boot.BootstrapCredential = testBoot
	boot.SnapshotEntries, boot.CompactKeep = 20, 5
	a, err := c.start(boot)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "node 1 leads", func() bool { return a.Locks().IsLeader() })
	if _, err := c.call("/v1/bootstrap", testAdmin, control.Request{Credential: testBoot}); err != nil {
		t.Fatal(err)
	}
	cl := c.client(a)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 60; i++ {
		if _, err := cl.Acquire(ctx, fmt.Sprintf("pre/%d", i), sdk.WithLease(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if first, _ := a.store.FirstIndex(); first <= 2 {
		t.Fatalf("log not compacted (first index %d): the test would not need a snapshot", first)
	}
	mint, err := c.call("/v1/join-credentials", testAdmin, control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.config(1)
	cfg.Join, cfg.JoinCredential = strings.Join(c.urls(), ","), mint.Credential
	b, err := c.start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// No more writes: only a snapshot naming node 2 can bring it up to date.
	c.waitVoters(1, 2)
	testkit.Eventually(t, 10*time.Second, "joined node has the lock table", func() bool {
		return tableDigest(a) == tableDigest(b)
	})
}

// Anonymous join requests with made-up credentials append nothing to the
// log: the credential is checked against the applied state before any
// proposal (the 300 requests appended 300 entries). Beyond its
// burst each of the source's requests waits control.FailureDelayDefault
// before it is looked at (so a few are enough here; the control
// package's test sends 300 with a shorter delay).
func TestAnonymousJoinAppendsNothing(t *testing.T) {
	c := newControlCluster(t, 1)
	d, err := c.start(c.config(0))
	if err != nil {
		t.Fatal(err)
	}
	// Settled: the leader's own proposals (cluster version, fence key) are
	// done, so the commit index moves only if a join writes.
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool {
		var v uint64
		var fenced bool
		d.Node().View(func(m *core.Machine) {
			v = m.ClusterVersion()
			_, fenced = m.CurrentFenceKey()
		})
		return d.Locks().IsLeader() && v == core.MaxClusterVersion && fenced
	})
	before := d.Node().Status().Commit
	codes := map[string]int{}
	const joins = control.FailureBurstDefault + 3
	for i := 0; i < joins; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		began := time.Now()
		_, err := control.Call(ctx, c.urls(), "/v1/join", "", control.Request{Credential: fmt.Sprintf("guess-%032d", i), Address: "127.0.0.1:7999"})
		cancel()
		if took := time.Since(began); i >= control.FailureBurstDefault && took < control.FailureDelayDefault {
			t.Fatalf("join %d, beyond the burst, answered in %v: not slowed", i, took)
		}
		var ce *control.Error
		if !errors.As(err, &ce) {
			t.Fatalf("join %d: %v", i, err)
		}
		codes[ce.Code]++
	}
	if after := d.Node().Status().Commit; after != before {
		t.Fatalf("%d anonymous joins moved the commit index from %d to %d", joins, before, after)
	}
	if codes[control.CodeRejected]+codes[control.CodeTooManyAttempts] != joins {
		t.Fatalf("answers %v: want every join refused", codes)
	}
}
