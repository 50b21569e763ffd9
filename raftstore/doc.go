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
//     (lock rows, control row, applied index, LoadMachine), requests.go
//     the request rows (the data clock and the ended request records of
//     core/requests.go, one row each by sequence number), sessions.go the
//     session rows (the open sessions and the delayed keys of
//     core/sessions.go, one row each, and a header with their counters),
//     holders.go the holder rows (each semaphore or read/write key held
//     shared, with all its holders and delayed slots, core/kinds.go: one
//     row per key), batch.go builds
//     and commits the one batch per Ready, keys.go holds the key layout and
//     row codecs, snapfile.go the snapshot data files (format 2: outside
//     Pebble, written and renamed like etcd's .snap files). seed.go creates
//     a store that starts from a snapshot (a node restored from a backup),
//     through the same Write a received snapshot takes. scan.go reads a
//     page of lock rows and holder rows in key order (the list operation)
//     from the store's durable view, without the state machine's lock.
//   - Disk (disk.go): the DiskGuard's low-space alarm (metric, status, one
//     log line; the lock service refuses Grants while it is on), the
//     ballast released through Pebble's OnDiskFull when a write still
//     meets a full disk, the refusal to start on a full disk, and a
//     leader's hand-over of leadership while its disk is low. A storage
//     failure Pebble cannot go on from is one log line and a fail-stop
//     (logger.go). HandOver (handover.go): a leader's hand-over of
//     leadership before a planned stop.
//   - Node: the node loop, which drives a raft.RawNode and takes queued
//     proposals, peer messages and calls between Readys (loop.go), its
//     lifecycle (node.go), the Ready steps
//     (ready.go), snapshots built off the loop (snapshot.go), proposals
//     matched to their applied results and applied-index waits
//     (propose.go), linearizable reads (readindex.go: callers share raft
//     ReadIndex rounds, one round in flight at a time, by etcd's rule: a
//     caller is answered only by a round issued after it arrived), the
//     Observers that hear applied commands,
//     restores, membership and leadership changes (observer.go), and the
//     Summary of the applied state (applied index, locks, last token,
//     cluster version, digest) published once per applied Ready, which
//     status reads without taking any lock the loop holds.
//   - Metrics (metrics.go): apply-batch, fsync, snapshot and tick-gap
//     histograms, free disk and the disk alarm, counters of leader changes
//     and snapshots taken, failed and restored, and NodeCollector, the raft
//     state read at scrape time (term, indexes, leader, membership, and on
//     the leader each follower's lag).
//
// # The Ready contract
//
// handleReady (ready.go) takes every raft.Ready through these steps:
//
//  1. trackSoftState: record leader, role and term.
//  2. applyCommitted: restore a received snapshot and apply the committed
//     entries to the in-memory core.Machine, collecting the net change of
//     the state rows (StateChange: lock rows, control row, request rows,
//     session rows, holder rows). A received snapshot's lock rows are staged into the
//     batch of step 3 by another goroutine meanwhile (StageSnapshotRows,
//     batch.go).
//  3. persist: write the new entries, the HardState, any received snapshot
//     and the state change with its applied index in one Pebble batch,
//     committed with Sync (without, when it carries only the state change
//     of entries already durable in the log). A committed entry this
//     binary cannot decode stops the node (UndecodableEntryError): it is
//     never skipped, so replicas never diverge during an upgrade. View
//     shows step 2's state during this write only when every entry it
//     applied was durable in the log before (applyAndPersist), and then
//     (unless the Ready changes membership) the Observers and waiting
//     proposers of step 5 hear of those entries before the write too
//     (deliverApplied); the applied index moves after the write, so a
//     reader that needs the state's index takes it from ViewIndexed.
//  4. send: only then hand the messages to the Transport (a leader sends
//     before its persist, see ready.go), consecutive appends and
//     acknowledgments to one peer merged into one message (coalesce.go);
//     a leader's commit-only appends are dropped or held until the next
//     tick (commitonly.go: heartbeats and later appends carry the commit
//     index too).
//  5. notify: tell the Observers, in list order, then waiting proposers
//     (unless step 3 did), ReadIndex callers and applied-index waiters,
//     then a lost or ready leadership.
//  6. maybeSnapshot: when due, take an O(1) copy of the applied rows (a
//     Pebble snapshot) and hand it to the background goroutine that
//     encodes, writes and records the snapshot and compacts the log
//     (snapshot.go says why that is as safe as doing it on the loop).
//
// The loop then calls Advance. Because step 3 is one atomic batch, a crash
// either keeps an applied entry together with its effect or loses both and
// re-applies it on restart: nothing is applied twice, nothing is lost.
// Proposals that arrive during a write pile up in the loop's queue and go
// to raft as one MsgProp before the next Ready, so one fsync carries many
// entries under load.
//
// # Secrets
//
// From cluster version 3 the replicated state holds the cluster's fence
// signing keys (core/fence.go): the control row, the log entries that set
// them and every snapshot file carry the seeds, so a store's directory is
// as secret as the peer secret. Nothing here logs a command's fields.
//
// # What it does not own
//
// Lease timers, waiter queues and the lost-reply path live in package
// server, which feeds commands to Node.Propose. The network lives in
// transports/peer, reached through the Transport interface. The lock
// service and the audit plugins are Observers that the daemon registers.
package raftstore
