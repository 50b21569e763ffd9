package raftstore

import (
	"encoding/binary"
	"fmt"
)

// Key layout of the Pebble database behind a Store. Every key starts with a
// one-letter namespace and a slash, so the namespaces sort apart
// ("k/" < "l/" < "m/" < "r/" < "s/") and each can be range-deleted or
// scanned on its own.
//
//	key                        value
//	-------------------------  ---------------------------------------------------
//	m/version                  uint64 big endian: storage format (storeFormatVersion)
//	r/hardstate                raftpb.HardState (Marshal)
//	r/confstate                raftpb.ConfState as of the applied index
//	r/snapmeta                 raftpb.SnapshotMetadata of the latest snapshot (zero = none)
//	r/snapdata                 core snapshot bytes of that snapshot (present iff snapmeta.Index > 0)
//	s/applied                  uint64 big endian: applied index
//	s/lasttoken                uint64 big endian: core.Machine.LastToken() at the applied index
//	l/<index:8 big endian>     raftpb.Entry (Marshal); byte order is index order.
//	                           The lowest row is the dummy entry (Index and Term only)
//	                           that MemoryStorage keeps in ents[0]: its index is
//	                           FirstIndex()-1 and its term answers Term(FirstIndex()-1).
//	k/<lock key bytes>         core.EncodeLockRecord of the lock held on that key
//
// Every row except r/snapdata exists from the moment Open initialises an
// empty directory; a missing one is reported as corruption.
const storeFormatVersion = 1

var (
	keyVersion   = []byte("m/version")
	keyHardState = []byte("r/hardstate")
	keyConfState = []byte("r/confstate")
	keySnapMeta  = []byte("r/snapmeta")
	keySnapData  = []byte("r/snapdata")
	keyApplied   = []byte("s/applied")
	keyLastToken = []byte("s/lasttoken")
	// keyControl holds core.EncodeControlState of the replicated control
	// state (absent until the first control command applies).
	keyControl = []byte("s/control")

	prefixLog  = []byte("l/")
	prefixLock = []byte("k/")

	// Exclusive upper bounds of the two ranged namespaces ('/'+1 == '0').
	endLog  = []byte("l0")
	endLock = []byte("k0")
)

// logKey is the key of the log row for index i.
func logKey(i uint64) []byte {
	k := make([]byte, len(prefixLog)+8)
	copy(k, prefixLog)
	binary.BigEndian.PutUint64(k[len(prefixLog):], i)
	return k
}

// parseLogKey returns the index a log row key names.
func parseLogKey(k []byte) (uint64, error) {
	if len(k) != len(prefixLog)+8 || string(k[:len(prefixLog)]) != string(prefixLog) {
		return 0, fmt.Errorf("%w: log key %q is not %q + 8 bytes", ErrCorrupt, k, prefixLog)
	}
	return binary.BigEndian.Uint64(k[len(prefixLog):]), nil
}

// lockKey is the key of the lock row for a lock key.
func lockKey(key string) []byte {
	k := make([]byte, 0, len(prefixLock)+len(key))
	k = append(k, prefixLock...)
	return append(k, key...)
}

func encodeUint64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func decodeUint64(name string, b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: %s is %d bytes, want 8", ErrCorrupt, name, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}
