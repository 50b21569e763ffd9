package daemon_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
)

// A static member whose data directory was wiped does not bootstrap
// again unless told the cluster is new; told so with another cluster's
// token, it is a node of another cluster, and the members refuse it in
// the handshake even though it knows the secret.
func TestWipedStaticMember(t *testing.T) {
	c := testcluster.New(t, 3)
	c.Leader(10 * time.Second)
	id := c.Node(0).ClusterID()
	for i := range 3 {
		if got := c.Node(i).ClusterID(); got == 0 || got != id {
			t.Fatalf("node %d has cluster ID %x, node 1 %x", i+1, got, id)
		}
	}
	if err := c.Stop(2); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.Config(2).Data); err != nil {
		t.Fatal(err)
	}
	c.UpdateConfig(2, func(cfg *daemon.Config) { cfg.InitialClusterState = daemon.ClusterStateExisting })
	if err := c.Start(2); !errors.Is(err, daemon.ErrWipedMember) {
		t.Fatalf("restart on a wiped data directory: %v, want ErrWipedMember", err)
	}

	c.UpdateConfig(2, func(cfg *daemon.Config) {
		cfg.InitialClusterState, cfg.InitialClusterToken = daemon.ClusterStateNew, "another-cluster"
	})
	if err := c.Start(2); err != nil {
		t.Fatal(err)
	}
	if c.Node(2).ClusterID() == id {
		t.Fatal("another token derived the same cluster ID")
	}
	testkit.Eventually(t, 10*time.Second, "the members refuse the other cluster's node", func() bool {
		return c.Node(0).Peers().Stats().HandshakeFailures > 0 && c.Node(1).Peers().Stats().HandshakeFailures > 0
	})
	if got := c.Node(2).Node().Status().Lead; got != 0 {
		t.Fatalf("the other cluster's node follows leader %d", got)
	}
	c.Leader(10 * time.Second) // the two members still form the cluster
}
