package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit"
)

// processAddrs are the addresses of an n-node cluster of `ticketd serve`
// processes on 127.0.0.1, each from testkit.FreeAddr.
type processAddrs struct {
	urls    []string // each node's client NATS URL
	peers   []string // raft peer listeners
	routes  []string // NATS cluster listeners
	metrics []string // metrics listeners (passed only by the callers that scrape them)
	members string   // the --initial-cluster value
}

func newProcessAddrs(t testing.TB, n int) processAddrs {
	var a processAddrs
	var members []string
	for i := 0; i < n; i++ {
		a.peers = append(a.peers, testkit.FreeAddr(t))
		a.routes = append(a.routes, testkit.FreeAddr(t))
		a.metrics = append(a.metrics, testkit.FreeAddr(t))
		a.urls = append(a.urls, "nats://"+testkit.FreeAddr(t))
		members = append(members, fmt.Sprintf("%d=%s", i+1, a.peers[i]))
	}
	a.members = strings.Join(members, ",")
	return a
}

// serveArgs are node i's `serve` flags for a new cluster: its id, data
// directory and addresses, then extra.
func (a processAddrs) serveArgs(i int, data string, extra ...string) []string {
	return append([]string{
		"--id", fmt.Sprint(i + 1), "--data", data,
		"--nats-listen", strings.TrimPrefix(a.urls[i], "nats://"),
		"--nats-cluster-listen", a.routes[i], "--nats-routes", strings.Join(a.routes, ","),
		"--peer-listen", a.peers[i], "--initial-cluster", a.members, "--initial-cluster-state", "new",
	}, extra...)
}
