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

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// identityACL is the access list of the identity tests: each tenant its
// prefix, the observer reads everything, anonymous requests nothing.
const identityACL = `TENANT_A:
  "a/": [acquire, release, get]
TENANT_B:
  "b/": [acquire, release, get, list]
OBSERVER:
  "": [get, list]
`

// The forged headers of issue 21: a client claiming a tenant's identity,
// the observer's (which lists every lock), and another tenant's (to dodge
// its own lock quota).
const (
	forgeTenantA  = `{"acc":"TENANT_A"}`
	forgeObserver = `{"acc":"OBSERVER"}`
	forgeTenantB  = `{"acc":"TENANT_B","user":"someone-else"}`
)

// identityNode is a single node's config for the identity tests: data in
// a fresh directory, the access list written next to it if acl.
func identityNode(t *testing.T, acl bool) daemon.Config {
	t.Helper()
	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.TickMS = testkit.TickMS
	if acl {
		cfg.ACL = writeFile(t, "acl.yaml", identityACL)
	}
	return cfg
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startSettled(t *testing.T, cfg daemon.Config) *daemon.Daemon {
	t.Helper()
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(d.Close)
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	return d
}

// refused starts cfg and wants a configuration error holding every one of
// want.
func refused(t *testing.T, name string, cfg daemon.Config, want ...string) {
	t.Helper()
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err == nil {
		d.Close()
		t.Fatalf("%s: started; the identity could be forged", name)
	}
	if !errors.Is(err, daemon.ErrConfig) {
		t.Fatalf("%s: %v, want a configuration error", name, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v\nwant it to say %q", name, err, w)
		}
	}
}

// forged sends body on subject with a client-written Nats-Request-Info
// header and a fresh reply inbox, and returns the reply's error (nil:
// success).
func forged(t *testing.T, nc *nats.Conn, subject, body, info string) *protocol.Error {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	m.Header.Set("Nats-Request-Info", info)
	resp, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	if err := protocol.ParseReply(resp.Data, &struct{}{}); err != nil {
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			t.Fatalf("unparseable reply %q: %v", resp.Data, err)
		}
		return pe
	}
	return nil
}

// connectWatched connects to url and returns the asynchronous errors the
// server sends the connection (permission violations).
func connectWatched(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	return testkit.Connect(t, url, opts...), errs
}

// importReplyRefused: a client cannot give its request the reply subject
// nats-server writes for a request that crossed a service import (_R_.…,
// refused from clients since nats-server v2.0): what lets ticketd tell an
// imported request, whose Nats-Request-Info the server wrote, from any
// other (transports/natsapi/identity.go). If a server upgrade ever let it
// through, this fails.
func importReplyRefused(t *testing.T, nc *nats.Conn, errs <-chan error) {
	t.Helper()
	m := nats.NewMsg(protocol.SubjectAcquire)
	m.Reply, m.Data = "_R_.forged.1", []byte(`{"key":"forged/1","lease_ms":60000}`)
	m.Header.Set("Nats-Request-Info", forgeTenantA)
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), `Publish with Reply of "_R_.forged.1"`) {
			t.Fatalf("publish with an import's reply subject: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nats-server let a client publish with an import's reply subject (_R_.…)")
	}
}

// holderIdentity is the identity the lock on key was granted to.
func holderIdentity(t *testing.T, d *daemon.Daemon, key string) string {
	t.Helper()
	var l core.Lock
	var ok bool
	d.Node().View(func(m *core.Machine) { l, ok = m.Get(key) })
	if !ok {
		t.Fatalf("no lock on %s", key)
	}
	return l.Identity
}

// anonymousDespiteHeader: on a node whose identities can be forged, a
// client's header names nobody: the lock it takes is anonymous. The
// client cannot dress its request as an imported one either.
func anonymousDespiteHeader(t *testing.T, d *daemon.Daemon, url, key string, opts ...nats.Option) {
	t.Helper()
	nc, errs := connectWatched(t, url, opts...)
	importReplyRefused(t, nc, errs)
	if pe := forged(t, nc, protocol.SubjectAcquire, `{"key":"`+key+`","lease_ms":60000}`, forgeTenantA); pe != nil {
		t.Fatalf("acquire %s: %v", key, pe)
	}
	if id := holderIdentity(t, d, key); id != "" {
		t.Fatalf("a client-written header made %s's holder %q: identities can be forged here", key, id)
	}
}

// TestIdentityOpenNATS: the default embedded server has no accounts, so
// every identity setting is refused at start, and without them a
// client-written header names nobody.
func TestIdentityOpenNATS(t *testing.T) {
	cfg := identityNode(t, true)
	refused(t, "open NATS with acl", cfg, "acl", "open NATS", "nats-config")
	cfg = identityNode(t, false)
	cfg.MaxLocksPerIdentity = 1
	refused(t, "open NATS with max-locks-per-identity", cfg, "max-locks-per-identity", "open NATS")

	d := startSettled(t, identityNode(t, false))
	anonymousDespiteHeader(t, d, d.ClientURL(), "open/1")
}

// TestSharesTunedWithoutIdentities: the fair shares are always on and
// start anywhere (every anonymous request shares one), but a node whose
// operator set one, where identities are not believed, says at start that
// it is one share for all clients.
func TestSharesTunedWithoutIdentities(t *testing.T) {
	log, buf := infoLogger()
	cfg := identityNode(t, false)
	cfg.MaxWaitersPerIdentity = 10
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if w := daemon.GrepLines(buf.String(), "per-identity shares are one share for all clients"); !strings.Contains(w, "level=WARN") || !strings.Contains(w, "max-waiters-per-identity") {
		t.Fatalf("no warning naming max-waiters-per-identity:\n%s", buf.String())
	}
}

// TestIdentityNATSConfigWithoutAccounts: a nats-config with users but no
// accounts puts every client in one account with ticketd, where any of
// them can write the header: refused with the identity settings (it used
// to start, and {"acc":"TENANT_A"} acquired a/1), anonymous without.
func TestIdentityNATSConfigWithoutAccounts(t *testing.T) {
	listen := testkit.FreeAddr(t)
	conf := writeFile(t, "nats.conf", fmt.Sprintf(`listen: %s
authorization { users = [{ user: ticketd, password: ticketd-password }, { user: mallory, password: mallory-password }] }
`, listen))
	cfg := identityNode(t, true)
	cfg.NATSConfig, cfg.NATSUser, cfg.NATSPassword = conf, "ticketd", "ticketd-password"
	refused(t, "nats-config without accounts, acl", cfg, "acl", "no accounts")
	cfg.ACL, cfg.MaxLocksPerIdentity = "", 1
	refused(t, "nats-config without accounts, max-locks-per-identity", cfg, "max-locks-per-identity", "no accounts")

	cfg.MaxLocksPerIdentity = 0
	d := startSettled(t, cfg)
	anonymousDespiteHeader(t, d, "nats://"+listen, "noaccounts/1", nats.UserInfo("mallory", "mallory-password"))
}

// accountsNATSConf is a nats-server configuration with accounts: ticketd
// alone in TICKETD, exporting the lock subjects as a service that the
// tenants and the observer import (sharing the requester), as in
// examples/secure. ticketdAccount replaces the TICKETD account's body when
// set (for the broken variants).
func accountsNATSConf(listen, ticketdAccount string) string {
	if ticketdAccount == "" {
		ticketdAccount = `users = [{ user: ticketd, password: ticketd-password }], exports = [{ service: "ticketd.v1.lock.>" }]`
	}
	imp := `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.lock.>" }, share: true }]`
	return fmt.Sprintf(`listen: %s
accounts {
  TICKETD { %s }
  TENANT_A { users = [{ user: alice, password: alice-password }], %s }
  TENANT_B { users = [{ user: bob, password: bob-password }], %s }
  OBSERVER { users = [{ user: observer, password: observer-password }], %s }
}
`, listen, ticketdAccount, imp, imp, imp)
}

// TestIdentityAccountsAndImports: the layout the docs prescribe starts
// with the access list and a per-identity quota, and the forged headers
// of issue 21 change nothing: nats-server overwrites them on the import,
// so alice stays TENANT_A/alice whatever she writes.
func TestIdentityAccountsAndImports(t *testing.T) {
	listen := testkit.FreeAddr(t)
	cfg := identityNode(t, true)
	cfg.NATSConfig = writeFile(t, "nats.conf", accountsNATSConf(listen, ""))
	cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
	cfg.MaxLocksPerIdentity = 1
	d := startSettled(t, cfg)
	alice := testkit.Connect(t, "nats://"+listen, nats.UserInfo("alice", "alice-password"))

	if pe := forged(t, alice, protocol.SubjectAcquire, `{"key":"b/1","lease_ms":60000}`, forgeTenantB); pe == nil || pe.Code != protocol.CodePermissionDenied {
		t.Fatalf("alice claiming TENANT_B acquired b/1: %v, want permission_denied", pe)
	}
	if pe := forged(t, alice, protocol.SubjectAcquire, `{"key":"a/1","lease_ms":60000}`, forgeObserver); pe != nil {
		t.Fatalf("alice acquire a/1: %v", pe)
	}
	if id := holderIdentity(t, d, "a/1"); id != "TENANT_A/alice" {
		t.Fatalf("a/1 granted to %q, want TENANT_A/alice (the server's word, not the header's)", id)
	}
	if pe := forged(t, alice, "ticketd.v1.lock.list", `{"prefix":""}`, forgeObserver); pe == nil || pe.Code != protocol.CodePermissionDenied {
		t.Fatalf("alice claiming OBSERVER listed every lock: %v, want permission_denied", pe)
	}
	// Her quota is one lock: claiming another identity does not dodge it.
	if pe := forged(t, alice, protocol.SubjectAcquire, `{"key":"a/2","lease_ms":60000}`, forgeTenantB); pe == nil || pe.Code != protocol.CodeResourceExhausted {
		t.Fatalf("alice's second lock under a forged identity: %v, want resource_exhausted", pe)
	}
}

// TestIdentityAccountsMisconfigured: nats-server configurations with
// accounts in which a client could still write an identity (into the
// followers' forward subjects, or as another user of ticketd's account),
// or reach the lock service only from inside ticketd's account, are
// refused at start, each with what is wrong.
func TestIdentityAccountsMisconfigured(t *testing.T) {
	const (
		ticketd = `users = [{ user: ticketd, password: ticketd-password }]`
		imp     = `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.lock.>" }, share: true }]`
		impAll  = `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.>" }, share: true }]`
	)
	for _, tc := range []struct {
		name, extra, ticketdAccount, tenantAccount string
		want                                       string
	}{
		{"a second user in ticketd's account", "",
			`users = [{ user: ticketd, password: ticketd-password }, { user: mallory, password: mallory-password }], exports = [{ service: "ticketd.v1.lock.>" }]`, imp,
			"holds 2 users"},
		{"the forward subjects exported", "",
			ticketd + `, exports = [{ service: "ticketd.v1.>" }]`, impAll,
			"forward subjects"},
		{"no export, no import", "", ticketd, "",
			"does not export the lock subjects"},
		{"exported, imported by nobody", "", ticketd + `, exports = [{ service: "ticketd.v1.lock.>" }]`, "",
			"no account imports the lock subjects"},
		{"clients without credentials land in ticketd's account", "no_auth_user: ticketd\n",
			ticketd + `, exports = [{ service: "ticketd.v1.lock.>" }]`, imp,
			"no_auth_user ticketd"},
		// A tenant's stream imported into ticketd's account publishes
		// there: on the forward subjects, with the identity and the
		// lost-reply mark a follower would write.
		{"a tenant's stream imported into ticketd's account", "",
			ticketd + `, exports = [{ service: "ticketd.v1.lock.>" }], imports = [{ stream: { account: TENANT_A, subject: ">" } }]`, imp + `, exports = [{ stream: ">" }]`,
			"imports the stream"},
		{"a tenant's stream mapped onto the forward subjects", "",
			ticketd + `, exports = [{ service: "ticketd.v1.lock.>" }], imports = [{ stream: { account: TENANT_A, subject: "fwd.>" }, to: "ticketd.v1.fwd.>" }]`, imp + `, exports = [{ stream: "fwd.>" }]`,
			"imports the stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := testkit.FreeAddr(t)
			conf := fmt.Sprintf("%slisten: %s\naccounts {\n  TICKETD { %s }\n  TENANT_A { users = [{ user: alice, password: alice-password }], %s }\n}\n",
				tc.extra, listen, tc.ticketdAccount, tc.tenantAccount)
			cfg := identityNode(t, true)
			cfg.NATSConfig = writeFile(t, "nats.conf", conf)
			cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
			refused(t, tc.name, cfg, "acl", tc.want, "examples/secure")
		})
	}
}

// TestIdentityExternalPasswordOnly: ticketd cannot inspect a server at
// nats-url, so the identity settings need the operator's word for it
// (nats-trust-request-info): without it they are refused (a password-only
// server used to start with --acl and trust {"acc":"TENANT_A"}), and every
// request is anonymous. With it (given wrongly here: the server has no
// accounts) a client's header is still ignored: no request of its crossed
// an import.
func TestIdentityExternalPasswordOnly(t *testing.T) {
	ns := testkit.NATSServer(t, func(o *natsserver.Options) {
		o.Users = []*natsserver.User{{Username: "ticketd", Password: "ticketd-password"}, {Username: "mallory", Password: "mallory-password"}}
	})
	cfg := identityNode(t, true)
	cfg.NATSListen, cfg.NATSURL = "", ns.ClientURL()
	cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
	refused(t, "nats-url with acl", cfg, "acl", "cannot inspect the server at nats-url", "nats-trust-request-info")
	noACL := cfg
	noACL.ACL, noACL.MaxLocksPerIdentity = "", 1
	refused(t, "nats-url with max-locks-per-identity", noACL, "max-locks-per-identity", "nats-trust-request-info")

	noACL.MaxLocksPerIdentity = 0
	d := startSettled(t, noACL)
	anonymousDespiteHeader(t, d, ns.ClientURL(), "external/1", nats.UserInfo("mallory", "mallory-password"))
	d.Close()

	cfg.NATSTrustRequestInfo = true
	cfg.MaxLocksPerIdentity = 1
	cfg.Data = t.TempDir()
	d = startSettled(t, cfg)
	mallory := testkit.Connect(t, ns.ClientURL(), nats.UserInfo("mallory", "mallory-password"))
	if pe := forged(t, mallory, protocol.SubjectAcquire, `{"key":"a/1","lease_ms":60000}`, forgeTenantA); pe == nil || pe.Code != protocol.CodePermissionDenied {
		t.Fatalf("a header on a request that crossed no import acquired a/1: %v, want permission_denied", pe)
	}
	if pe := forged(t, mallory, "ticketd.v1.lock.list", `{"prefix":""}`, forgeObserver); pe == nil || pe.Code != protocol.CodePermissionDenied {
		t.Fatalf("a header on a request that crossed no import listed every lock: %v, want permission_denied", pe)
	}
}

// nats-trust-request-info vouches for an external server only.
func TestTrustRequestInfoNeedsNATSURL(t *testing.T) {
	cfg := identityNode(t, false)
	cfg.NATSTrustRequestInfo = true
	if err := cfg.Validate(); !errors.Is(err, daemon.ErrConfig) || !strings.Contains(err.Error(), "nats-trust-request-info") {
		t.Fatalf("Validate = %v, want a configuration error naming nats-trust-request-info", err)
	}
}

// TestIdentityPartitioned: a node of a partitioned deployment is reached
// through its group's subjects, or the keyed subjects the partition
// mapping sends to them: exporting those starts with the access list,
// exporting only the classic lock subjects (which it does not serve) is
// refused.
func TestIdentityPartitioned(t *testing.T) {
	for _, tc := range []struct {
		name, export string
		ok           bool
	}{
		{"group subjects", "ticketd.v1.g.1.lock.>", true},
		{"keyed subjects", "ticketd.v1.p.>", true},
		{"classic subjects only", "ticketd.v1.lock.>", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := testkit.FreeAddr(t)
			cfg := identityNode(t, true)
			cfg.Group, cfg.Groups = 1, 2
			cfg.NATSConfig = writeFile(t, "nats.conf", fmt.Sprintf(`listen: %s
accounts {
  TICKETD { users = [{ user: ticketd, password: ticketd-password }], exports = [{ service: %q }] }
  TENANT_A { users = [{ user: alice, password: alice-password }], imports = [{ service: { account: TICKETD, subject: %q }, share: true }] }
}
`, listen, tc.export, tc.export))
			cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
			if !tc.ok {
				refused(t, tc.name, cfg, "does not export the lock subjects")
				return
			}
			d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
			if err != nil {
				t.Fatalf("a partitioned node exporting %s: %v", tc.export, err)
			}
			d.Close()
		})
	}
}
