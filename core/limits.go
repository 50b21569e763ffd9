package core

import "time"

// Limits on every lock command. They live here, in one place, because both
// the transports (which reject bad requests before proposing) and the
// decoders (which reject bad log entries) enforce them.
const (
	// MinLease is the shortest lease a Grant may carry.
	MinLease = 100 * time.Millisecond
	// MaxLease is the longest lease a Grant may carry.
	MaxLease = 24 * time.Hour
	// MaxKeyLen is the longest key in bytes.
	MaxKeyLen = 512
	// MaxOwnerLen is the longest owner correlation id in bytes.
	MaxOwnerLen = 256
	// MaxIdentityLen is the longest authenticated identity in bytes (a
	// NATS account public key is 56 bytes, a user name rarely more).
	MaxIdentityLen = 256
	// MaxRequestIDLen is the longest client request id (Grant.RequestID)
	// in bytes: room for a UUID or a ULID with a prefix.
	MaxRequestIDLen = 64

	// MaxEntrySize bounds one encoded log entry.
	MaxEntrySize = 4096
	// MaxSnapshotLocks bounds the number of locks a snapshot may declare, so
	// a hostile count cannot make the decoder allocate without bound.
	MaxSnapshotLocks = 1 << 24
)

// Limits on the size of the lock table, and the arithmetic that makes every
// table the cluster can hold fit every path a snapshot of it travels.
//
// The leader refuses a Grant that would take the table past its
// --max-locks (DefaultMaxLocks, at most MaxLocks) with resource_exhausted.
// Grants a former leader had in flight can still apply after a leader
// change, each leader at most one per acquire it was serving (natsapi
// MaxInflightDefault, 10,000), so the table can exceed the limit by a few
// tens of thousands: MaxLocksOverrun allows 100,000.
//
// One lock in a snapshot (version 5) takes at most MaxLockSnapshotSize:
//
//	key 2+512 | token 10 | owner 2+256 | lease 4 | granted_at 10 | identity 2+256
//	| request_id 2+64 | session_id 10 | lock_delay_ms 3 = 1,133 bytes
//
// the control section at most MaxControlSnapshotSize (MaxControlNodes
// members of 10+10+1+2+MaxAddressLen bytes, issued and retired lists of
// 20 bytes each, MaxJoinCredentials credentials of 33 bytes, MaxFenceKeys
// seeds of 32 bytes, plus the fixed fields): 65,536 × (279 + 20 + 20 + 33)
// + 4 × 32 + 1,024 ≈ 23.1 MB, the request section (requests.go) at most
// MaxRequestsSnapshotSize: 30 + MaxRequestRecords × 84 ≈ 176.2 MB, and the
// session section (sessions.go) at most MaxSessionsSnapshotSize: 40 +
// MaxSessions × 285 + MaxDelayedKeys × 527 ≈ 106.4 MB. From cluster
// version 5 a lock may instead be a holder of a semaphore or shared key
// alone on it in the kinds section, at most MaxHolderSnapshotSize (1,140
// bytes), and a delayed key a delayed slot alone on its key, at most
// MaxSlotSnapshotSize (534 instead of 527); every lock and delay is
// counted at the larger, plus 10 bytes for the section's count. So a
// snapshot of the largest state is at most
//
//	MaxSnapshotSize = 64 + (MaxLocks + MaxLocksOverrun) × 1,140 + 23.1 MB + 176.2 MB + 107.3 MB + 10
//	                = 64 + 1,148,576 × 1,140 + 23,069,824 + 176,160,798 + 107,348,008 + 10 ≈ 1.616 GB
//
// which must fit (each checked by a test or a compile-time assertion):
//   - the decoder: 1,148,576 locks ≤ MaxSnapshotLocks (16,777,216);
//   - the peer transport's streamed message, 2 GiB (transports/peer
//     MaxSnapshotSize; daemon asserts it at compile time);
//   - the one Pebble batch (4 GiB) that installs a received snapshot: the
//     snapshot bytes plus one row per lock (2+512 key, 1+1,133 value, ~10
//     batch overhead; a holder row, 1+1,140), one per ended request record
//     (10 key, 1+84 value, ~10), one per session (10 key, 1+285 value,
//     ~10) and one per delayed key (2+512 key, 1+534 value, ~10): 1.616
//     GB + 1,148,576 × 1,665 + 2,097,152 × 105 + 131,072 × 306 + 131,072 ×
//     1,059 ≈ 3.93 GB.
//
// DefaultMaxLocks is below MaxLocks so that an operator can raise it a
// little without first measuring memory: a held lock costs about 0.5 KB of
// RSS at small sizes and 3 KB at the maximum key, owner and identity
// sizes on each node (see the issue notes for the measurement). A request
// record costs about 160 bytes (an ended one: its 80-byte record in the
// FIFO and its index entry; a held lock's request id: the id in the lock
// and its index entry), so a full request table is about 330 MB.
const (
	// MaxLocks is the highest --max-locks a node accepts.
	MaxLocks = 1 << 20
	// DefaultMaxLocks is --max-locks when not set.
	DefaultMaxLocks = 1_000_000
	// MaxLocksOverrun bounds how far in-flight grants of earlier leaders
	// can take the table past MaxLocks.
	MaxLocksOverrun = 100_000
	// MaxLockSnapshotSize is the largest encoding of one lock in a snapshot.
	MaxLockSnapshotSize = (2 + MaxKeyLen) + 10 + (2 + MaxOwnerLen) + 4 + 10 + (2 + MaxIdentityLen) + (2 + MaxRequestIDLen) + 10 + 3
	// MaxControlSnapshotSize bounds the control section of a snapshot.
	MaxControlSnapshotSize = MaxControlNodes*(10+10+1+2+MaxAddressLen+20+20) + MaxJoinCredentials*33 + MaxFenceKeys*32 + 1024
	// MaxEndedSnapshotSize is the largest encoding of one ended request
	// record: request 32 | key_hash 32 | token 10 | ended_at 10.
	MaxEndedSnapshotSize = 32 + 32 + 10 + 10
	// MaxRequestsSnapshotSize bounds the request section of a snapshot:
	// data clock, head and count (10 each) and the ended records.
	MaxRequestsSnapshotSize = 30 + MaxRequestRecords*MaxEndedSnapshotSize
	// MaxSessionSnapshotSize is the largest encoding of one session:
	// id 10 | identity 2+256 | ttl_ms 4 | lock_delay_ms 3 | epoch 10.
	MaxSessionSnapshotSize = 10 + (2 + MaxIdentityLen) + 4 + 3 + 10
	// MaxDelaySnapshotSize is the largest encoding of one delayed key:
	// key 2+512 | delay_ms 3 | seq 10.
	MaxDelaySnapshotSize = (2 + MaxKeyLen) + 3 + 10
	// MaxSessionsSnapshotSize bounds the session section of a snapshot:
	// the last session id, the last delay sequence number and two counts
	// (10 each), the sessions and the delayed keys.
	MaxSessionsSnapshotSize = 40 + MaxSessions*MaxSessionSnapshotSize + MaxDelayedKeys*MaxDelaySnapshotSize
	// MaxHolderSnapshotSize is the largest encoding of one holder in the
	// kinds section (encoding_kinds.go) when it is its key's only one, so
	// that the key, the kind and the counts are its alone: key 2+512 |
	// limit 2 | mode 1 | counts 2+2 | token 10 | owner 2+256 | lease 4 |
	// granted_at 10 | identity 2+256 | request_id 2+64 | session_id 10 |
	// lock_delay_ms 3 = 1,140 bytes, more than MaxLockSnapshotSize: every
	// lock is counted at it.
	MaxHolderSnapshotSize = MaxLockSnapshotSize + 2 + 1 + 2 + 2
	// MaxSlotSnapshotSize is the largest encoding of a delayed slot alone
	// on its key, which bounds a delayed key's too: key 2+512 | limit 2 |
	// mode 1 | counts 2+2 | delay_ms 3 | seq 10.
	MaxSlotSnapshotSize = (2 + MaxKeyLen) + 2 + 1 + 2 + 2 + 3 + 10
	// MaxSnapshotSize bounds the snapshot of any state the cluster can hold.
	MaxSnapshotSize = 64 + (MaxLocks+MaxLocksOverrun)*MaxHolderSnapshotSize + MaxControlSnapshotSize + MaxRequestsSnapshotSize +
		MaxSessionsSnapshotSize - MaxDelayedKeys*MaxDelaySnapshotSize + MaxDelayedKeys*MaxSlotSnapshotSize + 10
)

// Limits on sessions and lock-delays (cluster version 4, sessions.go).
//
// Apply enforces every one of them itself, like MaxRequestRecords, so the
// replicated state never exceeds them whatever a former leader had in
// flight: an OpenSession beyond MaxSessions applies as
// ResultSessionsExhausted, a Grant into a session holding
// MaxLocksPerSession locks as ResultSessionLocksExhausted, and an Expire
// or ExpireSession that would delay more than MaxDelayedKeys keys as
// ResultDelaysExhausted (the lock stays held: its key stays unavailable,
// which is what its delay asked for, and the leader expires it again once
// a delay has ended; an ExpireSession is all or nothing). A leader
// refuses before proposing, with smaller operator limits (--max-sessions,
// per identity: SessionsOf is O(1)).
//
// A delayed key is a key whose lock was freed by a failure and that no
// Grant may take until the leader clears it, at most MaxLockDelayMS later
// by its clock (a new leader waits the full delay again). Keys are either
// held or delayed, never both, so the delayed set holds at most the keys
// freed by failure within the last minute or so; MaxDelayedKeys bounds it
// regardless of how the leader keeps up. It is at least
// MaxLocksPerSession, so that any one session can always expire once
// other delays have ended. A session costs about 300 bytes of state and a
// delayed key about 600 at the largest key: 40 MB and 80 MB at the bounds.
const (
	// MinSessionTTL is the shortest session TTL: a session is kept alive
	// by one keepalive for all its locks, meant to live long; a second
	// keeps keepalives to a few a second per session at most.
	MinSessionTTL = time.Second
	// MaxSessionTTL is the longest session TTL, as MaxLease.
	MaxSessionTTL = 24 * time.Hour
	// MaxLockDelay is the longest lock-delay (Chubby's and Consul's
	// maximum; Consul's default is 15 s).
	MaxLockDelay = 60 * time.Second
	// MaxSessions bounds the open sessions.
	MaxSessions = 1 << 17
	// DefaultMaxSessions is the leader's limit on open sessions when the
	// operator sets none (--max-sessions).
	DefaultMaxSessions = 100_000
	// MaxLocksPerSession bounds the locks one session holds, and with it
	// the work of the one command that closes or expires it.
	MaxLocksPerSession = 10_000
	// MaxDelayedKeys bounds the keys in their lock-delay.
	MaxDelayedKeys = 1 << 17
)

// MinSessionTTLMS, MaxSessionTTLMS and MaxLockDelayMS are the bounds
// above in milliseconds, the unit carried in commands.
const (
	MinSessionTTLMS = uint64(MinSessionTTL / time.Millisecond)
	MaxSessionTTLMS = uint64(MaxSessionTTL / time.Millisecond)
	MaxLockDelayMS  = uint64(MaxLockDelay / time.Millisecond)
)

// The bounds agree with each other and with the encodings' widths.
const (
	_ = uint(MaxDelayedKeys - MaxLocksPerSession)
	_ = uint(MaxSessions - DefaultMaxSessions)
	// ttl_ms fits 4 varint bytes, lock_delay_ms 3.
	_ = uint(1<<28 - 1 - MaxSessionTTLMS)
	_ = uint(1<<21 - 1 - MaxLockDelayMS)
)

// Limits on semaphores and read/write locks (cluster version 5,
// kinds.go). A semaphore's limit is at most MaxSemaphoreLimit, and a
// read/write key holds at most MaxHoldersPerKey shared holders and
// delayed shared slots (ResultHoldersExhausted beyond), so that no key
// makes one command (a Grant's checks, a row rewrite in storage, one
// holder record) cost more than a bounded amount. Every holder is a held
// lock: Len counts it, --max-locks bounds it, and a snapshot carries it
// at most MaxHolderSnapshotSize. Delayed slots count towards
// MaxDelayedKeys.
const (
	// MaxSemaphoreLimit is the largest semaphore limit.
	MaxSemaphoreLimit = 1024
	// MaxHoldersPerKey bounds the holders and delayed slots of any key.
	MaxHoldersPerKey = 1024
)

// The bounds agree: a full semaphore fits a key.
const _ = uint(MaxHoldersPerKey - MaxSemaphoreLimit)

// Limits on the request records (requests.go): what lets a client retry an
// acquire with the same request id and get the outcome of the first one.
//
// A request record exists for every held lock granted with a request id,
// and for every such grant that ended (released or expired), until it is
// pruned. The total is bounded by MaxRequestRecords, enforced by Apply
// itself (a Grant that would exceed it yields ResultRequestsExhausted,
// which the leader answers with resource_exhausted), so, unlike the lock
// table, it has no overrun. MaxRequestRecords is twice MaxLocks so that a
// full lock table whose every lock carries a request id (the SDK sends one
// on every acquire) still leaves room for the ended ones.
//
// Time is the data clock: the highest GrantedAtMS any Grant applied at
// cluster version 3 carried (the leaders' wall clocks, as data). An ended
// record is kept for RequestRetentionMS of it; when the table is full, an
// ended record older than MinRequestRetentionMS may be forgotten early to
// make room. Ended records older than RequestRetentionMS are pruned at most
// RequestPruneBudget per applied lock command, oldest first, so that no
// single apply does unbounded work.
const (
	// MaxRequestRecords bounds held locks with a request id plus ended
	// request records.
	MaxRequestRecords = 1 << 21
	// RequestRetentionMS is how long (by the data clock) an ended grant's
	// outcome is remembered for a retry.
	RequestRetentionMS = uint64(10 * time.Minute / time.Millisecond)
	// MinRequestRetentionMS is the least time an ended grant's outcome is
	// remembered, even when the table is full: a Grant that would have to
	// forget a younger one is refused (ResultRequestsExhausted) instead.
	MinRequestRetentionMS = uint64(time.Minute / time.Millisecond)
	// RequestPruneBudget is the most ended records one applied lock
	// command prunes, plus one per lock a CloseSession or ExpireSession
	// ends (the only commands that end more than one), so that any budget
	// above one drains a backlog.
	RequestPruneBudget = 4
)

// Limits on the replicated control state (SPEC §2 Control). Apply enforces
// the same bounds as the decoders, so every state Apply can reach is one a
// snapshot or control record can carry.
const (
	// MaxAddressLen is the longest member address (host:port) in bytes.
	MaxAddressLen = 256
	// MaxControlNodes bounds the number of NodeIDs ever issued, and with it
	// the member, issued and retired sets. An Admit or PrepareReplacement
	// beyond it is rejected with ReasonLimitReached.
	MaxControlNodes = 1 << 16
	// MaxJoinCredentials bounds the number of join credentials ever minted
	// (consumed ones are remembered so that they can never be reused). A
	// MintJoin beyond it is rejected with ReasonLimitReached.
	MaxJoinCredentials = 1 << 16
	// MaxFenceKeys bounds the fence signing keys kept (fence.go): the
	// current one and the three before it, so that fences signed before a
	// rotation keep verifying for a while.
	MaxFenceKeys = 4
)

// MinLeaseMS and MaxLeaseMS are MinLease and MaxLease in milliseconds, the
// unit carried in commands.
const (
	MinLeaseMS = uint64(MinLease / time.Millisecond)
	MaxLeaseMS = uint64(MaxLease / time.Millisecond)
)
