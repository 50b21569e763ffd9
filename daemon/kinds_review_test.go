package daemon_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Review of issue 25's API phase (docs/protocol.md §12) through real
// nodes: the cluster version gate and the access lists' per-identity rule
// for holders of semaphores and read/write locks.

// kindReply is a raw reply: its fields and an error's code and message.
type kindReply struct {
	v         map[string]any
	code, msg string
}

func kindReq(t *testing.T, nc *nats.Conn, subject, body string) kindReply {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 10*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	var r kindReply
	if err := json.Unmarshal(m.Data, &r.v); err != nil {
		t.Fatalf("%s %s: %q: %v", subject, body, m.Data, err)
	}
	if e, ok := r.v["error"].(map[string]any); ok {
		r.code, _ = e["code"].(string)
		r.msg, _ = e["message"].(string)
	}
	return r
}

func (r kindReply) token() uint64 {
	f, _ := r.v["token"].(float64)
	return uint64(f)
}

// TestReviewKindsVersionGate: while one member runs cluster version 4,
// an acquire naming a limit above 1 or the shared mode is unsupported
// with the documented message, and nothing is proposed; an explicit
// "limit":1 or "mode":"exclusive" is today's mutex and is served.
func TestReviewKindsVersionGate(t *testing.T) {
	const oldNode = 2
	c := testcluster.New(t, 3, testcluster.WithOptions(func(i int, o *daemon.Options) {
		if i == oldNode {
			o.MaxClusterVersion = 4
		}
	}))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 15*time.Second, "cluster version 4", func() bool {
		var v uint64
		c.Node(lead).Node().View(func(m *core.Machine) { v = m.ClusterVersion() })
		return v == 4 && c.Node(lead).Locks().IsLeader()
	})
	for _, via := range []int{lead, c.Follower(lead)} {
		nc, err := nats.Connect(c.ClientURL(via))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		for _, tc := range []struct{ body, code, msg string }{
			{`{"key":"g/sem","limit":2,"lease_ms":60000}`, "unsupported", "limit needs cluster version 5, the cluster runs version 4"},
			{`{"key":"g/sem","limit":2,"lease_ms":60000,"wait_ms":1000}`, "unsupported", "needs cluster version 5"},
			{`{"key":"g/rw","mode":"shared","lease_ms":60000}`, "unsupported", "needs cluster version 5"},
			{`{"key":"g/rw","limit":1,"mode":"shared","lease_ms":60000}`, "unsupported", "needs cluster version 5"},
		} {
			if r := kindReq(t, nc, protocol.SubjectAcquire, tc.body); r.code != tc.code || !strings.Contains(r.msg, tc.msg) {
				t.Fatalf("via node %d, %s: %v, want %s %q", via+1, tc.body, r.v, tc.code, tc.msg)
			}
		}
		for _, key := range []string{"g/sem", "g/rw"} {
			if r := kindReq(t, nc, protocol.SubjectGet, fmt.Sprintf(`{"key":%q}`, key)); r.v["held"] != false {
				t.Fatalf("%s after the refusals: %v", key, r.v)
			}
		}
		for _, body := range []string{
			fmt.Sprintf(`{"key":"g/m%d","limit":1,"lease_ms":60000}`, via),
			fmt.Sprintf(`{"key":"g/x%d","mode":"exclusive","lease_ms":60000}`, via),
			fmt.Sprintf(`{"key":"g/z%d","limit":0,"lease_ms":60000}`, via),
		} {
			if r := kindReq(t, nc, protocol.SubjectAcquire, body); r.code != "" || r.token() == 0 {
				t.Fatalf("via node %d, a mutex written with its defaults %s: %v", via+1, body, r.v)
			}
		}
	}
}

// TestReviewKindsOtherIdentity: two tenants that may both acquire and
// release under one prefix share a semaphore and a read/write lock. Each
// holder belongs to its identity: the other tenant cannot release or
// renew it (permission_denied, though it may read the token with get),
// nor withdraw its wait with the same wait id; the holder itself can.
func TestReviewKindsOtherIdentity(t *testing.T) {
	dir := t.TempDir()
	acl := filepath.Join(dir, "acl.yaml")
	if err := os.WriteFile(acl, []byte("TENANT_A:\n  \"s/\": [acquire, release, get, list]\nTENANT_B:\n  \"s/\": [acquire, release, get, list]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *daemon.Config) {
		conf := filepath.Join(dir, fmt.Sprintf("nats%d.conf", i))
		body := accountsConf(cfg.NATSListen, cfg.NATSClusterListen, strings.Split(cfg.NATSRoutes, ","))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.NATSConfig, cfg.NATSClusterListen, cfg.NATSRoutes = conf, "", ""
		cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
		cfg.ACL = acl
	}))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(c.ClientURL(lead), nats.UserInfo(user, user+"-password"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	alice, bob := connect("alice"), connect("bob")
	grant := func(nc *nats.Conn, body string) uint64 {
		t.Helper()
		r := kindReq(t, nc, protocol.SubjectAcquire, body)
		if r.code != "" || r.token() == 0 {
			t.Fatalf("acquire %s: %v", body, r.v)
		}
		return r.token()
	}
	a1 := grant(alice, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	a2 := grant(alice, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	b1 := grant(bob, `{"key":"s/sem","limit":3,"lease_ms":60000}`)
	ar := grant(alice, `{"key":"s/rw","mode":"shared","lease_ms":60000}`)
	br := grant(bob, `{"key":"s/rw","mode":"shared","lease_ms":60000}`)

	// Bob reads alice's tokens, then tries to free or extend her holds.
	if r := kindReq(t, bob, protocol.SubjectGet, `{"key":"s/sem"}`); len(r.v["holders"].([]any)) != 3 {
		t.Fatalf("bob's get: %v", r.v)
	}
	for _, tc := range []struct {
		nc     *nats.Conn
		who    string
		key    string
		token  uint64
		holder string
	}{
		{bob, "bob", "s/sem", a1, "alice"}, {bob, "bob", "s/sem", a2, "alice"}, {bob, "bob", "s/rw", ar, "alice"},
		{alice, "alice", "s/sem", b1, "bob"}, {alice, "alice", "s/rw", br, "bob"},
	} {
		if r := kindReq(t, tc.nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, tc.key, tc.token)); r.code != "permission_denied" {
			t.Errorf("%s releases %s's token %d of %s: %v, want permission_denied", tc.who, tc.holder, tc.token, tc.key, r.v)
		}
		if r := kindReq(t, tc.nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":%q,"token":%d,"lease_ms":120000}`, tc.key, tc.token)); r.code != "permission_denied" {
			t.Errorf("%s renews %s's token %d of %s: %v, want permission_denied", tc.who, tc.holder, tc.token, tc.key, r.v)
		}
	}
	if r := kindReq(t, alice, protocol.SubjectGet, `{"key":"s/sem"}`); len(r.v["holders"].([]any)) != 3 {
		t.Fatalf("s/sem after bob's attempts: %v", r.v)
	}

	// Alice waits for a slot with a wait id; bob's withdraw of the same
	// wait id finds nothing, and her wait stays queued.
	out := make(chan kindReply, 1)
	go func() {
		var r kindReply
		m, err := alice.Request(protocol.SubjectAcquire, []byte(`{"key":"s/sem","limit":3,"lease_ms":60000,"wait_ms":20000,"wait_id":"w-1"}`), 30*time.Second)
		if err == nil && json.Unmarshal(m.Data, &r.v) == nil {
			if e, ok := r.v["error"].(map[string]any); ok {
				r.code, _ = e["code"].(string)
			}
		}
		out <- r
	}()
	testkit.Eventually(t, 10*time.Second, "alice's wait queued", func() bool { return c.Node(lead).Locks().Waiting("s/sem") == 1 })
	if r := kindReq(t, bob, protocol.SubjectWithdraw, `{"key":"s/sem","wait_id":"w-1"}`); r.v["withdrawn"] != false || r.v["released_token"] != nil {
		t.Fatalf("bob withdraws alice's wait: %v", r.v)
	}
	if n := c.Node(lead).Locks().Waiting("s/sem"); n != 1 {
		t.Fatalf("alice's wait after bob's withdraw: %d waiting", n)
	}
	// Bob's own release frees his slot, and alice's wait gets it.
	if r := kindReq(t, bob, protocol.SubjectRelease, fmt.Sprintf(`{"key":"s/sem","token":%d}`, b1)); r.v["released"] != true {
		t.Fatalf("bob's own release: %v", r.v)
	}
	select {
	case r := <-out:
		if r.code != "" || r.token() <= b1 {
			t.Fatalf("alice's wait: %v", r.v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("alice's wait was not granted")
	}
	if r := kindReq(t, alice, protocol.SubjectRelease, fmt.Sprintf(`{"key":"s/sem","token":%d}`, a1)); r.v["released"] != true {
		t.Fatalf("alice's own release: %v", r.v)
	}
}
