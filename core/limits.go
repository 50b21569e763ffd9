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
