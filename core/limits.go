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
// One lock in a snapshot (version 3) takes at most MaxLockSnapshotSize:
//
//	key 2+512 | token 10 | owner 2+256 | lease 4 | granted_at 10 | identity 2+256 = 1,054 bytes
//
// and the control section at most MaxControlSnapshotSize (MaxControlNodes
// members of 10+10+1+2+MaxAddressLen bytes, issued and retired lists of
// 20 bytes each, MaxJoinCredentials credentials of 33 bytes, plus the
// fixed fields): 65,536 × (279 + 20 + 20 + 33) + 1,024 ≈ 23.1 MB. So a
// snapshot of the largest table is at most
//
//	MaxSnapshotSize = 64 + (MaxLocks + MaxLocksOverrun) × 1,054 + 23.1 MB
//	                = 64 + 1,148,576 × 1,054 + 23,069,696 ≈ 1.234 GB
//
// which must fit (each checked by a test or a compile-time assertion):
//   - the decoder: 1,148,576 locks ≤ MaxSnapshotLocks (16,777,216);
//   - the peer transport's streamed message, 2 GiB (transports/peer
//     MaxSnapshotSize; daemon asserts it at compile time);
//   - the one Pebble batch (4 GiB) that installs a received snapshot: the
//     snapshot bytes plus one row per lock (2+512 key, 1+1,054 value, ~10
//     batch overhead): 1.234 GB + 1,148,576 × 1,579 ≈ 3.05 GB.
//
// DefaultMaxLocks is below MaxLocks so that an operator can raise it a
// little without first measuring memory: a held lock costs about 0.5 KB of
// RSS at small sizes and 3 KB at the maximum key, owner and identity
// sizes on each node (see the issue notes for the measurement).
const (
	// MaxLocks is the highest --max-locks a node accepts.
	MaxLocks = 1 << 20
	// DefaultMaxLocks is --max-locks when not set.
	DefaultMaxLocks = 1_000_000
	// MaxLocksOverrun bounds how far in-flight grants of earlier leaders
	// can take the table past MaxLocks.
	MaxLocksOverrun = 100_000
	// MaxLockSnapshotSize is the largest encoding of one lock in a snapshot.
	MaxLockSnapshotSize = (2 + MaxKeyLen) + 10 + (2 + MaxOwnerLen) + 4 + 10 + (2 + MaxIdentityLen)
	// MaxControlSnapshotSize bounds the control section of a snapshot.
	MaxControlSnapshotSize = MaxControlNodes*(10+10+1+2+MaxAddressLen+20+20) + MaxJoinCredentials*33 + 1024
	// MaxSnapshotSize bounds the snapshot of any table the cluster can hold.
	MaxSnapshotSize = 64 + (MaxLocks+MaxLocksOverrun)*MaxLockSnapshotSize + MaxControlSnapshotSize
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
)

// MinLeaseMS and MaxLeaseMS are MinLease and MaxLease in milliseconds, the
// unit carried in commands.
const (
	MinLeaseMS = uint64(MinLease / time.Millisecond)
	MaxLeaseMS = uint64(MaxLease / time.Millisecond)
)
