package daemon_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
