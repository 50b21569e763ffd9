package daemon_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestListPagesThroughFollower: held keys under a prefix, paged (from a
// client of a follower's NATS server, so most requests are served by a
// follower that forwards them) in byte order, exactly once each, with keys
// outside the prefix
// left out; a release is seen by the very next list (linearizable); bad
// limits change nothing.
func TestListPagesThroughFollower(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	nc := testkit.Connect(t, c.ClientURL(c.Follower(lead)))
	var want []string
	tokens := map[string]uint64{}
	for i := 0; i < 230; i++ {
		key := fmt.Sprintf("jobs/%03d", (i*7)%230) // not in key order
		var g protocol.AcquireReply
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":60000,"owner":"w"}`, key), &g); e != nil {
			t.Fatal(e)
		}
		want = append(want, key)
		tokens[key] = g.Token
	}
	for _, other := range []string{"job", "jobs", "jobs0", "zzz"} {
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":60000}`, other), &protocol.AcquireReply{}); e != nil {
			t.Fatal(e)
		}
	}
	slices.Sort(want)
	page := func(after string, limit int) protocol.ListReply {
		t.Helper()
		var r protocol.ListReply
		body := fmt.Sprintf(`{"prefix":"jobs/","after":%q,"limit":%d}`, after, limit)
		if e := rawRequest(t, nc, protocol.SubjectList, body, &r); e != nil {
			t.Fatalf("list %s: %v", body, e)
		}
		return r
	}
	var got []string
	after, pages := "", 0
	for {
		r := page(after, 100)
		pages++
		for _, l := range r.Locks {
			if !l.Held || l.Token != tokens[l.Key] || l.Owner != "w" || l.LeaseMS != 60000 || l.RemainingMS <= 0 || r.Index == 0 {
				t.Fatalf("listed %+v at index %d", l, r.Index)
			}
			got = append(got, l.Key)
		}
		if !r.More {
			break
		}
		after = got[len(got)-1]
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("listed %d keys in %d pages, want %d in 3 (first %q)", len(got), pages, len(want), got[:min(3, len(got))])
	}
	// Linearizable: a release acknowledged by the leader is gone from the
	// next list, whichever node serves it.
	k := want[0]
	if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, k, tokens[k]), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
	if r := page("", 1); len(r.Locks) != 1 || r.Locks[0].Key != want[1] || !r.More {
		t.Fatalf("after releasing %s the first page is %+v", k, r)
	}
	for _, body := range []string{`{"limit":1001}`, `{"limit":-1}`, `{"prefix":"x","bogus":1}`} {
		var r protocol.ListReply
		if e := rawRequest(t, nc, protocol.SubjectList, body, &r); e == nil {
			t.Fatalf("list %s accepted: %+v", body, r)
		}
	}
	// limit 0 is the default page size.
	var r protocol.ListReply
	if e := rawRequest(t, nc, protocol.SubjectList, `{}`, &r); e != nil || len(r.Locks) != protocol.DefaultListLimit || !r.More {
		t.Fatalf("default page: %d locks more=%v %v", len(r.Locks), r.More, e)
	}
}
