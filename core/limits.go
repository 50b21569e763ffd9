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

	// MaxEntrySize bounds one encoded log entry.
	MaxEntrySize = 4096
	// MaxSnapshotLocks bounds the number of locks a snapshot may declare, so
	// a hostile count cannot make the decoder allocate without bound.
	MaxSnapshotLocks = 1 << 24
)

// MinLeaseMS and MaxLeaseMS are MinLease and MaxLease in milliseconds, the
// unit carried in commands.
const (
	MinLeaseMS = uint64(MinLease / time.Millisecond)
	MaxLeaseMS = uint64(MaxLease / time.Millisecond)
)
