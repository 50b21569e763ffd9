// Package control is ticketd's cluster control plane (SPEC §4.5): the
// HTTP control API on its own listener and credential, the loop that makes
// the raft membership follow the replicated control state, the node's
// identity file, and the client that cmd/ticketd, the daemon and the
// fault harness use to reach the API.
//
// # What it owns
//
//   - The control API (api.go): POST /v1/bootstrap, /v1/join-credentials,
//     /v1/join, /v1/replacements[/complete|/abort], /v1/retire,
//     /v1/members, /v1/identity, /v1/snapshot and /v1/fence/rotate. Admin endpoints need the control
//     credential as a bearer token; /v1/join is authenticated by a
//     one-time join credential and /v1/identity answers only valid or
//     not. Only the ready leader answers; anything else gets not_leader
//     (HTTP 421) with the leader it knows. A request becomes a core
//     Control command proposed to the raft log, so every voter applies
//     the same transition in the same order; credentials travel to the
//     log only as SHA-256 hashes. A join credential is checked against the
//     applied state before anything is proposed, so an anonymous request
//     appends nothing to the log.
//
//   - The API's exposure (limits.go, tls.go): TLS (required off loopback;
//     mutual TLS with a client CA); connections bounded per source
//     address and in all from accept on, before TLS, a new one evicting
//     the oldest that serves no request (internal/connlimit), so idle
//     connections, from one address or many, never keep the admin out; a
//     request is served (serving) only once its body is read and, on an
//     admin path, its credential accepted, so bodies that trickle in
//     cannot make connections unevictable either;
//     a short TLS handshake deadline and HTTP timeouts; and failed
//     attempts limited per source address without locking anyone out (a
//     source is an IPv4 address or an IPv6 /64, sourceKey):
//     once a source has spent them, each of its requests waits
//     FailureDelay (evictable) before its credential is checked, and
//     failures beyond one per FailureRefill are answered
//     too_many_attempts, but a correct credential is always accepted. The
//     wait is evictable so that more connections buy a guesser no more
//     checks; the cost is that one who shares the admin's address and
//     opens more than MaxConnsPerSource connections per FailureDelay
//     evicts the admin's waiting request too (mutual TLS is the answer
//     there: a guesser without a client certificate never gets a
//     credential checked, so the address is never paced). The client
//     refuses plain http off loopback (ErrInsecureURL): the credential
//     would travel in clear.
//
//   - The wire format (client.go): Request, Reply, Member, and Error with
//     its Code* values, each mapped to one HTTP status. Call finds the
//     leader among a list of URLs, retrying not_leader and unavailable
//     answers and nodes it cannot dial; a request that may have reached a
//     node without an answer comes back indeterminate, never retried.
//
//   - Reconciliation (reconcile.go): on the ready leader, every
//     ReconcileIntervalDefault, one ConfChangeV2 at a time (joint
//     consensus when more than one voter changes) moves the raft
//     membership to the control state's members, and a learner that
//     replicates within PromoteLagDefault of the commit index is promoted.
//     Every node also points its peer transport at exactly the current
//     members, so a retired id can no longer connect. Working from
//     replicated state means a new leader finishes what a crashed one
//     started.
//
//   - Fence signing keys (fence.go): the ready leader's reconcile loop
//     proposes the cluster's first fence key (a seed from crypto/rand)
//     once the cluster version is 3 and none exists; POST
//     /v1/fence/rotate (admin) makes a new one current, the older ones
//     kept by core (at most core.MaxFenceKeys).
//
//   - Static clusters (static.go): on a cluster formed from a static
//     member list (--initial-cluster), the admin endpoints that work on
//     members (members, join-credentials, replacements, retire) first
//     record the static voters in the control state with the ordinary
//     control commands (Bootstrap under a marker hash, then MintJoin,
//     Admit and Promote per id), so replacing, retiring and admitting
//     members then work as on a control-plane cluster. Reconcile removes a
//     raft member only once it is retired, so a half-recorded static
//     list never costs a voter.
//
//   - The identity file (identity.go): the NodeID and incarnation a node
//     was issued, kept in its data directory, and ResolveIdentity, which
//     a starting node runs to confirm it with the cluster, or to join or
//     replace a member and write it.
//
//   - Backup and restore (backup.go, snapshot.go, restore.go): POST
//     /v1/snapshot (admin, the ready leader after a ReadIndex) answers a
//     backup file: the core snapshot of the applied state with its
//     index, term, last token, members and time, sealed with an
//     HMAC-SHA256 under a key derived from the control credential
//     (BackupKey; the file format and the key's design are in
//     backup.go). DecodeBackup treats such a file as hostile input and
//     refuses one it cannot authenticate (altered, sealed under another
//     key, or an old checksum-only file) unless told otherwise
//     (Verify.Insecure); every refusal has a stable code
//     (BackupErrorCode). Restore seeds a new node from one: core.Reseed
//     (tokens bumped, locks kept or dropped, the old members retired and
//     one fresh voter issued, or a static member list), raftstore.Seed,
//     and the identity file; it refuses a token counter that would leave
//     the new cluster fewer than RestoreTokenHeadroom tokens.
//
// # What it does not own
//
// The control state and its invariants (issued and retired ids,
// credentials, the pending replacement) live in core.Machine; this
// package only proposes commands and reads the applied state through the
// Node interface (*raftstore.Node). Whether this node is the ready leader
// comes from the lock service (Leadership, *lockservice.Service); peer
// connections from the transport (Peers, *peer.Transport). Config
// parsing and start-up order belong to package daemon. Control requests
// never reach the client NATS port (package natsapi refuses them).
package control
