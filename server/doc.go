// Package server is the leader's side of ticketd's lock service: it turns
// client requests into raft proposals and keeps the state that lives only
// on the leader, outside the replicated state machine.
//
// # What it owns
//
//   - Lease timers (lease.go): one min-heap on the leader's monotonic
//     clock. When a lease runs out the leader proposes Expire{key, token};
//     the lock disappears only when that Expire commits and applies, and
//     only if the token still matches (SPEC §4.1–4.2). When a node becomes
//     leader it re-arms every held lock with its full lease, so no lease is
//     ever shortened by a leader change or a restart.
//   - Waiter queues (queue.go): a FIFO per key for acquires that wait. The
//     leader proposes a Grant only for a key it believes free and not
//     already pending, serving the head of the queue first. Waiters queued
//     on a leader that loses leadership get a retryable error at once.
//   - The lost-reply path (SPEC §4.4): a Grant that applies after the
//     requester's deadline, or whose reply cannot be written, is released
//     with its exact token. An outcome the leader cannot know is reported
//     as indeterminate; it never guesses a token or re-acquires.
//   - Grant policy: an optional Policy (WebAssembly plugins) is asked
//     before a Grant is proposed; a denied request never enters the log.
//
// Followers keep no lease or queue state; transports forward their client
// requests to the leader.
package server
