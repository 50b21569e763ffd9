package secure_test

// The attacks of issue 21 on this example: a stranger in the tenant's own
// account releasing its lock, and one tenant's flood of waiting acquires.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// exampleConfig is ticketd.yaml, the example's own settings.
type exampleConfig struct {
	MaxLocksPerIdentity    int `yaml:"max-locks-per-identity"`
	MaxWaitersPerIdentity  int `yaml:"max-waiters-per-identity"`
	MaxInflightPerIdentity int `yaml:"max-inflight-per-identity"`
}

// applyExampleConfig sets cfg as ticketd.yaml does (every key of the file
// must be one this test knows, so the test runs what the file says).
func applyExampleConfig(t testing.TB, cfg *daemon.Config) {
	t.Helper()
	raw, err := os.ReadFile("ticketd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]any
	if err := yaml.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	var ec exampleConfig
	if err := yaml.Unmarshal(raw, &ec); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || ec.MaxLocksPerIdentity <= 0 || ec.MaxWaitersPerIdentity <= 0 || ec.MaxInflightPerIdentity <= 0 {
		t.Fatalf("ticketd.yaml %v: the test knows max-locks-per-identity, max-waiters-per-identity and max-inflight-per-identity", keys)
	}
	cfg.MaxLocksPerIdentity = ec.MaxLocksPerIdentity
	cfg.MaxWaitersPerIdentity = ec.MaxWaitersPerIdentity
	cfg.MaxInflightPerIdentity = ec.MaxInflightPerIdentity
}

// Carol, in alice's account and allowed to release under a/, cannot
// release (or renew) alice's lock with its token: locks are tied to the
// identity they were granted to.
func (n *node) noStrangerRelease(t *testing.T) {
	alice, carol := n.client(t, "alice"), n.client(t, "carol")
	l := n.held(t, alice, "a/carol-target")
	if err := carol.Release(ctx(t), "a/carol-target", l.Token); !errors.Is(err, sdk.ErrPermissionDenied) {
		t.Fatalf("carol released alice's lock with its token: %v, want permission_denied", err)
	}
	nc, _ := n.as(t, "carol")
	m, err := nc.Request("ticketd.v1.lock.renew", []byte(fmt.Sprintf(`{"key":"a/carol-target","token":%d,"lease_ms":60000}`, l.Token)), 3*time.Second)
	if err != nil || m.Header.Get("Nats-Service-Error-Code") != "permission_denied" {
		t.Fatalf("carol's renew of alice's lock: %v %s, want permission_denied", err, m.Data)
	}
	h, err := alice.Get(ctx(t), "a/carol-target")
	if err != nil || !h.Held || h.Token != l.Token {
		t.Fatalf("alice's lock after carol's attempts: %+v, %v", h, err)
	}
}

// Alice parks twice her waiter share of waiting acquires: beyond the
// share she gets resource_exhausted, bob's try and waiting acquires are
// served, and once alice's connection closes her waits end within
// seconds, not at their 300s wait_ms.
func (n *node) waitFlood(t *testing.T) {
	var ec exampleConfig
	raw, _ := os.ReadFile("ticketd.yaml")
	_ = yaml.Unmarshal(raw, &ec)
	share := ec.MaxWaitersPerIdentity
	alice := n.client(t, "alice")
	n.held(t, alice, "a/flooded")
	nc, _ := n.as(t, "alice")
	var mu sync.Mutex
	codes := map[string]int{}
	inbox := nc.NewInbox()
	if _, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		var e protocol.ErrorReply
		_ = json.Unmarshal(m.Data, &e)
		mu.Lock()
		defer mu.Unlock()
		if e.Error != nil {
			codes[string(e.Error.Code)]++
		} else {
			codes["granted"]++
		}
	}); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"key":"a/flooded","lease_ms":60000,"wait_ms":300000}`)
	for i := 0; i < 2*share; i++ { // within one key's queue (1,000)
		if err := nc.PublishRequest("ticketd.v1.lock.acquire", fmt.Sprintf("%s.%d", inbox, i), body); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waiters := func() float64 { return gauge(t, n.d, "ticketd_waiters") }
	testkit.Eventually(t, 10*time.Second, "alice's flood parked or refused", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return waiters() == float64(share) && codes["resource_exhausted"] == share
	})

	bob := n.client(t, "bob")
	for i, wait := range []time.Duration{0, time.Second} {
		start := time.Now()
		opts := []sdk.AcquireOption{sdk.WithLease(10 * time.Second)}
		if wait > 0 {
			opts = append(opts, sdk.WithWait(wait))
		}
		l, err := bob.Acquire(ctx(t), fmt.Sprintf("b/during-flood/%d", i), opts...)
		if err != nil {
			t.Fatalf("bob's acquire (wait %v) during alice's flood: %v", wait, err)
		}
		t.Logf("bob's acquire (wait %v) during alice's flood of %v waits: %v", wait, waiters(), time.Since(start))
		if err := l.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}

	nc.Close()
	start := time.Now()
	testkit.Eventually(t, 5*time.Second, "alice's waits gone after her connection closed", func() bool { return waiters() == 0 })
	t.Logf("alice's %d waits ended %v after her connection closed", share, time.Since(start).Round(time.Millisecond))
}

// gauge reads a gauge of d's registry.
func gauge(t *testing.T, d *daemon.Daemon, name string) float64 {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) > 0 && mf.Metric[0].Gauge != nil {
			return mf.Metric[0].Gauge.GetValue()
		}
	}
	return 0
}
