package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/plugins/audit"
	"github.com/ticketd/ticketd/sdk"
)

// TestPluginsSeeKinds: on a real node, a policy module of ABI version 2
// (built with the SDK) denies a semaphore above 8 holders and a shared
// hold under exclusive/, while a module of ABI version 1 loaded beside it
// still decides (it refuses deny/) and is never shown the new fields (it
// denies any request with a member version 1 did not have); the version-2
// module's audit events name a semaphore holder's limit on its grant and
// on its release (which the node read at apply). Two modules, not three:
// compiling each costs seconds under -race.
func TestPluginsSeeKinds(t *testing.T) {
	dir := t.TempDir()
	old := buildGuest(t, "abi1", dir)
	pol := buildGuest(t, "kinds", dir)

	cfg := daemon.Defaults()
	cfg.Data = t.TempDir()
	cfg.NATSListen = "127.0.0.1:0"
	cfg.TickMS = testkit.TickMS
	cfg.Plugins = old + "," + pol
	cfg.PluginCallTimeoutMS = 2000
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	nc, cl := connect(t, d)
	events := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(audit.SubjectPrefix+".kinds.>", events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, tc := range []struct {
		key    string
		opts   []sdk.AcquireOption
		denied string // "" for granted
	}{
		{"jobs/a", []sdk.AcquireOption{sdk.WithLimit(9)}, "semaphores are limited to 8 holders"},
		{"exclusive/a", []sdk.AcquireOption{sdk.WithShared()}, "keys under exclusive/ are exclusive only"},
		{"deny/a", []sdk.AcquireOption{sdk.WithLimit(2)}, "abi1: keys under deny/ are refused"},
		{"exclusive/a", nil, ""},
		{"reports/a", []sdk.AcquireOption{sdk.WithShared()}, ""},
		{"jobs/a", []sdk.AcquireOption{sdk.WithLimit(8)}, ""},
	} {
		l, err := cl.Acquire(ctx, tc.key, append(tc.opts, sdk.WithLease(time.Minute))...)
		switch {
		case tc.denied == "" && err != nil:
			t.Fatalf("%s: %v, want granted", tc.key, err)
		case tc.denied != "" && (!errors.Is(err, sdk.ErrDenied) || !strings.Contains(err.Error(), tc.denied)):
			t.Fatalf("%s: %v, want ErrDenied %q", tc.key, err, tc.denied)
		case tc.key == "jobs/a" && err == nil:
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The kinds module names the semaphore's limit on its grant and on its
	// release (the node read the released holder's kind at apply).
	want := map[string]bool{"kinds.grant": false, "kinds.release": false}
	deadline := time.After(10 * time.Second)
	for !want["kinds.grant"] || !want["kinds.release"] {
		select {
		case m := <-events:
			var ev audit.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("audit body %q: %v", m.Data, err)
			}
			if bytes.Contains(ev.Data, []byte(`"key":"jobs/a"`)) {
				if !bytes.Contains(ev.Data, []byte(`"limit":8`)) {
					t.Fatalf("%s of the semaphore without its limit: %s", ev.Type, ev.Data)
				}
				want[ev.Type] = true
			}
		case <-deadline:
			t.Fatalf("audit events of the semaphore not received: %v", want)
		}
	}
}
