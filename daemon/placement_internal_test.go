package daemon

import (
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

func TestPlacementTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    originCounts
		want uint64
	}{
		{"all through one follower", originCounts{remote: map[uint64]int{2: 64}}, 2},
		{"all local", originCounts{local: 64, remote: map[uint64]int{}}, 0},
		{"majority, twice local", originCounts{local: 20, remote: map[uint64]int{2: 40, 3: 4}}, 2},
		{"majority, not twice local", originCounts{local: 25, remote: map[uint64]int{2: 39}}, 0},
		{"spread evenly", originCounts{local: 21, remote: map[uint64]int{2: 21, 3: 22}}, 0},
		{"half is not a majority", originCounts{remote: map[uint64]int{2: 32, 3: 32}}, 0},
		{"unknown servers count against", originCounts{unknown: 40, remote: map[uint64]int{2: 24}}, 0},
		{"after the move, the old leader's clients are a minority", originCounts{local: 40, remote: map[uint64]int{1: 24}}, 0},
		{"empty", originCounts{remote: map[uint64]int{}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := placementTarget(tc.c); got != tc.want {
				t.Fatalf("placementTarget(%+v) = %d, want %d", tc.c, got, tc.want)
			}
		})
	}
}

func TestSampleOrigins(t *testing.T) {
	routes := []*natsserver.RouteInfo{
		// nats.go's shared request inbox of a client of node 2's server,
		// and a catch-all there that must not claim every inbox.
		{RemoteName: "ticketd-2", Subs: []string{"_INBOX.aaa.*", "_INBOX.>", "ticketd.v1.watch.>"}},
		// Route pooling: a second connection to the same server.
		{RemoteName: "ticketd-2", Subs: []string{"_INBOX.old1"}},
		// Node 3: a custom inbox prefix and a service-import reply prefix.
		{RemoteName: "ticketd-3", Subs: []string{"tenant.inbox.bbb.*", "_R_.xyz.>"}},
		// A server that is not a ticketd node's.
		{RemoteName: "edge-1", Subs: []string{"_INBOX.ccc.*"}},
		// A bigger number than int holds must still be a node id.
		{RemoteName: "ticketd-18446744073709551615", Subs: []string{"_INBOX.big.*"}},
		// The same pattern on two nodes' servers: nobody's.
		{RemoteName: "ticketd-2", Subs: []string{"app.replies.>"}},
		{RemoteName: "ticketd-3", Subs: []string{"app.replies.>"}},
	}
	replies := []string{
		"_INBOX.aaa.1", "_INBOX.aaa.2", // node 2
		"_INBOX.old1",          // node 2, exact (old-style inbox)
		"tenant.inbox.bbb.7",   // node 3
		"_R_.xyz.abc.def",      // node 3
		"_INBOX.ccc.1",         // unknown server
		"_INBOX.zzz.1",         // local: only the catch-all matches
		"_INBOX.big.1",         // node 2^64-1
		"no-dots",              // local
		"ticketd.v1.watch.k.1", // node 2 through a 3-token prefix wildcard
		"app.replies.x.1",      // a tie: unknown
	}
	c := sampleOrigins(replies, routes)
	if c.local != 2 || c.unknown != 2 || c.remote[2] != 4 || c.remote[3] != 2 || c.remote[18446744073709551615] != 1 || len(c.remote) != 3 {
		t.Fatalf("sampleOrigins = %+v", c)
	}
}

func TestNodeOfServer(t *testing.T) {
	for name, want := range map[string]uint64{"ticketd-1": 1, "ticketd-42": 42, "ticketd-0": 0, "ticketd-": 0, "ticketd-x": 0, "nats-1": 0, "": 0} {
		got, ok := nodeOfServer(name)
		if got != want || ok != (want != 0) {
			t.Fatalf("nodeOfServer(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
}
