// Package core is ticketd's deterministic lock state machine.
//
// # What it owns
//
// The replicated commands of SPEC §2 (Grant, Renew, Release, Expire,
// Control, and the session and lock-delay commands of cluster version
// 4), their results (SPEC §3), the lock table (table.go: fixed records, a
// string arena and an index, nothing for the collector to scan; load.go:
// its bulk load from stored records; load_snapshot.go: from a snapshot's
// bytes, and a snapshot's locks as stored records), the fencing-token
// counter, the request records that make an acquire retry-safe
// (requests.go), sessions and lock-delays (sessions.go), counting
// semaphores and read/write locks (kinds.go: the multi-holder keys), the fence
// signing keys (fence.go), the replicated control
// state (control.go: requests; control_apply.go: their application;
// control_state.go: the state), the cluster version that gates every
// format (version.go), and the versioned binary encodings of log entries
// and lock records (encoding.go), snapshots (encoding_snapshot.go,
// including SnapshotEncoder, which builds a snapshot one lock or one
// stored lock record at a time), ended request records and the request
// section (encoding_requests.go), session and delay records and the
// session section (encoding_sessions.go) and the control record
// (encoding_control.go), holder records and the kinds section
// (encoding_kinds.go), the incremental state digest (digest.go) and the
// limits, with the arithmetic that makes the largest state fit every path
// a snapshot travels (limits.go).
//
// # Request records
//
// A Grant may carry the client's request id (cluster version 3), scoped
// to its identity. While the grant is held its lock carries the id; when
// it ends, a record of it (hashes, token, end time) stays in a bounded
// FIFO for RequestRetentionMS of the data clock, the highest GrantedAtMS
// applied. A retry of the request gets ResultGrantRepeated or
// ResultGrantEnded with the first grant's token, never a second grant;
// ResultRequestMismatch when the id was used for another key;
// ResultRequestsExhausted when MaxRequestRecords are kept and none may be
// forgotten yet. LookupRequest and RequestRoom let the leader check
// before proposing.
//
// # Sessions and lock-delays
//
// From cluster version 4 a session (OpenSession: TTL, lock-delay, the
// opening identity) is one liveness for many locks: a Grant with its
// SessionID holds a lock without a lease, and CloseSession (a release)
// or ExpireSession (a failure, checked against the session's epoch) ends
// every lock of it in one command. A lock freed by a failure (an Expire
// of a lock with a LockDelayMS, an ExpireSession of a session with one)
// leaves its key delayed: Grants of it apply as ResultDelayed until the
// leader's ClearDelay. Core has no clock: the leader times sessions and
// delays and proposes the expiries and clears; sessions.go says why a
// keepalive that is not logged is still safe across leader changes.
// MaxSessions, MaxLocksPerSession and MaxDelayedKeys bound it, enforced by
// Apply.
//
// # Semaphores and read/write locks
//
// From cluster version 5 a Grant carries Limit (0: mutex; 2 to
// MaxSemaphoreLimit: a counting semaphore) and Mode (ModeExclusive, the
// default, or ModeShared: a read/write lock's shared side; not with a
// limit). Build one with Grant(...).WithKind(limit, mode). A key has one
// kind at a time; a Grant of another kind applies as ResultLimitMismatch
// with Result.Limit the key's current one (1 for mutex and read/write).
// Up to Limit holders, or any number of shared holders (at most
// MaxHoldersPerKey: ResultHoldersExhausted) hold a key at once, each with
// its own token; a Grant that must wait is ResultGrantRejected (Token: the
// oldest holder's), ResultDelayed when delayed slots fill the key. A
// mutex or exclusive lock stays in the record table (Get, ForEachLock,
// Locks); a multi-holder key's holders are in Holders(key) (every kind,
// token order), Holder(key, token) (the fence and check lookup),
// KeyHolders(key), IsMulti(key), ForEachHolder, HolderCount and
// MultiKeys (key order); Len counts both. Release, Renew and Expire act
// on the holder their token names; sessions end each of their holders
// (SessionLocks lists them, by key then token); a failure-freed holder
// leaves a delayed slot (ForEachDelay lists slots with keys,
// ClearDelay(key, seq) clears either; SlotDelayCount). Storage keeps one
// holder record per multi-holder key (EncodeHolderRecord,
// DecodeHolderRecord, LoadHolders after LoadSessions); snapshots carry
// SnapshotState.Holders. kinds.go says the rules and the lock-delay rule
// per kind.
//
// # Fence signing keys
//
// The control state keeps up to MaxFenceKeys Ed25519 keys (cluster version
// 3), the newest current: SetFenceKey carries a seed the leader generated;
// CurrentFenceKey signs, FencePublicKeys verifies. The seed is a secret
// held in the replicated state: the raft log, every snapshot, the control
// record in storage and every backup carry it, so those files are secrets
// (whoever reads one can sign fences for the cluster). Printing a command,
// a control request or a control state never shows it (FenceSeed.String).
//
// # Control
//
// A Control command carries one ControlRequest: Bootstrap, MintJoin,
// Admit, Promote, PrepareReplacement, CompleteReplacement,
// AbortReplacement or Retire. The leader authenticates the caller and
// proposes it (SPEC §4.5); Apply checks only the replicated invariants and
// answers BootstrapRecorded, AdmissionAccepted, ReplacementPrepared,
// ControlApplied, or ControlRejected with a stable ControlReason. A
// rejection changes nothing. NodeIDs and incarnations come from counters
// that only grow, every identity ever issued stays in the issued set, and
// a retired NodeID is never a member again; Machine.CheckIdentity lets the
// peer transport refuse a node that comes back with a retired or stale
// identity.
//
// # Reseeding
//
// Reseed (reseed.go) turns a backed-up state into the first state of a
// new cluster (ticketd snapshot restore): the token counter bumped past
// every token the old cluster may have issued since, the locks kept or
// dropped, and the control state either reduced to its cluster version
// (static clusters) or given one fresh voter with every old member
// retired. It is a pure function of its input, like Apply.
//
// # Rules
//
// Apply is a pure function of (state, command): no clock, no randomness, no
// I/O, and no map-iteration order leaks into a result, a snapshot or a
// digest. Every replica that applies the same commands in the same order
// reaches byte-identical state. Time enters only as data inside a command
// (Grant.GrantedAtMS, recorded for information; from cluster version 3 it
// also advances the data clock, which dates ended request records, and
// never decides whether a lock is held).
//
// Fencing tokens are assigned by Apply from a counter that is part of the
// replicated state, so they are identical on every node for the same entry
// and strictly increasing across the cluster's whole life: snapshots carry
// the counter, restarts restore it.
//
// # Hostile input
//
// Decoders (DecodeEntry, DecodeSnapshot, DecodeSnapshotState,
// DecodeLockRecord, DecodeControlState, DecodeEndedRequest,
// DecodeSessionRecord, DecodeDelayRecord, DecodeHolderRecord) accept only
// their known versions (entries 1-5, snapshots 1-6, lock records 1-4,
// control records 1-3, session, delay and holder records 1; version.go
// says which cluster version writes
// which), accept only the canonical encoding (the oldest version that
// carries the value), enforce the limits in limits.go, reject trailing
// bytes, and return *Error values with stable codes. They are fuzzed; see
// fuzz_test.go and testdata/fuzz.
package core
