package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// accountsConf is a nats-server configuration for node i of a test cluster:
// ticketd alone in its account, exporting the lock service to two tenant
// accounts that import it sharing the requester; routes need a user. No
// TLS: the secure example tests that; this one is about identities through
// followers.
func accountsConf(listen, route string, routes []string) string {
	var urls []string
	for _, r := range routes {
		if r != route {
			urls = append(urls, `"nats-route://route:route-password@`+r+`"`)
		}
	}
	imp := `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.lock.>" }, share: true }]`
	return fmt.Sprintf(`listen: %s
cluster { name: acl, listen: %s, authorization { user: route, password: route-password }, routes: [%s] }
accounts {
  TICKETD { users = [{ user: ticketd, password: ticketd-password }], exports = [{ service: "ticketd.v1.lock.>" }] }
  TENANT_A { users = [{ user: alice, password: alice-password }], %s }
  TENANT_B { users = [{ user: bob, password: bob-password }], %s }
}
`, listen, route, strings.Join(urls, ", "), imp, imp)
}

// A request that reaches a follower carries its identity to the leader:
// the leader allows what the access list allows that identity, refuses
// the rest with permission_denied, and records the identity on the lock.
func TestACLThroughFollower(t *testing.T) {
	dir := t.TempDir()
	acl := filepath.Join(dir, "acl.yaml")
	if err := os.WriteFile(acl, []byte("TENANT_A:\n  \"a/\": [acquire, release, get]\nTENANT_B:\n  \"b/\": [acquire, release, get]\n"), 0o600); err != nil {
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
	leader := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster version 2", func() bool { return testcluster.Settled(c.Node(leader)) })
	f := c.Follower(leader)
	connect := func(user string) *sdk.Client {
		cl, err := sdk.Connect(c.ClientURL(f), sdk.WithAuth(sdk.Auth{User: user, Password: user + "-password"}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	alice, bob := connect("alice"), connect("bob")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	l, err := alice.Acquire(ctx, "a/1", sdk.WithLease(30*time.Second))
	if err != nil {
		t.Fatalf("alice acquire through follower %d: %v", f+1, err)
	}
	if err := bob.Release(ctx, "a/1", l.Token); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("bob release of alice's lock: %v, want permission_denied", err)
	}
	if _, err := bob.Acquire(ctx, "a/2", sdk.WithLease(time.Second)); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("bob acquire under a/: %v, want permission_denied", err)
	}
	var lock core.Lock
	c.Node(leader).Node().View(func(m *core.Machine) { lock, _ = m.Get("a/1") })
	if lock.Token != l.Token || lock.Identity != "TENANT_A/alice" {
		t.Fatalf("lock on the leader: %+v, want token %d recorded for TENANT_A/alice", lock, l.Token)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("alice release: %v", err)
	}
}
