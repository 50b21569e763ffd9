package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3/raftpb"
)

// Key layout of the Pebble database behind a Store. Every key starts with a
// one-letter namespace and a slash, so the namespaces sort apart
// ("d/" < "e/" < "h/" < "k/" < "l/" < "m/" < "q/" < "r/" < "s/") and each can be
// range-deleted or scanned on its own.
//
//	key                        value
//	-------------------------  ---------------------------------------------------
//	m/version                  uint64 big endian: storage format (storeFormatVersion)
//	m/clusterid                uint64 big endian: the cluster this store belongs to
//	                           (optional: stores created before cluster IDs lack it)
//	r/hardstate                raftpb.HardState (Marshal)
//	r/confstate                raftpb.ConfState as of the applied index
//	r/snapmeta                 raftpb.SnapshotMetadata of the latest snapshot (zero = none)
//	r/snapdata                 format 1 only: core snapshot bytes of that snapshot; from
//	                           format 2 on they live in snap/<term>-<index>.snap (snapfile.go)
//	s/applied                  uint64 big endian: applied index
//	s/lasttoken                uint64 big endian: core.Machine.LastToken() at the applied index
//	s/control                  core.EncodeControlState of the control state (absent until
//	                           the first control command)
//	s/requests                 data clock, first and next ended request sequence numbers,
//	                           3 × uint64 big endian (absent until cluster version 3: zero)
//	s/sessions                 last session id, last delay sequence number, session rows,
//	                           delay rows, 4 × uint64 big endian (absent until cluster
//	                           version 4, or while all four are zero)
//	l/<index:8 big endian>     raftpb.Entry (Marshal); byte order is index order.
//	                           The lowest row is the dummy entry (Index and Term only)
//	                           that MemoryStorage keeps in ents[0]: its index is
//	                           FirstIndex()-1 and its term answers Term(FirstIndex()-1).
//	k/<lock key bytes>         core.EncodeLockRecord of the lock held on that key
//	q/<seq:8 big endian>       core.EncodeEndedRequest of the ended request record seq,
//	                           for every seq from the first to before the next of s/requests
//	e/<id:8 big endian>        core.EncodeSessionRecord of the open session id
//	d/<lock key bytes>         core.EncodeDelayRecord of the key in its lock-delay
//	h/<lock key bytes>         core.EncodeHolderRecord of the multi-holder key (a semaphore,
//	                           or a read/write key held shared): its holders and delayed
//	                           slots (cluster version 5, holders.go)
//
// Every row except r/snapdata, m/clusterid, s/control, s/requests,
// s/sessions and the q/, e/, d/ and h/ rows exists from the moment Open
// initialises an empty directory; a missing one is reported as corruption.
//
// The request rows (cluster version 3) need no new store format: a cluster
// at version 3 always has an s/control row in control record version 3,
// which an older binary refuses to load, so it can never start on a store
// whose request rows it would ignore. The same holds for the session rows
// (cluster version 4): the control record stays in version 3, but its
// cluster version 4 is above what an older binary accepts; and the holder
// rows (cluster version 5), whose control record carries cluster version 5.
//
// Format 2 moved the snapshot data out of Pebble into a file. A format 1
// store is read as it is and becomes format 2 with its next snapshot,
// which deletes r/snapdata in the same batch; a binary that reads only
// format 1 then refuses the store instead of misreading it.
const (
	storeFormatVersion1 = 1
	storeFormatVersion  = 2
)

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
	// keyRequests holds the request rows' header (requests.go).
	keyRequests = []byte("s/requests")
	// keySessions holds the session rows' header (sessions.go).
	keySessions = []byte("s/sessions")

	prefixLog   = []byte("l/")
	prefixLock  = []byte("k/")
	prefixEnded = []byte("q/")
	// prefixSession and prefixDelay hold the session and delay rows.
	prefixSession = []byte("e/")
	prefixDelay   = []byte("d/")
	// prefixHolder holds the multi-holder keys' rows (holders.go).
	prefixHolder = []byte("h/")

	// Exclusive upper bounds of the ranged namespaces ('/'+1 == '0').
	endLog     = []byte("l0")
	endLock    = []byte("k0")
	endEnded   = []byte("q0")
	endSession = []byte("e0")
	endDelay   = []byte("d0")
	endHolder  = []byte("h0")
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

// reader is what both *pebble.DB and *pebble.Snapshot offer.
type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

type marshaler interface{ Marshal() ([]byte, error) }

func setMarshaled(b *pebble.Batch, k []byte, m marshaler) error {
	v, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("marshal %q: %w", k, err)
	}
	return b.Set(k, v, nil)
}

// get returns a copy of the value under k; ok is false when there is none.
func get(r reader, k []byte) (v []byte, ok bool, err error) {
	val, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("raftstore: read %s: %w", k, err)
	}
	v = bytes.Clone(val)
	if v == nil {
		v = []byte{}
	}
	if err := closer.Close(); err != nil {
		return nil, false, fmt.Errorf("raftstore: read %s: %w", k, err)
	}
	return v, true, nil
}

// getRequired is get for a row that must exist.
func getRequired(r reader, k []byte) ([]byte, error) {
	v, ok, err := get(r, k)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: row %s missing", ErrCorrupt, k)
	}
	return v, nil
}

func readUint64(r reader, k []byte, name string) (uint64, error) {
	v, err := getRequired(r, k)
	if err != nil {
		return 0, err
	}
	return decodeUint64(name, v)
}

func readHardState(r reader) (raftpb.HardState, error) {
	var hs raftpb.HardState
	v, err := getRequired(r, keyHardState)
	if err != nil {
		return hs, err
	}
	if err := hs.Unmarshal(v); err != nil {
		return raftpb.HardState{}, fmt.Errorf("%w: hard state: %w", ErrCorrupt, err)
	}
	return hs, nil
}

func readConfState(r reader) (raftpb.ConfState, error) {
	var cs raftpb.ConfState
	v, err := getRequired(r, keyConfState)
	if err != nil {
		return cs, err
	}
	if err := cs.Unmarshal(v); err != nil {
		return raftpb.ConfState{}, fmt.Errorf("%w: conf state: %w", ErrCorrupt, err)
	}
	return cs, nil
}

func readSnapMeta(r reader) (raftpb.SnapshotMetadata, error) {
	var meta raftpb.SnapshotMetadata
	v, err := getRequired(r, keySnapMeta)
	if err != nil {
		return meta, err
	}
	if err := meta.Unmarshal(v); err != nil {
		return raftpb.SnapshotMetadata{}, fmt.Errorf("%w: snapshot metadata: %w", ErrCorrupt, err)
	}
	return meta, nil
}

// readEntry reads and validates the log row for index i.
func readEntry(r reader, i uint64) (raftpb.Entry, error) {
	v, ok, err := get(r, logKey(i))
	if err != nil {
		return raftpb.Entry{}, err
	}
	if !ok {
		return raftpb.Entry{}, fmt.Errorf("%w: log row %d missing", ErrCorrupt, i)
	}
	return decodeEntry(i, v)
}

// iterEntry decodes and validates the log row under it.
func iterEntry(it *pebble.Iterator) (raftpb.Entry, error) {
	idx, err := parseLogKey(it.Key())
	if err != nil {
		return raftpb.Entry{}, err
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return raftpb.Entry{}, fmt.Errorf("raftstore: read log row %d: %w", idx, err)
	}
	return decodeEntry(idx, v)
}

// decodeEntry unmarshals the log row for index idx (Unmarshal copies Data,
// so the result does not alias v) and checks it names that index.
func decodeEntry(idx uint64, v []byte) (raftpb.Entry, error) {
	var e raftpb.Entry
	if err := e.Unmarshal(v); err != nil {
		return raftpb.Entry{}, fmt.Errorf("%w: log row %d: %w", ErrCorrupt, idx, err)
	}
	if e.Index != idx {
		return raftpb.Entry{}, fmt.Errorf("%w: log row %d holds entry %d", ErrCorrupt, idx, e.Index)
	}
	switch e.Type {
	case raftpb.EntryNormal, raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
	default:
		return raftpb.Entry{}, fmt.Errorf("%w: log row %d has entry type %d", ErrCorrupt, idx, e.Type)
	}
	return e, nil
}
