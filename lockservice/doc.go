// Package lockservice is the leader's lease and waiter service: it turns
// lock requests into raft proposals and keeps the state that lives only on
// the leader, outside the replicated state machine.
//
// # What it owns
//
//   - Lease timers (leases.go, expiry.go): one min-heap on the leader's
//     monotonic clock, in a pointer-free table (about 70 bytes a timer, a
//     timer armed without an allocation once the table has room).
//     When a lease runs out the leader proposes Expire{key, token}; the
//     lock disappears only when that Expire commits and applies, and only
//     if the token still matches (SPEC §4.1–4.2). When a node becomes
//     leader it re-arms every held lock with its full lease, so no lease
//     is ever shortened by a leader change or a restart; a table larger
//     than RearmChunk is re-armed off the raft loop in steps while the
//     loop goes on applying, and the service serves once it is done
//     (observer.go says why the timers then match the held locks).
//   - Waiter queues (waiters.go): a FIFO per key for acquires that wait.
//     The leader proposes a Grant only for a key it believes free and not
//     already reserved for a Grant in flight, handing the key to the head
//     of the queue first. Waiters queued on a leader that loses leadership
//     get a retryable error at once.
//   - The lost-reply path (SPEC §4.4): a Grant that applies after the
//     requester's deadline, or whose reply cannot be delivered, is released
//     with its exact token. An outcome the leader cannot know is reported
//     as ErrIndeterminate; it never guesses a token or re-acquires.
//   - Renewal (renew.go): Renew proposes the replicated Renew command and
//     re-arms the lock's timer at apply time + the resulting lease; a Renew
//     and an Expire of one lock are never in flight together, which is
//     what makes an acknowledged renewal safe (the argument is in renew.go
//     and docs/protocol.md).
//   - Listing (list.go): a linearizable page of held locks under a prefix,
//     read from the store's sorted rows after ReadIndex.
//   - Withdrawal (withdraw.go): waits named by (key, identity, wait id)
//     can be taken out of their queue, and a grant that raced the
//     withdrawal is released with its exact token (a small bounded memory
//     of recent grants). Grant.Queued tells the transport which grants went
//     to requesters that waited, so it can check their delivery. From
//     cluster version 6 a withdrawal that names the request id settles the
//     request (core.Settle, requests.go): no later attempt of it is
//     granted.
//   - Grant policy: an optional plugins.Policy is asked before a Grant is
//     proposed; a denied request never enters the log.
//   - Access control (acl.go): an optional access list (identity → key
//     prefix → operations). authorize is the one check, made first by every
//     operation (acquire, and renew as acquire; release; get; list), against
//     the identity the transport put in the context (identity.go); a refusal
//     is ErrPermissionDenied and nothing is proposed. A Grant records the
//     identity on the lock once the cluster version allows it.
//   - Quotas and bounds (quota.go): every Grant reservation is admitted
//     against the total lock limit, the caller's identity quota and the
//     storage alarm, and every waiter against the per-key, per-identity
//     and per-node waiter limits; a refusal is a *LimitError
//     (ErrResourceExhausted) before anything is proposed. Releases and
//     expiries are never refused.
//   - Fair shares (fair.go): each identity's share of the requests in
//     progress on a node (BeginRequest, which the transport calls; a
//     waiting acquire leaves it once queued, AcquireParams.Parked), and of
//     a policy plugin's time (the plugin's refusal becomes a *LimitError).
//   - Fair admission of proposals (admission.go): while more than one
//     identity proposes, at most MaxProposingDefault proposals are in raft
//     at once; the rest wait, unproposed, in one FIFO per identity served
//     round robin, so one identity's flood of releases or renewals does
//     not fill every Ready another identity's entry lands in. The
//     cluster's own proposals are counted but never wait.
//   - Release and renew are tied to the identity a lock was granted to:
//     another identity's release or renew, even with the right token, is
//     ErrPermissionDenied and nothing is proposed; a release of a token
//     above the last one issued is ErrNotFound after a ReadIndex, without
//     a proposal (it could only meet a Grant still in flight).
//   - Fences and checks (fence.go): every grant carries a fence (key,
//     token and cluster ID signed with the cluster's current fence key,
//     package fence's format) once the cluster has one; FenceKeys serves
//     the public keys and Check whether a token is its key's current one,
//     both read after a ReadIndex on the ready leader.
//   - Retry-safe acquires (requests.go): an acquire with a request id is
//     first looked up in the replicated request records (core/requests.go)
//     and, once a ReadIndex confirms the leadership, answered with the
//     grant it produced (same token, lease not restarted), ErrGrantEnded,
//     or invalid_argument for another key; an attempt in progress on this
//     leader is taken over by its retry instead of waiting twice. Refused
//     with ErrUnsupported below cluster version 3, and with
//     resource_exhausted when the records are full.
//   - Expiry (expiry.go): one loop and a fixed pool of workers propose
//     the Expires of leases that ran out; no goroutine per lease.
//   - Sessions (sessions.go, sesstimers.go; cluster version 4): open,
//     keepalive and close of a session, one liveness for many locks. The
//     leader times each session on its monotonic clock and proposes
//     ExpireSession{id, epoch} when it runs out; a keepalive restarts the
//     timer without writing the log, after a ReadIndex, and is logged as
//     RefreshSession while an expiry of the session is in flight
//     (KeepAlive says why that is safe across leader changes; core's
//     sessions.go has the argument). A session lock has a lease timer
//     that never comes due (it counts as held for queues and quotas).
//     Only the opening identity uses, keeps alive or closes a session;
//     --max-sessions, a per-identity quota and locks per session bound
//     them (*LimitError).
//   - Lock-delay (delay.go): a key freed by a failure stays busy until
//     the leader's ClearDelay; a try gets ErrHeld as a *DelayedError with
//     the delay left on the leader's timer, waiters wait. A new leader
//     re-arms every session and delayed key with its full TTL or delay at
//     LeaderReady: never shorter.
//   - Semaphores and read/write locks (kinds.go; cluster version 5): an
//     acquire names a limit (a semaphore slot) or a shared mode; the
//     leader keeps a view of each multi-holder key read from the applied
//     machine, proposes a Grant only when the key's FIFO queue is empty
//     and it fits beside the holders, delayed slots and Grants in flight,
//     and hands the key to the head of the queue (and to the heads behind
//     it that fit beside it) as room frees. Each holder has its own lease
//     timer (timerKey), so expiry, renewal, release, check and lock-delay
//     work per holder token. A limit other than the key's is
//     invalid_argument naming the key's limit; below cluster version 5 a
//     limit or mode is ErrUnsupported.
//
// # What it does not own
//
// The wire: it returns domain errors (errors.go) and the NATS edge
// (transports/natsapi) maps them to the protocol's stable codes.
// Authentication: who the caller is comes from the transport, which alone
// can tell (natsapi reads what nats-server vouched for). The raft
// node, its storage and the replicated state machine (raftstore, core).
// Followers keep no lease or queue state; transports forward their client
// requests to the leader.
package lockservice
