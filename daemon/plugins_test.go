package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/plugins/audit"
	"github.com/ticketd/ticketd/sdk"
)

// buildExample builds an example plugin from source into dir.
func buildExample(t *testing.T, name, dir string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("building wasm plugins is skipped in -short mode")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out := filepath.Join(dir, name+".wasm")
	cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", out, "../examples/plugins/"+name)
	// A -race test run must still build a plain wasm guest.
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, stderr.String())
	}
	return out
}

// TestPluginsPolicyAndAudit: an owner-prefix policy denies before the log
// (no index, no token consumed), and the audit plugin's events reach a
// plain NATS subscriber with their log index.
func TestPluginsPolicyAndAudit(t *testing.T) {
	dir := t.TempDir()
	policy := buildExample(t, "ownerprefix", dir)
	auditPlugin := buildExample(t, "audit", dir)

	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.TickMS = testkit.TickMS
	cfg.Plugins = policy + "," + auditPlugin
	// A loaded 2-core CI box can stall a healthy call past the 50ms default.
	cfg.PluginCallTimeoutMS = 2000
	cfg.AuditStream = "TICKETD_AUDIT"
	cfg.AuditStoreDir = t.TempDir() // a directory of its own
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	nc, cl := connect(t, d)
	events := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(audit.SubjectPrefix+".>", events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	state := testcluster.StateOf(d)
	_, err = cl.Acquire(ctx, "payments/42", sdk.WithLease(time.Second), sdk.WithOwner("intruder"))
	if !errors.Is(err, sdk.ErrDenied) || !strings.Contains(err.Error(), "svc-payments-") {
		t.Fatalf("got %v, want ErrDenied naming the required owner prefix", err)
	}
	if after := testcluster.StateOf(d); after.Applied != state.Applied || after.LastToken != state.LastToken {
		t.Fatalf("a denied grant reached the log: applied %d->%d, last token %d->%d", state.Applied, after.Applied, state.LastToken, after.LastToken)
	}
	l, err := cl.Acquire(ctx, "payments/42", sdk.WithLease(time.Minute), sdk.WithOwner("svc-payments-7"))
	if err != nil {
		t.Fatalf("allowed owner: %v", err)
	}
	if l.Token != state.LastToken+1 {
		t.Fatalf("token %d, want %d: the denied request consumed a token", l.Token, state.LastToken+1)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"lock.granted": false, "lock.released": false}
	deadline := time.After(10 * time.Second)
	for !want["lock.granted"] || !want["lock.released"] {
		select {
		case m := <-events:
			var ev audit.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("audit body %q: %v", m.Data, err)
			}
			if m.Subject != audit.SubjectPrefix+"."+ev.Type || ev.Index == 0 || m.Header.Get(nats.MsgIdHdr) == "" {
				t.Fatalf("bad audit event %s %s %v", m.Subject, m.Data, m.Header)
			}
			if ev.Type == "lock.granted" && !bytes.Contains(ev.Data, []byte(`"svc-payments-7"`)) {
				t.Fatalf("granted event lacks the owner: %s", ev.Data)
			}
			want[ev.Type] = true
		case <-deadline:
			t.Fatalf("audit events not received: %v", want)
		}
	}
	// The stream captured the events once each, and a re-publication of
	// an event (as every other node does) is de-duplicated.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, cfg.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	var before uint64
	var first *jetstream.RawStreamMsg
	testkit.Eventually(t, 5*time.Second, "events in the audit stream", func() bool {
		info, err := stream.Info(ctx)
		if err != nil || info.State.Msgs < 2 {
			return false
		}
		before = info.State.Msgs
		first, err = stream.GetMsg(ctx, info.State.FirstSeq)
		return err == nil
	})
	// The JetStream store lives in its own directory, not under data.
	if ents, err := os.ReadDir(cfg.AuditStoreDir); err != nil || len(ents) == 0 {
		t.Fatalf("audit store dir %s: %v %v", cfg.AuditStoreDir, ents, err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Data, "jetstream")); !os.IsNotExist(err) {
		t.Fatalf("a JetStream store under the data directory: %v", err)
	}
	if info, err := stream.Info(ctx); err != nil || info.Config.MaxBytes != cfg.AuditMaxBytes {
		t.Fatalf("audit stream MaxBytes %d (%v), want %d", info.Config.MaxBytes, err, cfg.AuditMaxBytes)
	}
	dup := nats.NewMsg(first.Subject)
	dup.Data, dup.Header = first.Data, first.Header
	if _, err := js.PublishMsg(ctx, dup); err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != before {
		t.Fatalf("duplicate audit event stored: %d -> %d messages", before, info.State.Msgs)
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Plugins) != 2 || len(st.Plugins[0].SHA256) != 64 {
		t.Fatalf("status plugins %+v, want two with sha256", st.Plugins)
	}
}
