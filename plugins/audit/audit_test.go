package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
)

// fakeAuditor turns every applied command into the events it is given,
// stamped with the index, and fails on index 13.
type fakeAuditor struct {
	mu     sync.Mutex
	events []plugins.Event
	calls  int
	cmds   []core.Command // the commands shown, in order
	block  chan struct{}  // if set, each call waits for it
}

func (a *fakeAuditor) OnApplied(ctx context.Context, index uint64, cmd core.Command, res core.Result) ([]plugins.Event, error) {
	if a.block != nil {
		<-a.block
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	a.cmds = append(a.cmds, cmd)
	if index == 13 {
		return nil, errors.New("plugin trapped")
	}
	var out []plugins.Event
	for _, ev := range a.events {
		ev.Index = index
		out = append(out, ev)
	}
	return out, nil
}

// counters reads the ticketd_audit_* counters from reg.
func counters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] += m.GetCounter().GetValue()
		}
	}
	return out
}

func runNATS(t *testing.T, jetStream bool) *nats.Conn {
	t.Helper()
	var tweaks []func(*natsserver.Options)
	if jetStream {
		tweaks = append(tweaks, func(o *natsserver.Options) { o.JetStream, o.StoreDir = true, t.TempDir() })
	}
	return testkit.Connect(t, testkit.NATSServer(t, tweaks...).ClientURL())
}

// testKey is the IDKey of the tests' publishers.
const testKey = "audit-test-key-0123456789"

func newPublisher(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.IDKey == nil {
		cfg.IDKey = []byte(testKey)
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPublish: every event of an applied command goes out as an Event on
// its type's subject with a Nats-Msg-Id keyed on index, plugin and position.
func TestPublish(t *testing.T) {
	nc := runNATS(t, false)
	sub, err := nc.SubscribeSync(SubjectPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a := &fakeAuditor{events: []plugins.Event{
		{Type: "lock.granted", Plugin: "audit", Data: json.RawMessage(`{"key":"k"}`)},
		{Type: "lock.other", Plugin: "audit", Data: json.RawMessage(`{}`)},
	}}
	reg := prometheus.NewRegistry()
	p := newPublisher(t, Config{Auditor: a, Node: 3, Logger: testkit.QuietLogger(), Registerer: reg})
	p.Start(nc)
	defer p.Close()
	p.Offer(raftstore.Applied{Index: 13}) // the plugin fails: counted, nothing published
	p.Offer(raftstore.Applied{Index: 42})

	msgs := []struct{ subject, body, id string }{
		{"ticketd.v1.audit.lock.granted", `{"index":42,"node":3,"plugin":"audit","type":"lock.granted","data":{"key":"k"}}`, msgID([]byte(testKey), plugins.Event{Index: 42, Plugin: "audit"}, 0)},
		{"ticketd.v1.audit.lock.other", `{"index":42,"node":3,"plugin":"audit","type":"lock.other","data":{}}`, msgID([]byte(testKey), plugins.Event{Index: 42, Plugin: "audit"}, 1)},
	}
	for _, w := range msgs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != w.subject || string(m.Data) != w.body || m.Header.Get(nats.MsgIdHdr) != w.id {
			t.Fatalf("got %s %s %v, want %s %s %s", m.Subject, m.Data, m.Header, w.subject, w.body, w.id)
		}
	}
	// The counter moves just after the publish: give it a moment.
	want := map[string]float64{"ticketd_audit_events_total": 2, "ticketd_audit_plugin_failures_total": 1, "ticketd_audit_dropped_total": 0}
	deadline := time.Now().Add(5 * time.Second)
	for got := counters(t, reg); fmt.Sprint(got) != fmt.Sprint(want); got = counters(t, reg) {
		if time.Now().After(deadline) {
			t.Fatalf("counters %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOfferNeverBlocks: with the plugins stuck, Offer fills the queue and
// then drops and counts instead of waiting.
func TestOfferNeverBlocks(t *testing.T) {
	a := &fakeAuditor{block: make(chan struct{})}
	reg := prometheus.NewRegistry()
	p := newPublisher(t, Config{Auditor: a, Logger: testkit.QuietLogger(), Registerer: reg, QueueSize: 4})
	p.Start(nil) // no events, so nothing is published
	done := make(chan struct{})
	go func() {
		for i := 0; i < 100; i++ {
			p.Offer(raftstore.Applied{Index: uint64(i + 1)})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Offer blocked")
	}
	// One command may be in the stuck call, four queued: the rest dropped.
	if got := counters(t, reg)["ticketd_audit_dropped_total"]; got < 95 || got > 96 {
		t.Fatalf("dropped %v of 100 with a queue of 4", got)
	}
	close(a.block)
	p.Close()
	p.Close()
}

// TestEnsureStream: the stream captures the audit subjects and keeps one
// copy of an event however many nodes publish it.
func TestEnsureStream(t *testing.T) {
	nc := runNATS(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := EnsureStream(ctx, nc, "AUDIT", 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := EnsureStream(ctx, nc, "AUDIT", 1<<20); err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; len(c.Subjects) != 1 || c.Subjects[0] != "ticketd.v1.audit.>" || c.Duplicates != DuplicateWindowDefault || c.Storage != jetstream.FileStorage {
		t.Fatalf("stream config %+v", c)
	}
	for node := 0; node < 3; node++ {
		m := nats.NewMsg(SubjectPrefix + ".lock.granted")
		m.Data = []byte(`{}`)
		m.Header.Set(nats.MsgIdHdr, msgID([]byte(testKey), plugins.Event{Index: 7, Plugin: "audit"}, 0))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if info, err = stream.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages (%v), want 1", info.State.Msgs, err)
	}
	// Bounded: past MaxBytes the oldest events go, the stream stays under it.
	if c := info.Config; c.MaxBytes != 1<<20 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("stream bounds %d %v, want 1 MiB and discard old", c.MaxBytes, c.Discard)
	}
	big := make([]byte, 64<<10)
	for i := 0; i < 40; i++ { // 2.5 MiB into a 1 MiB stream
		m := nats.NewMsg(SubjectPrefix + ".lock.granted")
		m.Data = big
		m.Header.Set(nats.MsgIdHdr, msgID([]byte(testKey), plugins.Event{Index: uint64(100 + i), Plugin: "audit"}, 0))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if info, err = stream.Info(ctx); err != nil || info.State.Bytes > 1<<20 || info.State.FirstSeq == 1 {
		t.Fatalf("stream state %+v (%v): over its bound, or the oldest event kept", info.State, err)
	}
}

// TestPluginsSeeTheHoldersKind: a Renew, Release, Expire or ClearDelay
// names no kind, so the publisher shows plugins the holder's, as the node
// read it at apply (raftstore.Applied); a Grant keeps the kind it asked
// for, a control command gets none.
func TestPluginsSeeTheHoldersKind(t *testing.T) {
	a := &fakeAuditor{}
	p := newPublisher(t, Config{Auditor: a, Logger: testkit.QuietLogger()})
	p.Start(runNATS(t, false))
	defer p.Close()
	grant := core.Grant("k", "o", 1000, 0).WithKind(0, core.ModeShared)
	in := []raftstore.Applied{
		{Index: 1, Command: grant, Mode: core.ModeShared},
		{Index: 2, Command: core.Renew("k", 1, 2000), Mode: core.ModeShared},
		{Index: 3, Command: core.Release("s", 2), Limit: 4},
		{Index: 4, Command: core.Expire("s", 3), Limit: 4},
		{Index: 5, Command: core.ClearDelay("s", 7), Limit: 4},
		{Index: 6, Command: core.Release("m", 5)},
		{Index: 7, Command: core.Command{Kind: core.KindControl}, Limit: 9},
	}
	for _, ap := range in {
		p.Offer(ap)
	}
	testkit.Eventually(t, 5*time.Second, "every command audited", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.calls == len(in)
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, want := range []struct {
		limit uint32
		mode  core.Mode
	}{{0, core.ModeShared}, {0, core.ModeShared}, {4, 0}, {4, 0}, {4, 0}, {0, 0}, {0, 0}} {
		if c := a.cmds[i]; c.Limit != want.limit || c.Mode != want.mode || c.Key != in[i].Command.Key || c.Token != in[i].Command.Token {
			t.Errorf("command %d shown as %+v, want limit %d mode %v", i, c, want.limit, want.mode)
		}
	}
}
