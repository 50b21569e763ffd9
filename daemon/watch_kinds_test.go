package daemon_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestWatchEventsOfKinds: every event of a semaphore holder (grant, renew,
// release, expire) names its limit and token, and every event of a shared
// hold (grant, expire, the delay_end of the slot it left) its mode, from
// each node of a real cluster; a mutex's events name neither. The kind of
// a release or expire is read by the node from the state before the
// command, so the key's last holder leaving still names it.
func TestWatchEventsOfKinds(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := testkit.Connect(t, c.ClientURL(c.Follower(lead)))
	const sem, shared, mutex = "kinds/sem", "kinds/shared", "kinds/mutex"
	got := watchKeys(t, c, nc, sem, shared, mutex)

	acquire := func(body string) protocol.AcquireReply {
		t.Helper()
		var g protocol.AcquireReply
		if e := rawRequest(t, nc, protocol.SubjectAcquire, body, &g); e != nil {
			t.Fatal(e)
		}
		return g
	}
	a := acquire(fmt.Sprintf(`{"key":%q,"lease_ms":10000,"limit":3}`, sem))
	b := acquire(fmt.Sprintf(`{"key":%q,"lease_ms":10000,"limit":3}`, sem))
	if e := rawRequest(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":%q,"token":%d,"lease_ms":20000}`, sem, a.Token), &protocol.RenewReply{}); e != nil {
		t.Fatal(e)
	}
	for _, tok := range []uint64{a.Token, b.Token} { // the second is the key's last holder
		if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, sem, tok), &protocol.ReleaseReply{}); e != nil {
			t.Fatal(e)
		}
	}
	e := acquire(fmt.Sprintf(`{"key":%q,"lease_ms":200,"limit":3}`, sem)) // expires
	s := acquire(fmt.Sprintf(`{"key":%q,"lease_ms":200,"lock_delay_ms":100,"mode":"shared"}`, shared))
	m := acquire(fmt.Sprintf(`{"key":%q,"lease_ms":200}`, mutex))

	type ev struct {
		typ   string
		token uint64
	}
	wants := map[string]struct {
		evs   []ev
		limit uint32
		mode  string
	}{
		sem: {[]ev{{protocol.EventGrant, a.Token}, {protocol.EventGrant, b.Token}, {protocol.EventRenew, a.Token},
			{protocol.EventRelease, a.Token}, {protocol.EventRelease, b.Token}, {protocol.EventGrant, e.Token}, {protocol.EventExpire, e.Token}}, 3, ""},
		shared: {[]ev{{protocol.EventGrant, s.Token}, {protocol.EventExpire, s.Token}, {protocol.EventDelayEnd, 0}}, 0, protocol.ModeShared},
		mutex:  {[]ev{{protocol.EventGrant, m.Token}, {protocol.EventExpire, m.Token}}, 0, ""},
	}
	for key, want := range wants {
		got.waitFromEveryNode(t, c, key, len(want.evs))
		for node, evs := range got.events(key) {
			if len(evs) != len(want.evs) {
				t.Fatalf("%s node %d: %+v, want %v", key, node, evs, want.evs)
			}
			for i, w := range want.evs {
				if g := evs[i]; g.Type != w.typ || g.Token != w.token || g.Limit != want.limit || g.Mode != want.mode {
					t.Errorf("%s node %d event %d: %+v, want %s token %d limit %d mode %q", key, node, i, g, w.typ, w.token, want.limit, want.mode)
				}
			}
		}
	}
}
