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
	var mu sync.Mutex
	got := map[string]map[uint64][]protocol.WatchEvent{} // key → node → events
	for _, key := range keys {
		got[key] = map[uint64][]protocol.WatchEvent{}
		if _, err := nc.Subscribe(protocol.WatchSubject(key), func(m *nats.Msg) {
			var ev protocol.WatchEvent
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Errorf("event %q: %v", m.Data, err)
				return
			}
			mu.Lock()
			got[ev.Key][ev.Node] = append(got[ev.Key][ev.Node], ev)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
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
	testkit.Eventually(t, 10*time.Second, "five events per key from each node", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, key := range keys {
			if len(got[key]) != 3 {
				return false
			}
			for _, evs := range got[key] {
				if len(evs) < len(want) {
					return false
				}
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for _, key := range keys {
		for node, evs := range got[key] {
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
		for _, evs := range got[key] {
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
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":5000}`, key), &g); e != nil {
		t.Fatal(e)
	}
	if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
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
	var mu sync.Mutex
	got := map[uint64][]string{} // node → event types
	if _, err := nc.Subscribe(protocol.WatchSubject(key), func(m *nats.Msg) {
		var ev protocol.WatchEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Errorf("event %q: %v", m.Data, err)
			return
		}
		mu.Lock()
		got[ev.Node] = append(got[ev.Node], ev.Type)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Wait until every node's server knows of the subscription, so the
	// check below is about the publisher, not route propagation.
	testkit.Eventually(t, 10*time.Second, "interest known on every server", func() bool {
		for i := range c.Nodes() {
			if !c.Node(i).WatchInterest(protocol.WatchSubject(key)) {
				return false
			}
		}
		return true
	})
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":5000}`, key), &g); e != nil {
		t.Fatal(e)
	}
	if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
	want := []string{protocol.EventGrant, protocol.EventRelease}
	testkit.Eventually(t, 10*time.Second, "grant and release from each node", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 3 {
			return false
		}
		for _, types := range got {
			if len(types) < len(want) {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for node, types := range got {
		if !slices.Equal(types, want) {
			t.Fatalf("node %d: events %v, want %v", node, types, want)
		}
	}
}
