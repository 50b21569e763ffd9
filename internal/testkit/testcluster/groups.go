package testcluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Groups is a partitioned deployment (docs/scaling.md): groups clusters
// behind one NATS cluster whose configuration maps the keyed subjects
// onto them (protocol.PartitionMapping).
type Groups struct {
	// NATS are the servers of the NATS cluster, routed together.
	NATS []*server.Server
	// Clusters holds group g at index g.
	Clusters []*Cluster
}

// NewGroups starts natsServers routed NATS servers whose configuration
// holds the partition mapping for groups groups, then groups clusters of
// size nodes each (group g of groups, each with its own cluster token,
// node i connected to server i first), and waits until every group has a
// settled leader.
func NewGroups(t testing.TB, natsServers int, groups uint32, size int) *Groups {
	t.Helper()
	clients, routes := testkit.FreeAddrs(t, natsServers), testkit.FreeAddrs(t, natsServers)
	var routeURLs []string
	for _, r := range routes {
		routeURLs = append(routeURLs, fmt.Sprintf("%q", "nats-route://"+r))
	}
	src, dest := protocol.PartitionMapping(groups)
	gs := &Groups{}
	for i := range natsServers {
		gs.NATS = append(gs.NATS, testkit.NATSServerFromConfig(t, fmt.Sprintf(`
server_name: nats-%d
listen: %q
cluster { name: ticketd-groups, listen: %q, routes: [%s] }
mappings { %q: %q }
`, i, clients[i], routes[i], strings.Join(routeURLs, ", "), src, dest)))
	}
	for _, s := range gs.NATS {
		testkit.Eventually(t, 10*time.Second, "a full mesh of NATS routes", func() bool { return s.NumRoutes() >= natsServers-1 })
	}
	for g := range groups {
		gs.Clusters = append(gs.Clusters, New(t, size, WithConfig(func(i int, cfg *daemon.Config) {
			var urls []string
			for j := range gs.NATS {
				urls = append(urls, gs.NATS[(i+j)%len(gs.NATS)].ClientURL())
			}
			cfg.NATSURL, cfg.NATSListen, cfg.NATSClusterListen, cfg.NATSRoutes = strings.Join(urls, ","), "", "", ""
			cfg.Group, cfg.Groups = g, groups
			cfg.InitialClusterToken = fmt.Sprintf("group-%d", g)
		})))
	}
	for _, c := range gs.Clusters {
		lead := c.Leader(15 * time.Second)
		testkit.Eventually(t, 15*time.Second, "a settled leader", func() bool { return Settled(c.Node(lead)) })
	}
	return gs
}

// ClientURL is NATS server i's client URL.
func (gs *Groups) ClientURL(i int) string { return gs.NATS[i].ClientURL() }
