package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// nats-server drops the response mapping of a request that crossed a
// service import once the export's response_threshold (2 minutes unless
// configured) has passed without a reply: a wait longer than that, through
// the import every identity deployment uses, could never be answered, and
// the node ended it as a vanished client's. protocol.MaxWait is 5
// minutes. The node raises the threshold of its lock exports to cover
// every wait; here the configuration says 1s and alice's wait of 4s is
// granted when bob releases after 2.5s.
func TestWaitOutlivesExportResponseThreshold(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	listen := testkit.FreeAddr(t)
	cfgText := strings.Replace(fairConf(listen), `exports = [{ service: "ticketd.v1.lock.>" }]`,
		`exports = [{ service: "ticketd.v1.lock.>", response_threshold: "1s" }]`, 1)
	if !strings.Contains(cfgText, `response_threshold: "1s"`) {
		t.Fatal("fairConf changed: the export was not found")
	}
	if err := os.WriteFile(conf, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startNodeWith(t, filepath.Join(dir, "data"), daemon.Options{}, func(cfg *daemon.Config) {
		cfg.NATSConfig, cfg.NATSListen = conf, listen
		cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
		cfg.NoSync = true
	})
	alice, bob := tenant(t, d, "alice"), tenant(t, d, "bob")
	var held protocol.AcquireReply
	if e := rawRequest(t, bob, protocol.SubjectAcquire, `{"key":"shared/k","lease_ms":60000}`, &held); e != nil {
		t.Fatal(e)
	}
	type result struct {
		m   *nats.Msg
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := alice.Request(protocol.SubjectAcquire, []byte(`{"key":"shared/k","lease_ms":10000,"wait_ms":4000}`), 8*time.Second)
		got <- result{m, err}
	}()
	time.Sleep(2500 * time.Millisecond) // the attack's timing: a release after the threshold, not a condition to poll for
	if e := rawRequest(t, bob, protocol.SubjectRelease, fmt.Sprintf(`{"key":"shared/k","token":%d}`, held.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("alice's 4s wait, past the export's 1s response threshold: %v, want the grant", r.err)
	}
	var g protocol.AcquireReply
	if err := protocol.ParseReply(r.m.Data, &g); err != nil || g.Token == 0 {
		t.Fatalf("alice's wait: %s (%v), want the grant", r.m.Data, err)
	}
}
