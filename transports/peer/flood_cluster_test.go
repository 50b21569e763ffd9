package peer_test

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/peer"
)

// TestManySourceFloodDuringRollingRestart is the attack: 72 idle
// connections to every node's peer port from 9 addresses (8 each, the
// per-source limit) while two of three nodes restart, one after the
// other. The members must get through: after each restart the cluster has
// a ready leader within 2 s. Before members were told apart from the
// flood, the cluster had no leader for the whole attack.
func TestManySourceFloodDuringRollingRestart(t *testing.T) {
	const (
		sources   = 9
		perSource = peer.MaxPendingHandshakesPerSource
		within    = 2 * time.Second
	)
	c := testcluster.New(t, 3)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, d := range c.Nodes() {
			if d == nil {
				continue
			}
			st := d.Node().Status()
			t.Logf("node %d: %s term %d lead %d, peers %+v", i+1, st.RaftState, st.Term, st.Lead, d.Peers().Stats())
		}
	})
	leader := c.Leader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var addrs []func() string
	for i := range c.Size() {
		addr := c.Config(i).PeerListen
		addrs = append(addrs, func() string { return addr })
	}
	peer.FloodConnect(ctx, t, addrs, sources, perSource)
	// The flood is in place once every node has had to turn connections
	// away: more of them than its handshake slots.
	testkit.Eventually(t, 20*time.Second, "every peer listener saturated", func() bool {
		for _, d := range c.Nodes() {
			if d.Peers().Stats().HandshakeFailures < sources*perSource-peer.MaxPendingHandshakes {
				return false
			}
		}
		return true
	})
	// Restart the leader, then another node: after the second restart only
	// one node keeps the sessions it had before the flood.
	for round, i := range []int{leader, (leader + 1) % c.Size()} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		c.Leader(within)
		t.Logf("restart %d (node %d): a ready leader after %v", round+1, i+1, time.Since(began).Round(time.Millisecond))
	}
	// Every member is back in the cluster, not only a majority.
	c.Converged(within)
	for i, d := range c.Nodes() {
		t.Logf("node %d: %d handshake failures", i+1, d.Peers().Stats().HandshakeFailures)
	}
}
