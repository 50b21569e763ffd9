package daemon_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Releases cost the leader a raft entry each, even of a lock long gone,
// so they are counted in their identity's share of requests in progress
// like every other request: alice, sending releases of her own old token
// as fast as one connection can, must not fill the node's budget of
// requests in progress, which bob's renewals need to keep his lock.
func TestReleaseFloodIsolated(t *testing.T) {
	const flood = 4000
	d := startTenantNode(t, func(cfg *daemon.Config) {
		cfg.NoSync = false // each entry costs what it costs in production
		cfg.MaxInflight = 200
		cfg.MaxInflightPerIdentity = 100
	})
	alice, bob := tenant(t, d, "alice"), tenant(t, d, "bob")
	requireIdentity(t, d, alice, "TENANT_A/alice")
	var old protocol.AcquireReply
	if e := rawRequest(t, alice, protocol.SubjectAcquire, `{"key":"a/old","lease_ms":60000}`, &old); e != nil {
		t.Fatal(e)
	}
	if e := rawRequest(t, alice, protocol.SubjectRelease, fmt.Sprintf(`{"key":"a/old","token":%d}`, old.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
	var held protocol.AcquireReply
	if e := rawRequest(t, bob, protocol.SubjectAcquire, `{"key":"b/held","lease_ms":60000}`, &held); e != nil {
		t.Fatal(e)
	}

	var mu sync.Mutex
	answered, codes := 0, map[string]int{}
	inbox := nats.NewInbox()
	if _, err := alice.Subscribe(inbox+".*", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		answered++
		codes[m.Header.Get("Nats-Service-Error-Code")]++
	}); err != nil {
		t.Fatal(err)
	}
	body := []byte(fmt.Sprintf(`{"key":"a/old","token":%d}`, old.Token))
	go func() {
		for i := 0; i < flood; i++ {
			if alice.PublishRequest(protocol.SubjectRelease, fmt.Sprintf("%s.%d", inbox, i), body) != nil {
				return
			}
		}
		_ = alice.Flush()
	}()

	renew := fmt.Sprintf(`{"key":"b/held","token":%d,"lease_ms":60000}`, held.Token)
	refused := map[string]int{}
	renewals := 0
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := answered
		mu.Unlock()
		if done >= flood {
			break
		}
		if e := rawRequest(t, bob, protocol.SubjectRenew, renew, &protocol.RenewReply{}); e != nil {
			refused[string(e.Code)+": "+e.Message]++
		}
		renewals++
	}
	mu.Lock()
	t.Logf("bob renewed %d times during %d of alice's releases (her answers: %v)", renewals, answered, codes)
	mu.Unlock()
	if len(refused) > 0 {
		t.Fatalf("bob's renewals refused while alice flooded releases: %v", refused)
	}
	testkit.Eventually(t, 30*time.Second, "alice's flood answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return answered >= flood
	})
}
