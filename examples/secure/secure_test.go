package secure_test

// The attacks of issue 10, against a node running this example's
// nats-server.conf and acl.yaml, with real TLS connections: each test fails
// if its hole comes back.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// node is one secure ticketd node and the users of the example.
type node struct {
	d     *daemon.Daemon
	url   string // tls://127.0.0.1:port
	tls   testkit.TLSFiles
	seeds map[string]string // user name -> seed file
	pubs  map[string]string // user name -> public nkey
	logs  *testkit.LogBuffer
}

// users of nats-server.conf, by the name their inbox prefix uses.
var users = []string{"ticketd", "alice", "carol", "bob", "observer"}

func start(t testing.TB, opts ...func(*daemon.Config)) *node {
	t.Helper()
	n := &node{tls: testkit.TLS(t), seeds: map[string]string{}, pubs: map[string]string{}}
	dir := t.TempDir()
	for _, u := range users {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		n.seeds[u] = filepath.Join(dir, u+".nk")
		n.pubs[u] = pub
		if err := os.WriteFile(n.seeds[u], seed, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("SECURE_"+strings.ToUpper(u)+"_NKEY", pub)
	}
	t.Setenv("SECURE_NATS_LISTEN", testkit.FreeAddr(t))
	t.Setenv("SECURE_TLS_CERT", n.tls.Cert)
	t.Setenv("SECURE_TLS_KEY", n.tls.Key)
	t.Setenv("SECURE_JETSTREAM_DIR", filepath.Join(dir, "jetstream"))

	cfg := daemon.Defaults()
	cfg.Data = filepath.Join(dir, "data")
	cfg.NATSConfig = "nats-server.conf"
	cfg.NATSNKey = n.seeds["ticketd"]
	cfg.NATSTLSCA = n.tls.CA
	cfg.ACL = "acl.yaml"
	cfg.AuditStream = "AUDIT"
	cfg.NoSync = true
	cfg.TickMS, cfg.ElectionTicks = testkit.TickMS, testkit.ElectionTicks
	applyExampleConfig(t, &cfg)
	for _, o := range opts {
		o(&cfg)
	}
	var log *slog.Logger
	log, n.logs = testkit.CaptureLogger()
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	n.d, n.url = d, d.ClientURL()
	testkit.Eventually(t, 10*time.Second, "a ready leader", func() bool { return d.Ready() == nil && d.Locks().IsLeader() })
	return n
}

// as connects as user u with its seed, the example's CA and its own
// inbox prefix. Errors the server sends asynchronously (permission
// violations) go to errs.
func (n *node) as(t *testing.T, u string) (*nats.Conn, *asyncErrors) {
	t.Helper()
	errs := &asyncErrors{}
	nk, err := nats.NkeyOptionFromSeed(n.seeds[u])
	if err != nil {
		t.Fatal(err)
	}
	nc := testkit.Connect(t, n.url, nk, nats.RootCAs(n.tls.CA), nats.CustomInboxPrefix("_INBOX."+u),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) }))
	return nc, errs
}

func (n *node) client(t testing.TB, u string) *sdk.Client {
	t.Helper()
	c, err := sdk.Connect(n.url, sdk.WithAuth(sdk.Auth{NKeyFile: n.seeds[u], TLSCA: n.tls.CA, InboxPrefix: "_INBOX." + u}),
		sdk.WithRequestTimeout(2*time.Second), sdk.WithRetryBudget(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// held is a lock alice takes on key for the rest of the test.
func (n *node) held(t *testing.T, alice *sdk.Client, key string) *sdk.Lock {
	t.Helper()
	l, err := alice.Acquire(ctx(t), key, sdk.WithLease(30*time.Second))
	if err != nil {
		t.Fatalf("alice acquire %s: %v", key, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestSecureExample(t *testing.T) {
	n := start(t)
	t.Run("refused connections", n.refusedConnections)
	t.Run("lock user takes and releases", n.lockUser)
	t.Run("no forged responder", n.noForgedResponder)
	t.Run("no reading others' replies", n.noReadingReplies)
	t.Run("release outside the acl", n.releaseOutsideACL)
	t.Run("no forged identity", n.noForgedIdentity)
	t.Run("no forged audit or streams", n.noForgedAudit)
	t.Run("observer reads only", n.observer)
	t.Run("no release by a stranger in the same account", n.noStrangerRelease)
	t.Run("wait flood", n.waitFlood)
	t.Run("secrets absent from logs", n.secretsNotLogged)
}

// Unauthenticated and plain-TCP clients are refused.
func (n *node) refusedConnections(t *testing.T) {
	host := strings.TrimPrefix(n.url, "tls://")
	if nc, err := nats.Connect("nats://"+host, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a plain TCP client connected")
	}
	if nc, err := nats.Connect(n.url, nats.RootCAs(n.tls.CA), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a TLS client without credentials connected")
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	stranger := filepath.Join(t.TempDir(), "stranger.nk")
	_ = os.WriteFile(stranger, seed, 0o600)
	if _, err := sdk.Connect(n.url, sdk.WithAuth(sdk.Auth{NKeyFile: stranger, TLSCA: n.tls.CA})); err == nil {
		t.Fatal("an unknown nkey connected")
	}
	// A raw TCP connection that never speaks TLS is closed by the server.
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("CONNECT {}\r\nPUB ticketd.v1.lock.acquire 2\r\n{}\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var all []byte
	buf := make([]byte, 4096)
	for {
		k, err := c.Read(buf)
		all = append(all, buf[:k]...)
		if err != nil {
			break
		}
	}
	// Only whole protocol lines count: the server's INFO carries random
	// IDs and nonces, which may contain "MSG" by chance.
	for _, line := range bytes.Split(all, []byte("\r\n")) {
		if bytes.HasPrefix(line, []byte("+OK")) || bytes.HasPrefix(line, []byte("MSG ")) || bytes.HasPrefix(line, []byte("HMSG ")) {
			t.Fatalf("a plain TCP client got an answer: %q", all)
		}
	}
}

func (n *node) lockUser(t *testing.T) {
	c := n.client(t, "alice")
	l, err := c.Acquire(ctx(t), "a/lock-user", sdk.WithLease(10*time.Second))
	if err != nil {
		t.Fatalf("alice acquire: %v", err)
	}
	// Renew and list are allowed to lock users too (renew counts as
	// acquire in the access list).
	before := l.Deadline()
	if err := l.Renew(ctx(t)); err != nil || !l.Deadline().After(before) {
		t.Fatalf("alice renew: %v (deadline %v -> %v)", err, before, l.Deadline())
	}
	page, err := c.List(ctx(t), "a/", "", 10)
	if err != nil || len(page.Locks) != 1 || page.Locks[0].Token != l.Token {
		t.Fatalf("alice list a/: %+v, %v", page, err)
	}
	if _, err := c.List(ctx(t), "b/", "", 10); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("alice list b/: %v, want permission_denied", err)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatalf("alice release: %v", err)
	}
	h, err := c.Get(ctx(t), "a/lock-user")
	if err != nil || h.Held {
		t.Fatalf("get after release: %+v, %v", h, err)
	}
}

// An impostor cannot subscribe as a responder, so every acquire gets a
// real token from the leader (the impostor answered 6 of 10).
func (n *node) noForgedResponder(t *testing.T) {
	for _, u := range []string{"carol", "bob", "observer"} {
		nc, errs := n.as(t, u)
		forged := 0
		var mu sync.Mutex
		for _, subj := range []string{"ticketd.v1.lock.acquire", "ticketd.v1.lock.>", ">"} {
			_, _ = nc.QueueSubscribe(subj, "ticketd", func(m *nats.Msg) {
				mu.Lock()
				forged++
				mu.Unlock()
				_ = m.Respond([]byte(`{"key":"a/x","token":1125899906842624,"lease_ms":60000,"index":1}`))
			})
		}
		errs.wait(t, 3, "permissions violation for subscription")
		_ = nc.Flush()
		c := n.client(t, "alice")
		for i := 0; i < 10; i++ {
			l, err := c.Acquire(ctx(t), "a/responder", sdk.WithLease(10*time.Second))
			if err != nil {
				t.Fatalf("acquire %d with %s's impostor subscribed: %v", i, u, err)
			}
			if l.Token >= 1<<50 {
				t.Fatalf("acquire %d answered with forged token %d", i, l.Token)
			}
			if err := l.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		if forged != 0 {
			t.Fatalf("%s's impostor received %d requests", u, forged)
		}
		mu.Unlock()
	}
}

// A client cannot read another client's replies (tokens included), in
// its own account or another one.
func (n *node) noReadingReplies(t *testing.T) {
	var got sync.Map
	for _, u := range []string{"carol", "bob"} {
		nc, errs := n.as(t, u)
		for _, subj := range []string{">", "_INBOX.>", "_INBOX.alice.>", "_R_.>"} {
			_, _ = nc.Subscribe(subj, func(m *nats.Msg) { got.Store(u+" "+m.Subject, string(m.Data)) })
		}
		errs.wait(t, 4, "permissions violation for subscription")
	}
	c := n.client(t, "alice")
	l, err := c.Acquire(ctx(t), "a/replies", sdk.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx(t))
	got.Range(func(k, v any) bool {
		t.Errorf("%s read alice's reply: %v", k, v)
		return true
	})
}

// Releasing (or reading) a lock under a prefix the identity may not touch
// is permission_denied, and the lock is untouched.
func (n *node) releaseOutsideACL(t *testing.T) {
	alice, bob := n.client(t, "alice"), n.client(t, "bob")
	l := n.held(t, alice, "a/42")
	if err := bob.Release(ctx(t), "a/42", l.Token); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("bob released alice's lock with its token: %v, want permission_denied", err)
	}
	if _, err := bob.Get(ctx(t), "a/42"); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("bob read a/42: %v, want permission_denied", err)
	}
	if _, err := bob.Acquire(ctx(t), "a/43", sdk.WithLease(time.Second)); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("bob acquired under a/: %v, want permission_denied", err)
	}
	h, err := alice.Get(ctx(t), "a/42")
	if err != nil || !h.Held || h.Token != l.Token {
		t.Fatalf("a/42 after bob's attempts: %+v, %v; want held with token %d", h, err, l.Token)
	}
}

// Nothing a client writes can set its identity: not the body, not the
// follower-to-leader header, not a Nats-Request-Info of its own.
func (n *node) noForgedIdentity(t *testing.T) {
	alice := n.client(t, "alice")
	l := n.held(t, alice, "a/forged")
	nc, _ := n.as(t, "bob")
	body := []byte(`{"key":"a/forged","token":` + strconv.FormatUint(l.Token, 10) + `}`)
	for name, h := range map[string]nats.Header{
		"Ticketd-Identity":  {"Ticketd-Identity": {"TENANT_A"}},
		"Nats-Request-Info": {"Nats-Request-Info": {`{"acc":"TENANT_A","user":"` + n.pubs["alice"] + `"}`}},
	} {
		m, err := nc.RequestMsg(&nats.Msg{Subject: "ticketd.v1.lock.release", Data: body, Header: h}, 3*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if code := m.Header.Get("Nats-Service-Error-Code"); code != "permission_denied" {
			t.Fatalf("bob with a forged %s header: %s %s, want permission_denied", name, code, m.Data)
		}
	}
	if h, err := alice.Get(ctx(t), "a/forged"); err != nil || !h.Held {
		t.Fatalf("a/forged after forgeries: %+v, %v", h, err)
	}
}

// A client cannot forge audit events (pre-empting the de-duplication of
// real ones with a chosen Nats-Msg-Id) or create streams.
func (n *node) noForgedAudit(t *testing.T) {
	nc, errs := n.as(t, "bob")
	m := &nats.Msg{Subject: "ticketd.v1.audit.lock.granted", Data: []byte(`{"forged":true}`), Header: nats.Header{"Nats-Msg-Id": {"1-audit-0"}}}
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request("$JS.API.STREAM.CREATE.FILL", []byte(`{"name":"FILL","subjects":["fill.>"]}`), time.Second); err == nil {
		t.Fatal("bob created a stream")
	}
	errs.wait(t, 2, "permissions violation for publish")

	svc, _ := n.as(t, "ticketd")
	js, err := svc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.StreamInfo("AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("the audit stream holds %d messages; nothing real was published", info.State.Msgs)
	}
	if _, err := js.StreamInfo("FILL"); err == nil {
		t.Fatal("stream FILL exists")
	}
}

// The observer may get and ask for status; it cannot take or release.
func (n *node) observer(t *testing.T) {
	alice, obs := n.client(t, "alice"), n.client(t, "observer")
	l := n.held(t, alice, "a/observed")
	if h, err := obs.Get(ctx(t), "a/observed"); err != nil || h.Token != l.Token {
		t.Fatalf("observer get: %+v, %v", h, err)
	}
	if _, err := obs.Status(ctx(t)); err != nil {
		t.Fatalf("observer status: %v", err)
	}
	nc, errs := n.as(t, "observer")
	body := []byte(`{"key":"a/observed","token":` + strconv.FormatUint(l.Token, 10) + `}`)
	if _, err := nc.Request("ticketd.v1.lock.release", body, 500*time.Millisecond); err == nil {
		t.Fatal("the observer's release got an answer")
	}
	errs.wait(t, 1, "permissions violation for publish")
	if h, err := alice.Get(ctx(t), "a/observed"); err != nil || !h.Held || h.Token != l.Token {
		t.Fatalf("a/observed after the observer's release: %+v, %v", h, err)
	}
}

func (n *node) secretsNotLogged(t *testing.T) {
	logs := n.logs.String()
	if !strings.Contains(logs, "node started") {
		t.Fatalf("the logs were not captured: %q", logs)
	}
	for _, u := range users {
		seed, _ := os.ReadFile(n.seeds[u])
		if strings.Contains(logs, string(seed)) {
			t.Fatalf("%s's seed is in the logs", u)
		}
	}
	key, _ := os.ReadFile(n.tls.Key)
	if strings.Contains(logs, strings.TrimSpace(string(key))) {
		t.Fatal("the TLS key is in the logs")
	}
}

// asyncErrors collects the errors a connection's ErrorHandler receives.
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrors) add(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

// wait waits until at least n errors containing text have arrived.
func (a *asyncErrors) wait(t *testing.T, n int, text string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "server errors: "+text, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		k := 0
		for _, err := range a.errs {
			if strings.Contains(strings.ToLower(err.Error()), text) {
				k++
			}
		}
		return k >= n
	})
}
