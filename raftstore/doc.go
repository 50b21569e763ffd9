// Package raftstore is ticketd's replicated lock engine: one
// go.etcd.io/raft/v3 node whose log, hard state, snapshots and applied
// lock table live in one Pebble database.
//
// # What it owns
//
//   - Store: raft.Storage over Pebble, plus the applied state machine rows
//     and the applied index, written in the same synced batch. store.go
//     opens and checks the database, raftlog.go is the raft.Storage side
//     (log, HardState, snapshots, compaction), state.go the applied state
//     (lock rows, control row, applied index, LoadMachine), batch.go builds
//     and commits the one batch per Ready, keys.go holds the key layout and
//     row codecs. seed.go creates a store that starts from a snapshot (a
//     node restored from a backup), through the same Write a received
//     snapshot takes.
//   - Node: the node loop and its lifecycle (node.go), the Ready steps
//     (ready.go), proposals matched to their applied results, ReadIndex
//     reads and applied-index waits (propose.go), and the Observers that
//     hear applied commands, restores, membership and leadership changes
//     (observer.go).
//   - Metrics (metrics.go): apply-batch and fsync histograms.
//
// # The Ready contract
//
// handleReady (ready.go) takes every raft.Ready through these steps:
//
//  1. trackSoftState: record leader, role and term.
//  2. applyCommitted: restore a received snapshot and apply the committed
//     entries to the in-memory core.Machine, collecting the net change of
//     the state rows (StateChange).
//  3. persist: write the new entries, the HardState, any received snapshot
//     and the state change with its applied index in one Pebble batch,
//     committed with Sync (without, when it carries only the state change
//     of entries already durable in the log).
//  4. send: only then hand the messages to the Transport.
//  5. notify: tell the Observers, in list order, then waiting proposers,
//     ReadIndex callers and applied-index waiters, then a lost or ready
//     leadership.
//  6. maybeSnapshot: record a snapshot and compact the log when due.
//
// The loop then calls Advance. Because step 3 is one atomic batch, a crash
// either keeps an applied entry together with its effect or loses both and
// re-applies it on restart: nothing is applied twice, nothing is lost.
// Proposals that arrive during a write pile up in raft and go out in the
// next Ready, so one fsync carries many entries under load.
//
// # What it does not own
//
// Lease timers, waiter queues and the lost-reply path live in package
// server, which feeds commands to Node.Propose. The network lives in
// transports/peer, reached through the Transport interface. The lock
// service and the audit plugins are Observers that the daemon registers.
package raftstore
