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
//     row codecs.
//   - Node (node.go): the Ready loop, proposals matched to their applied
//     results, ReadIndex reads, snapshots and log compaction, leadership
//     notifications.
//
// # The Ready contract
//
// For every raft.Ready the loop (1) applies the committed entries to the
// in-memory core.Machine, (2) writes the new entries, the HardState, any
// received snapshot, and the applied rows with their applied index in one
// Pebble batch committed with Sync, (3) only then sends the messages,
// (4) reports results to waiting proposers and the Observer, and (5) calls
// Advance. Because (2) is one atomic batch, a crash either keeps an applied
// entry together with its effect or loses both and re-applies it on
// restart: nothing is applied twice, nothing is lost. Proposals that arrive
// during a write pile up in raft and go out in the next Ready, so one fsync
// carries many entries under load.
//
// # What it does not own
//
// Lease timers, waiter queues and the lost-reply path live in package
// server, which feeds commands to Node.Propose. The network lives in
// transports/peer, reached through the Transport interface.
package raftstore
