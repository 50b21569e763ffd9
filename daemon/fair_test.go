package daemon_test

// The wait-queue exhaustion of issue 21: one tenant parks thousands of
// waiting acquires; every other tenant's acquires must keep their normal
// latency, and the flood must end within seconds once its client is gone.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// fairConf is a single node's nats-server configuration: ticketd alone in
// its account, two tenant accounts importing the lock service with the
// requester shared, so every request carries an identity.
func fairConf(listen string) string {
	imp := `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.lock.>" }, share: true }]`
	return fmt.Sprintf(`listen: %s
accounts {
  TICKETD { users = [{ user: ticketd, password: ticketd-password }], exports = [{ service: "ticketd.v1.lock.>" }] }
  TENANT_A { users = [{ user: alice, password: alice-password }, { user: carol, password: carol-password }], %s }
  TENANT_B { users = [{ user: bob, password: bob-password }], %s }
}
`, listen, imp, imp)
}

// startTenantNode starts one node behind fairConf, its config changed by
// tweak.
func startTenantNode(t *testing.T, tweak func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	listen := testkit.FreeAddr(t)
	if err := os.WriteFile(conf, []byte(fairConf(listen)), 0o600); err != nil {
		t.Fatal(err)
	}
	return startNodeWith(t, filepath.Join(dir, "data"), daemon.Options{}, func(cfg *daemon.Config) {
		cfg.NATSConfig, cfg.NATSListen = conf, listen
		cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
		cfg.NoSync = true // latencies, not the disk, are measured
		tweak(cfg)
	})
}

// tenant connects as user (its password is user-password).
func tenant(t *testing.T, d *daemon.Daemon, user string) *nats.Conn {
	t.Helper()
	return testkit.Connect(t, d.ClientURL(), nats.UserInfo(user, user+"-password"))
}

// flood is one client's waiting acquires, all sent on one connection with
// one reply subscription.
type flood struct {
	nc    *nats.Conn
	mu    sync.Mutex
	codes map[string]int // reply codes so far ("" for a grant)
}

// startFlood holds one key per 500 waiters as user and sends n acquires
// waiting wait_ms 300000 on those keys.
func startFlood(t *testing.T, d *daemon.Daemon, user, prefix string, n int) *flood {
	t.Helper()
	f := &flood{nc: tenant(t, d, user), codes: map[string]int{}}
	keys := (n + 499) / 500
	for k := 0; k < keys; k++ {
		if e := rawRequest(t, f.nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":"%s/hot/%d","lease_ms":600000}`, prefix, k), &protocol.AcquireReply{}); e != nil {
			t.Fatalf("%s holds %s/hot/%d: %v", user, prefix, k, e)
		}
	}
	inbox := nats.NewInbox()
	if _, err := f.nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		var e protocol.ErrorReply
		_ = json.Unmarshal(m.Data, &e)
		code := ""
		if e.Error != nil {
			code = string(e.Error.Code)
		}
		f.mu.Lock()
		f.codes[code]++
		f.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		body := fmt.Sprintf(`{"key":"%s/hot/%d","lease_ms":60000,"wait_ms":300000}`, prefix, i%keys)
		if err := f.nc.PublishRequest(protocol.SubjectAcquire, fmt.Sprintf("%s.%d", inbox, i), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *flood) count(code string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.codes[code]
}

// requireIdentity checks that nc's requests carry identity: the shares
// under test are per identity, and with every request anonymous they
// would be one share.
func requireIdentity(t *testing.T, d *daemon.Daemon, nc *nats.Conn, identity string) {
	t.Helper()
	var r protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"who","lease_ms":10000}`, &r); e != nil {
		t.Fatal(e)
	}
	var l core.Lock
	d.Node().View(func(m *core.Machine) { l, _ = m.Get("who") })
	if l.Identity != identity {
		t.Fatalf("a lock of %s's records identity %q, want %q", identity, l.Identity, identity)
	}
	if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"who","token":%d}`, r.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
}

// probe runs cycles try and cycles waiting acquires (wait_ms 2000) of free
// keys as nc, each released at once, and returns the 99th percentile of the
// acquires. Any error fails the test: nothing here may be refused.
func probe(t *testing.T, nc *nats.Conn, cycles int) time.Duration {
	t.Helper()
	lat := make([]time.Duration, 0, 2*cycles)
	for i := 0; i < 2*cycles; i++ {
		wait := 0
		if i%2 == 1 {
			wait = 2000
		}
		key := fmt.Sprintf("b/probe/%d", i%8)
		var r protocol.AcquireReply
		start := time.Now()
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":10000,"wait_ms":%d}`, key, wait), &r); e != nil {
			t.Fatalf("probe acquire %s (wait_ms %d): %v", key, wait, e)
		}
		lat = append(lat, time.Since(start))
		if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, r.Token), &protocol.ReleaseReply{}); e != nil {
			t.Fatalf("probe release %s: %v", key, e)
		}
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// TestWaitFloodIsolated is the wait-queue exhaustion at the scale
// of a test: alice parks 2000 waiting acquires (twice the node's in-flight
// budget, twice her waiter share); bob's try and waiting acquires stay
// within 2x of their quiet p99, bob can still queue, and when alice's
// connection closes her waits end within seconds.
func TestWaitFloodIsolated(t *testing.T) {
	const floodSize, share, cycles = 2000, 1000, 150
	d := startTenantNode(t, func(cfg *daemon.Config) {
		// The attack's settings at a test's scale: alice's flood is twice
		// the node's budget of requests in progress and more than half the
		// node's waiters.
		cfg.MaxWaiters = 1500
		cfg.MaxInflight = floodSize / 2
		cfg.MaxWaitersPerIdentity = share
	})
	bob := tenant(t, d, "bob")
	requireIdentity(t, d, bob, "TENANT_B/bob")
	probe(t, bob, cycles/5) // warm up
	var ratios []float64
	for round := 1; round <= 3; round++ {
		quiet := probe(t, bob, cycles)
		f := startFlood(t, d, "alice", fmt.Sprintf("a/%d", round), floodSize)
		testkit.Eventually(t, 20*time.Second, "alice's flood parked or refused", func() bool {
			return gaugeValue(t, d, "ticketd_waiters") >= share && f.count("resource_exhausted") >= floodSize-share
		})
		loaded := probe(t, bob, cycles)
		ratios = append(ratios, float64(loaded)/float64(quiet))
		t.Logf("round %d: bob's acquire p99 %v quiet, %v with %v of alice's waits parked (%.2fx); alice's replies %v",
			round, quiet, loaded, gaugeValue(t, d, "ticketd_waiters"), ratios[len(ratios)-1], f.codes)

		// Bob can still wait in a queue: his share is his own.
		var held protocol.AcquireReply
		if e := rawRequest(t, bob, protocol.SubjectAcquire, `{"key":"b/queue","lease_ms":10000}`, &held); e != nil {
			t.Fatal(e)
		}
		if e := rawRequest(t, bob, protocol.SubjectAcquire, `{"key":"b/queue","lease_ms":10000,"wait_ms":100}`, &protocol.AcquireReply{}); e == nil || e.Code != protocol.CodeTimeout {
			t.Fatalf("bob's wait behind his own lock during the flood: %v, want timeout (queued, then given up)", e)
		}
		if e := rawRequest(t, bob, protocol.SubjectRelease, fmt.Sprintf(`{"key":"b/queue","token":%d}`, held.Token), &protocol.ReleaseReply{}); e != nil {
			t.Fatal(e)
		}

		// Alice's client is gone: her waits end within seconds, not at
		// their wait_ms.
		f.nc.Close()
		testkit.Eventually(t, 5*time.Second, "alice's waits gone after her connection closed", func() bool {
			return gaugeValue(t, d, "ticketd_waiters") == 0
		})
		if ratios[len(ratios)-1] <= 2 {
			break
		}
	}
	if best := slices.Min(ratios); best > 2 {
		t.Fatalf("bob's acquire p99 under alice's flood is %.2fx the quiet one in every round %v, want within 2x", best, ratios)
	}
}

// buildGuest builds a test guest of package plugins from source into dir.
func buildGuest(t *testing.T, name, dir string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("building wasm plugins is skipped in -short mode")
	}
	out := filepath.Join(dir, name+".wasm")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", out, "../plugins/testdata/guests/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, stderr.String())
	}
	return out
}

// TestSlowPolicyIsolated is the plugin slow path: a policy that
// runs to its deadline on alice's key, asked 32 times a second by 8 of
// alice's callers (2 instances on a 2-core box: without shares both are
// held by her calls all the time), leaves bob's acquires (each asking the same policy) within 2x of
// their quiet p99: alice holds at most her share of the instances and,
// once her plugin time is spent, is refused with resource_exhausted.
func TestSlowPolicyIsolated(t *testing.T) {
	const cycles = 100
	loop := buildGuest(t, "loop", t.TempDir())
	d := startTenantNode(t, func(cfg *daemon.Config) {
		cfg.Plugins = loop
		// Long enough that no healthy call of a loaded CI box is cut off;
		// alice's "loop" runs to it.
		cfg.PluginCallTimeoutMS = 1000
		cfg.PluginTimePerIdentityMS = 100
	})
	bob := tenant(t, d, "bob")
	requireIdentity(t, d, bob, "TENANT_B/bob")
	probe(t, bob, cycles/5) // warm up
	var ratios []float64
	denied := 0
	for round := 1; round <= 3; round++ {
		quiet := probe(t, bob, cycles)
		stop := make(chan struct{})
		var mu sync.Mutex
		codes := map[string]int{}
		alice := make([]*nats.Conn, 8)
		for w := range alice {
			alice[w] = tenant(t, d, "alice")
		}
		wait := testkit.Workers(len(alice), stop, func(w, i int) {
			m, err := alice[w].Request(protocol.SubjectAcquire, []byte(`{"key":"loop","lease_ms":10000}`), 5*time.Second)
			code := "no reply"
			if err == nil {
				code = m.Header.Get("Nats-Service-Error-Code")
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
			// The pace: 32 requests a second from 8 callers.
			time.Sleep(250 * time.Millisecond)
		})
		// Measured from the start: while one of alice's calls spins on
		// its instance, and after, while her spent share refuses her.
		loaded := probe(t, bob, cycles)
		testkit.Eventually(t, 10*time.Second, "alice's plugin time spent", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return codes[string(protocol.CodeResourceExhausted)] > 0
		})
		close(stop)
		wait()
		ratios = append(ratios, float64(loaded)/float64(quiet))
		t.Logf("round %d: bob's acquire p99 %v quiet, %v with alice's slow policy calls (%.2fx); alice's replies %v",
			round, quiet, loaded, ratios[len(ratios)-1], codes)
		denied += codes["denied"]
		if ratios[len(ratios)-1] <= 2 {
			break
		}
	}
	if denied == 0 {
		t.Fatal("no call of alice's ran to its deadline")
	}
	if best := slices.Min(ratios); best > 2 {
		t.Fatalf("bob's acquire p99 under alice's slow policy calls is %.2fx the quiet one in every round %v, want within 2x", best, ratios)
	}
	if n := counterValue(t, d, "ticketd_resource_exhausted_total", "resource", "identity_plugin_time"); n == 0 {
		t.Fatal("no identity_plugin_time refusal counted")
	}
}

// TestLeftWaitEndsAcrossRoute: a waiting client connected to a follower's
// NATS server (its request and reply cross a route) leaves; the leader's
// server sees its inbox lose interest over the route and the wait ends
// within seconds, not at its wait_ms, while a wait whose client stays is
// kept.
func TestLeftWaitEndsAcrossRoute(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	f := c.Follower(lead)
	holder := testkit.Connect(t, c.ClientURL(lead))
	if e := rawRequest(t, holder, protocol.SubjectAcquire, `{"key":"k","lease_ms":60000}`, &protocol.AcquireReply{}); e != nil {
		t.Fatal(e)
	}
	leaving, staying := testkit.Connect(t, c.ClientURL(f)), testkit.Connect(t, c.ClientURL(f))
	sendAcquire(t, leaving, "k", "")
	sendAcquire(t, staying, "k", "")
	waiters := func() float64 { return gaugeValue(t, c.Node(lead), "ticketd_waiters") }
	testkit.Eventually(t, 5*time.Second, "both queued", func() bool { return waiters() == 2 })
	leaving.Close()
	start := time.Now()
	testkit.Eventually(t, 5*time.Second, "the left client's wait ended", func() bool { return waiters() == 1 })
	t.Logf("the wait of a client that left ended %v after it closed its connection", time.Since(start).Round(time.Millisecond))
	// The staying client's wait survives a few more sweeps.
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := waiters(); n != 1 {
			t.Fatalf("%v waiters: the staying client's wait ended too", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
