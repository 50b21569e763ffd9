package daemon_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestWatchEventsFromEveryNode: a raw subscriber on a key's watch subject
// receives grant, renew, release, grant, expire from each of the three
// nodes, in that order per node, with strictly increasing indexes and the
// lock's token; a key that is not a valid subject (a space) maps to its
// hashed subject and its events carry the whole key.
func TestWatchEventsFromEveryNode(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := testkit.Connect(t, c.ClientURL(c.Follower(lead)))
	requireSkippedWithoutWatchers(t, c, nc, "jobs/unwatched")
	keys := []string{"jobs/nightly", "jobs/with space"}
	got := watchKeys(t, c, nc, keys...)
	if s := protocol.WatchSubject(keys[1]); s[:len(protocol.SubjectWatchPrefix)+3] != protocol.SubjectWatchPrefix+".h." {
		t.Fatalf("key with a space maps to %s", s)
	}
	for _, key := range keys {
		var g protocol.AcquireReply
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":1000,"owner":"o"}`, key), &g); e != nil {
			t.Fatal(e)
		}
		if e := rawRequest(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":%q,"token":%d,"lease_ms":2000}`, key, g.Token), &protocol.RenewReply{}); e != nil {
			t.Fatal(e)
		}
		if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.ReleaseReply{}); e != nil {
			t.Fatal(e)
		}
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":200}`, key), &g); e != nil {
			t.Fatal(e)
		}
	}
	want := []string{protocol.EventGrant, protocol.EventRenew, protocol.EventRelease, protocol.EventGrant, protocol.EventExpire}
	for _, key := range keys {
		got.waitFromEveryNode(t, c, key, len(want))
	}
	for _, key := range keys {
		byNode := got.events(key)
		for node, evs := range byNode {
			var types []string
			for i, ev := range evs {
				types = append(types, ev.Type)
				if i > 0 && ev.Index <= evs[i-1].Index {
					t.Errorf("%s node %d: index %d after %d", key, node, ev.Index, evs[i-1].Index)
				}
			}
			if !slices.Equal(types, want) {
				t.Fatalf("%s node %d: events %v, want %v", key, node, types, want)
			}
			first, renew, rel, second, exp := evs[0], evs[1], evs[2], evs[3], evs[4]
			if first.Token == 0 || renew.Token != first.Token || rel.Token != first.Token || exp.Token != second.Token || second.Token <= first.Token ||
				first.Owner != "o" || first.LeaseMS != 1000 || renew.LeaseMS != 2000 {
				t.Fatalf("%s node %d: %+v", key, node, evs)
			}
		}
		// Every node published the same entries.
		var idx [][]uint64
		for _, evs := range byNode {
			var ii []uint64
			for _, ev := range evs {
				ii = append(ii, ev.Index)
			}
			idx = append(idx, ii)
		}
		if !slices.Equal(idx[0], idx[1]) || !slices.Equal(idx[0], idx[2]) {
			t.Fatalf("%s: nodes published different indexes %v", key, idx)
		}
	}
}

// requireSkippedWithoutWatchers takes and releases key, which nobody
// watches, through nc: every node skips both events (no encoding, no
// publish) and publishes none.
func requireSkippedWithoutWatchers(t *testing.T, c *testcluster.Cluster, nc *nats.Conn, key string) {
	t.Helper()
	acquireRelease(t, nc, key)
	for i := range c.Nodes() {
		d := c.Node(i)
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("node %d skipped grant and release", i+1), func() bool {
			return counterValue(t, d, "ticketd_watch_events_skipped_total", "", "") >= 2
		})
		if n := counterValue(t, d, "ticketd_watch_events_published_total", "", ""); n != 0 {
			t.Fatalf("node %d published %v watch events nobody subscribed to", i+1, n)
		}
	}
}

// TestWatchThroughStreamImport: with ticketd in its own account exporting
// the watch stream, a tenant that imports it and subscribes through a
// follower's server gets the events of all three nodes: the interest check
// sees subscriptions that arrive through an import and over a route.
// Unwatched keys are skipped on every node.
func TestWatchThroughStreamImport(t *testing.T) {
	dir := t.TempDir()
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *daemon.Config) {
		conf := filepath.Join(dir, fmt.Sprintf("nats%d.conf", i))
		body := accountsConf(cfg.NATSListen, cfg.NATSClusterListen, strings.Split(cfg.NATSRoutes, ","))
		body = strings.Replace(body, `exports = [{ service: "ticketd.v1.lock.>" }]`,
			`exports = [{ service: "ticketd.v1.lock.>" }, { stream: "ticketd.v1.watch.>" }]`, 1)
		body = strings.Replace(body, `share: true }]`,
			`share: true }, { stream: { account: TICKETD, subject: "ticketd.v1.watch.>" } }]`, -1)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.NATSConfig, cfg.NATSClusterListen, cfg.NATSRoutes = conf, "", ""
		cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
	}))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc, err := nats.Connect(c.ClientURL(c.Follower(lead)), nats.UserInfo("alice", "alice-password"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	requireSkippedWithoutWatchers(t, c, nc, "a/unwatched")

	const key = "a/watched"
	got := watchKeys(t, c, nc, key)
	acquireRelease(t, nc, key)
	want := []string{protocol.EventGrant, protocol.EventRelease}
	got.waitFromEveryNode(t, c, key, len(want))
	for node, evs := range got.events(key) {
		var types []string
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
		if !slices.Equal(types, want) {
			t.Fatalf("node %d: events %v, want %v", node, types, want)
		}
	}
}

// acquireRelease takes key with a raw request through nc and gives it back.
func acquireRelease(t *testing.T, nc *nats.Conn, key string) {
	t.Helper()
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":5000}`, key), &g); e != nil {
		t.Fatal(e)
	}
	if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
}

// watchLog holds the watch events a subscriber received, by key and node.
type watchLog struct {
	mu  sync.Mutex
	got map[string]map[uint64][]protocol.WatchEvent
}

// watchKeys subscribes nc to the watch subject of each key and returns the
// log its events go to, once every node's server knows of the
// subscriptions (so a test is about the publisher, not route propagation).
func watchKeys(t *testing.T, c *testcluster.Cluster, nc *nats.Conn, keys ...string) *watchLog {
	t.Helper()
	w := &watchLog{got: map[string]map[uint64][]protocol.WatchEvent{}}
	for _, key := range keys {
		if _, err := nc.Subscribe(protocol.WatchSubject(key), func(m *nats.Msg) {
			var ev protocol.WatchEvent
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Errorf("event %q: %v", m.Data, err)
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.got[ev.Key] == nil {
				w.got[ev.Key] = map[uint64][]protocol.WatchEvent{}
			}
			w.got[ev.Key][ev.Node] = append(w.got[ev.Key][ev.Node], ev)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "watch interest known on every server", func() bool {
		for i := range c.Nodes() {
			for _, key := range keys {
				if !c.Node(i).WatchInterest(protocol.WatchSubject(key)) {
					return false
				}
			}
		}
		return true
	})
	return w
}

// events is a copy of key's events by node.
func (w *watchLog) events(key string) map[uint64][]protocol.WatchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[uint64][]protocol.WatchEvent, len(w.got[key]))
	for node, evs := range w.got[key] {
		out[node] = slices.Clone(evs)
	}
	return out
}

// waitFromEveryNode waits until every node of c published at least n
// events for key.
func (w *watchLog) waitFromEveryNode(t *testing.T, c *testcluster.Cluster, key string, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d events for %s from each node", n, key), func() bool {
		byNode := w.events(key)
		if len(byNode) != len(c.Nodes()) {
			return false
		}
		for _, evs := range byNode {
			if len(evs) < n {
				return false
			}
		}
		return true
	})
}
