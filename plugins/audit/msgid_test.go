package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
)

// TestMsgID: one event's id is the same under one key (every node of a
// cluster), different under another, different for every index, plugin
// and position, and shows nothing but the index in clear.
func TestMsgID(t *testing.T) {
	k1, k2 := KeyFromSecret([]byte("peer-secret-0123456789"), 7), KeyFromSecret([]byte("peer-secret-0123456789"), 8)
	ev := plugins.Event{Index: 42, Plugin: "audit"}
	if msgID(k1, ev, 0) != msgID(append([]byte(nil), k1...), ev, 0) {
		t.Fatal("one key, one event, two ids: nodes would not de-duplicate")
	}
	if !regexp.MustCompile(`^42-[0-9a-f]{32}$`).MatchString(msgID(k1, ev, 0)) {
		t.Fatalf("id %q, want 42-<32 hex digits>", msgID(k1, ev, 0))
	}
	seen := map[string]string{}
	for _, c := range []struct {
		name string
		key  []byte
		ev   plugins.Event
		i    int
	}{
		{"base", k1, ev, 0},
		{"another cluster", k2, ev, 0},
		{"another position", k1, ev, 1},
		{"another index", k1, plugins.Event{Index: 43, Plugin: "audit"}, 0},
		{"another plugin", k1, plugins.Event{Index: 42, Plugin: "audit2"}, 0},
		// The index and position are fixed-width: no shifting of digits
		// into the plugin name makes two events one.
		{"plugin name absorbing the position", k1, plugins.Event{Index: 42, Plugin: "audit\x00\x00\x00\x01"}, 0},
	} {
		id := msgID(c.key, c.ev, c.i)
		if prev, dup := seen[id]; dup {
			t.Errorf("%s and %s share the id %s", c.name, prev, id)
		}
		seen[id] = c.name
	}
}

// TestForgedEventCannotSuppressRealOne is issue 21's attack: on an open
// NATS anyone can publish on ticketd.v1.audit.>, and a forged event
// published first under the id of an event to come made JetStream keep the
// forgery and drop the real grant as a duplicate. The forger publishes, for
// the next indexes, every id it could compute from what it can see (the
// old index-plugin-position form, and the keyed form under keys it could
// guess); the real events still all land in the stream.
func TestForgedEventCannotSuppressRealOne(t *testing.T) {
	nc := runNATS(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := EnsureStream(ctx, nc, "AUDIT", 1<<20); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	guessedKeys := [][]byte{nil, make([]byte, 32), KeyFromSecret(nil, 0), KeyFromSecret([]byte("ticketd"), 0)}
	const first, last = 40, 49
	for index := uint64(first); index <= last; index++ {
		ev := plugins.Event{Index: index, Plugin: "audit"}
		ids := []string{fmt.Sprintf("%d-%s-%d", index, "audit", 0)} // the old, predictable id
		for _, k := range guessedKeys {
			ids = append(ids, msgID(k, ev, 0))
		}
		for _, id := range ids {
			m := nats.NewMsg(SubjectPrefix + ".lock.granted")
			m.Data = []byte(`{"forged":true}`)
			m.Header.Set(nats.MsgIdHdr, id)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := &fakeAuditor{events: []plugins.Event{{Type: "lock.granted", Plugin: "audit", Data: json.RawMessage(`{"key":"k"}`)}}}
	p := newPublisher(t, Config{Auditor: a, Node: 1, Logger: testkit.QuietLogger(), IDKey: KeyFromSecret([]byte("the-real-peer-secret-0123"), 99)})
	p.Start(nc)
	defer p.Close()
	for index := uint64(first); index <= last; index++ {
		p.Offer(raftstore.Applied{Index: index})
	}
	stream, err := js.Stream(ctx, "AUDIT")
	if err != nil {
		t.Fatal(err)
	}
	real := map[uint64]bool{}
	testkit.Eventually(t, 10*time.Second, "every real event in the stream", func() bool {
		info, err := stream.Info(ctx)
		if err != nil {
			return false
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := stream.GetMsg(ctx, seq)
			if err != nil {
				return false
			}
			var ev Event
			if json.Unmarshal(m.Data, &ev) == nil && ev.Node == 1 {
				real[ev.Index] = true
			}
		}
		return len(real) == last-first+1
	})
}

// A publisher without a key would publish predictable ids: refused.
func TestNewPublisherNeedsKey(t *testing.T) {
	for _, key := range [][]byte{nil, []byte("short")} {
		if _, err := NewPublisher(Config{Auditor: &fakeAuditor{}, IDKey: key}); err == nil {
			t.Fatalf("NewPublisher accepted a %d-byte IDKey", len(key))
		}
	}
}

// TestLoadOrCreateKey: a node without peers creates its key once, private
// to its user, and reads the same key after a restart; a damaged key file
// is an error, not a silent new key.
func TestLoadOrCreateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit-msgid.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v (%v), want mode 0600", fi, err)
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil || string(k1) != string(k2) || len(k1) < MinIDKeySize {
		t.Fatalf("second load: %x (%v), want the first key %x", k2, err, k1)
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(path); err == nil {
		t.Fatal("a damaged key file was accepted")
	}
}
