package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// cpNode is one `ticketd serve` process of a control-plane cluster.
type cpNode struct {
	p                 *proc
	data, nats, peer  string
	control, natsAddr string
}

// cpCluster starts control-plane nodes whose embedded NATS servers route
// to each other; env carries the cluster's secrets (never argv).
type cpCluster struct {
	t      *testing.T
	bin    string
	env    []string
	routes []string
	nodes  []*cpNode
}

func newCPCluster(t *testing.T, bin string, size int, env ...string) *cpCluster {
	return &cpCluster{t: t, bin: bin, env: env, routes: testkit.FreeAddrs(t, size)}
}

// start runs node slot on data (a fresh node unless data holds one),
// with extra flags and environment.
func (c *cpCluster) start(slot int, data, peer string, env []string, extra ...string) *cpNode {
	c.t.Helper()
	n := &cpNode{data: data, peer: peer, natsAddr: testkit.FreeAddr(c.t), control: testkit.FreeAddr(c.t)}
	n.nats = "nats://" + n.natsAddr
	args := append([]string{
		"--data", data, "--nats-listen", n.natsAddr,
		"--nats-cluster-listen", c.routes[slot], "--nats-routes", strings.Join(c.routes, ","),
		"--peer-listen", peer, "--control-listen", n.control, "--tick-ms", "20",
	}, extra...)
	n.p = startServeEnv(c.t, c.bin, append(append([]string(nil), c.env...), env...), args...)
	c.nodes = append(c.nodes, n)
	return n
}

func (c *cpCluster) urls() string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, "http://"+n.control)
	}
	return strings.Join(out, ",")
}

// run runs a ticketd command with the cluster's environment and returns
// its stdout (one JSON object) or fails the test.
func (c *cpCluster) run(args ...string) map[string]any {
	c.t.Helper()
	return c.runEnv(nil, args...)
}

func (c *cpCluster) runEnv(env []string, args ...string) map[string]any {
	c.t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(append(os.Environ(), c.env...), env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("ticketd %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		c.t.Fatalf("ticketd %s printed %q", strings.Join(args, " "), out.String())
	}
	return v
}

// voters waits until `admin members` lists want voters and returns their
// NodeIDs.
func (c *cpCluster) voters(want int) []uint64 {
	c.t.Helper()
	var ids []uint64
	testkit.Eventually(c.t, 60*time.Second, fmt.Sprintf("%d voters", want), func() bool {
		var out bytes.Buffer
		cmd := exec.Command(c.bin, "admin", "members", "--control", c.urls(), "--timeout", "5s")
		cmd.Env = append(os.Environ(), c.env...)
		cmd.Stdout = &out
		if cmd.Run() != nil {
			return false
		}
		var rep struct {
			Members []struct {
				NodeID uint64 `json:"node_id"`
				Role   string `json:"role"`
			} `json:"members"`
		}
		if json.Unmarshal(out.Bytes(), &rep) != nil {
			return false
		}
		ids = ids[:0]
		for _, m := range rep.Members {
			if m.Role == "voter" {
				ids = append(ids, m.NodeID)
			}
		}
		return len(ids) == want && len(rep.Members) == want
	})
	return ids
}

// form bootstraps node 0 and joins size-1 more through the control plane.
func (c *cpCluster) form(size int, dir string) {
	c.t.Helper()
	boot := []string{"TICKETD_BOOTSTRAP_CREDENTIAL=bootstrap-credential-e2e"}
	c.start(0, filepath.Join(dir, "n0"), testkit.FreeAddr(c.t), boot)
	c.runEnv(boot, "admin", "bootstrap", "--control", c.urls())
	c.grow(size, dir)
}

// grow joins nodes until the cluster has size members, all voters.
func (c *cpCluster) grow(size int, dir string) {
	c.t.Helper()
	first := "http://" + c.nodes[0].control
	for i := len(c.nodes); i < size; i++ {
		// The credential goes to a file of mode 0600, not the reply.
		credFile := filepath.Join(dir, fmt.Sprintf("join-%d.cred", i))
		if rep := c.run("admin", "mint-join", "--control", c.urls(), "--out", credFile); rep["credential"] != nil || rep["credential_file"] != credFile {
			c.t.Fatalf("mint-join --out replied %v", rep)
		}
		if fi, err := os.Stat(credFile); err != nil || fi.Mode().Perm() != 0o600 {
			c.t.Fatalf("join credential file: %v, %v; want mode 0600", fi, err)
		}
		c.start(i, filepath.Join(dir, fmt.Sprintf("n%d", i)), testkit.FreeAddr(c.t),
			[]string{"TICKETD_JOIN_CREDENTIAL_FILE=" + credFile}, "--join", first)
	}
	c.voters(size)
}

func (c *cpCluster) kill() {
	for _, n := range c.nodes {
		n.p.kill9(c.t)
	}
}

// TestBackupRestoreIntoNewCluster is the operator's path end to end with
// the real binary: a three-node control-plane cluster under load is
// backed up, keeps granting after the backup, and is lost; the backup
// seeds the first member of a new three-node cluster. Every token the new
// cluster issues is above every token the old one issued, the locks held
// at the backup come back with their tokens and a full lease, and the old
// members are retired.
func TestBackupRestoreIntoNewCluster(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	admin := "TICKETD_CONTROL_CREDENTIAL=control-credential-e2e"
	old := newCPCluster(t, bin, 3, admin, "TICKETD_PEER_SECRET=old-cluster-peer-secret-0123")
	old.form(3, filepath.Join(dir, "old"))
	oldIDs := old.voters(3)

	cl, err := sdk.Connect(old.nodes[1].nats)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := t.Context()
	held := map[string]uint64{}
	for i := 0; i < 3; i++ {
		l, err := cl.Acquire(ctx, fmt.Sprintf("held/%d", i), sdk.WithLease(time.Hour), sdk.WithOwner("before-backup"))
		if err != nil {
			t.Fatal(err)
		}
		held[l.Key] = l.Token
	}

	// Load: acquire+release cycles on every node, the highest token kept.
	var maxToken atomic.Uint64
	var cycles atomic.Int64
	clients := make([]*sdk.Client, 3)
	for w := range clients {
		wcl, err := sdk.Connect(old.nodes[w].nats)
		if err != nil {
			t.Fatal(err)
		}
		defer wcl.Close()
		clients[w] = wcl
	}
	stop := make(chan struct{})
	wait := testkit.Workers(len(clients), stop, func(w, i int) {
		l, err := clients[w].Acquire(ctx, fmt.Sprintf("load/%d/%d", w, i%50), sdk.WithLease(30*time.Second))
		if err != nil {
			return
		}
		for m := maxToken.Load(); l.Token > m && !maxToken.CompareAndSwap(m, l.Token); m = maxToken.Load() {
		}
		cycles.Add(1)
		_ = l.Release(ctx)
	})
	testkit.Eventually(t, 20*time.Second, "load to run", func() bool { return cycles.Load() >= 50 })
	file := filepath.Join(dir, "backup.tkd")
	saved := old.run("snapshot", "save", file, "--control", old.urls())
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v, %v; want mode 0600", fi, err)
	}
	if _, stderr, code := cli(t, bin, "snapshot", "save", file, "--control", old.urls()); code != exitFailure || !strings.Contains(stderr, "exists") {
		t.Fatalf("a second save to %s: exit %d, %s; want a refusal to overwrite", file, code, stderr)
	}
	saved = old.run("snapshot", "save", file, "--control", old.urls(), "--force")
	backupLast := uint64(saved["last_token"].(float64))
	// The old cluster keeps granting after the backup.
	after := cycles.Load()
	testkit.Eventually(t, 20*time.Second, "grants after the backup", func() bool { return cycles.Load() >= after+50 })
	close(stop)
	wait()
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldLast := max(st.LastToken, maxToken.Load())
	t.Logf("backup at index %v with last token %d; the old cluster went on to token %d (%d cycles)",
		saved["applied_index"], backupLast, oldLast, cycles.Load())
	if oldLast <= backupLast {
		t.Fatalf("no token issued after the backup (%d <= %d): the test proves nothing", oldLast, backupLast)
	}
	if int(saved["locks"].(float64)) < 3 {
		t.Fatalf("the backup holds %v locks, want the 3 held ones at least", saved["locks"])
	}
	old.kill()

	// A damaged copy is refused with a typed error.
	b, _ := os.ReadFile(file)
	b[len(b)/2] ^= 0x40
	bad := filepath.Join(dir, "damaged.tkd")
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// status and restore verify the backup with the control credential.
	credFile := filepath.Join(dir, "control.cred")
	if err := os.WriteFile(credFile, []byte(strings.TrimPrefix(admin, "TICKETD_CONTROL_CREDENTIAL=")), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, bin, "snapshot", "status", bad, "--credential-file", credFile); code != exitFailure || !strings.Contains(stderr, "backup_altered") {
		t.Fatalf("status of a damaged backup: exit %d, %s", code, stderr)
	}
	if v, stderr, code := cli(t, bin, "snapshot", "status", file, "--credential-file", credFile); code != 0 || v["last_token"] != saved["last_token"] || v["authenticated"] != true {
		t.Fatalf("status of the backup: exit %d %v %s", code, v, stderr)
	}

	// The new cluster: its first member restored from the backup (default
	// bump), a new peer secret, the others joining it.
	nu := newCPCluster(t, bin, 3, admin, "TICKETD_PEER_SECRET=new-cluster-peer-secret-4567")
	seedData, seedPeer := filepath.Join(dir, "new", "n0"), testkit.FreeAddr(t)
	res, stderr, code := cli(t, bin, "snapshot", "restore", file, "--data", seedData, "--peer-address", seedPeer, "--credential-file", credFile)
	if code != 0 {
		t.Fatalf("restore: exit %d: %s", code, stderr)
	}
	if _, _, code := cli(t, bin, "snapshot", "restore", file, "--data", seedData, "--peer-address", seedPeer, "--credential-file", credFile); code != exitFailure {
		t.Fatalf("restoring over a restored node: exit %d", code)
	}
	if id, _ := res["cluster_id"].(string); len(id) != 16 || id == "0000000000000000" {
		t.Fatalf("restore reported cluster id %v, want a fresh one", res["cluster_id"])
	}
	if uint64(res["first_token"].(float64)) != backupLast+1<<40+1 || res["mode"] != "control-plane" {
		t.Fatalf("restore reported %v", res)
	}
	nu.start(0, seedData, seedPeer, nil)
	nu.grow(3, filepath.Join(dir, "new"))
	newIDs := nu.voters(3)
	for _, id := range newIDs {
		for _, o := range oldIDs {
			if id <= o {
				t.Fatalf("new member %d does not follow old member %d: identities reused", id, o)
			}
		}
	}

	ncl, err := sdk.Connect(nu.nodes[2].nats)
	if err != nil {
		t.Fatal(err)
	}
	defer ncl.Close()
	for key, tok := range held {
		h, err := ncl.Get(ctx, key)
		if err != nil || !h.Held || h.Token != tok || h.Owner != "before-backup" {
			t.Fatalf("%s after restore: %+v %v, want token %d", key, h, err, tok)
		}
		// The lease is timed again in full from the new leader's election.
		if h.Remaining < 55*time.Minute {
			t.Fatalf("%s has %v left of its hour", key, h.Remaining)
		}
	}
	for i := 0; i < 20; i++ {
		l, err := ncl.Acquire(ctx, fmt.Sprintf("after/%d", i), sdk.WithLease(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= oldLast {
			t.Fatalf("the new cluster issued token %d, not above %d issued by the old one", l.Token, oldLast)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := ncl.Acquire(cctx, "held/0", sdk.WithLease(time.Second)); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("a restored lock's key: %v, want held", err)
	}
}
