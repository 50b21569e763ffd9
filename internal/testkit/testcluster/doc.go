// Package testcluster builds in-process ticketd clusters for tests: n
// daemon.Start nodes on 127.0.0.1 with a static initial cluster, their
// embedded NATS servers routed together, and short raft ticks.
//
// # What it owns
//
// New (cluster.go) picks free loopback ports for every node's peer, NATS
// client and NATS route listeners, writes one daemon.Config per node
// (data under one temporary directory, node i+1 in node<i+1>), lets the
// caller change each config and each node's daemon.Options, starts the
// nodes, and closes them at cleanup. Node i can be stopped (Close, its
// data kept) and started again on the same data and addresses, which is
// a restart. Leader, Follower and Converged wait for the states tests
// assert: exactly one ready leader, and every running node at the same
// applied index with the same lock-table digest.
//
// NewGroups (groups.go) starts a partitioned deployment
// (docs/scaling.md): routed NATS servers whose configuration holds the
// partition mapping, and one cluster per group behind them.
//
// Start and Stop return errors and never fail the test, so code running
// off the test goroutine (the faults nemesis) can use them; the waits
// fail the test and belong on the test goroutine.
//
// # What it does not own
//
// Faults: filters, clock jumps and wipes stay in faults, which builds on
// this package; a config tweak or an Options hook is the way in. Clusters
// formed through the control plane (bootstrap and joins) start their
// nodes in their own order: the faults harness does that with Unstarted,
// and the daemon's control tests, which add nodes that were never in a
// slot, start them with daemon.Start themselves. Single nodes and
// metrics readers stay with the tests that use them.
package testcluster
