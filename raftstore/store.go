package raftstore

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// Sentinel errors of the storage layer. The raft.Storage methods return
// raft's own sentinels (raft.ErrCompacted, raft.ErrUnavailable,
// raft.ErrSnapOutOfDate) unwrapped, exactly as raft.MemoryStorage does,
// because raft compares them with ==.
var (
	// ErrStoreClosed is returned by every method called after Close.
	ErrStoreClosed = errors.New("raftstore: store is closed")
	// ErrCorrupt wraps every failure to decode or validate persisted bytes.
	ErrCorrupt = errors.New("raftstore: corrupt storage")
	// ErrInvariant wraps a request that would break a storage invariant (a
	// gap in the log, applying an index twice, truncating committed entries,
	// compacting past the snapshot, ...). Nothing is written when it is
	// returned. Where raft.MemoryStorage panics, Store returns ErrInvariant.
	ErrInvariant = errors.New("raftstore: storage invariant violated")
)

// StoreOptions configures Open.
type StoreOptions struct {
	// NoSync disables fsync (tests/benchmarks only). Default (false) = every
	// Write is pebble.Sync.
	NoSync bool
	// Logger receives the store's and Pebble's logs; nil = slog.Default().
	Logger *slog.Logger
	// Metrics, if set, observes every Write committed with fsync (or, with
	// NoSync, every committed Write): its duration and the number of raft
	// entries it carried. A Write with nothing to persist, or a
	// MaySkipSync write, is not observed.
	Metrics *Metrics
	// FS is the filesystem of the database and the snapshot files; nil
	// means the operating system's (vfs.Default). Tests inject faults
	// through Pebble's vfs/errorfs here.
	FS vfs.FS
	// Disk configures the low-space alarm and ballast (disk.go).
	Disk DiskOptions
	// OnFatal, if set, is called with a storage failure Pebble cannot go
	// on from, after its one log line; it should not return (the daemon
	// exits the process). Without it the failure panics, which the node
	// loop turns into a fail-stop when it happens in its own write.
	OnFatal func(error)
}

// Store is the Pebble-backed durable storage of one raft node: the raft log,
// HardState, snapshot and the applied lock table (see keys.go for the key
// layout).
//
// It implements raft.Storage with the semantics of raft.MemoryStorage (the
// dummy entry, FirstIndex/LastIndex, ErrCompacted/ErrUnavailable, maxSize),
// except that where MemoryStorage panics on a caller bug, Store returns an
// error wrapping ErrInvariant.
//
// Concurrency: raft calls the raft.Storage methods from its goroutine while
// the node loop calls Write, CreateSnapshot and Compact from another. The
// writers are serialised among themselves; readers see the state as of the
// last completed (durable) write through a Pebble snapshot that is swapped
// together with the in-memory index cache, so a reader never observes a
// half-applied write and never waits for an fsync.
type Store struct {
	db      *pebble.DB
	wo      *pebble.WriteOptions
	log     *slog.Logger
	metrics *Metrics
	snaps   snapFiles
	disk    *DiskGuard
	// dirLock is Pebble's directory lock, held from Open to Close: one
	// process per store.
	dirLock *pebble.Lock

	// writeMu serialises the writers (Write, CreateSnapshot, Compact, Close).
	// Only a writer holding writeMu changes st, view and closed, and it does
	// so under mu as well.
	writeMu sync.Mutex

	// mu guards st, view and closed: readers hold it for reading; a writer
	// holds it (with writeMu) only to swap in a new state.
	mu     sync.RWMutex
	st     storeState
	view   *pebble.Snapshot // consistent with st
	closed bool
}

// storeState is the in-memory cache of the persisted indexes.
type storeState struct {
	offset     uint64      // index of the dummy entry = FirstIndex()-1
	offsetTerm uint64      // its term
	last       uint64      // LastIndex()
	commit     uint64      // persisted HardState.Commit
	applied    uint64      // persisted applied index
	lastToken  uint64      // persisted last token
	snapIndex  uint64      // index of the latest snapshot (0 = none)
	snapTerm   uint64      // its term
	tail       logTail     // the newest entries, in memory (tail.go)
	requests   requestMark // persisted request rows' header (requests.go)
	sessions   sessionMark // persisted session rows' header (sessions.go)
}

// Open opens (creating if needed) the store in dir. An empty store behaves
// like raft.NewMemoryStorage: a dummy entry at index 0, term 0, so
// FirstIndex()=1 and LastIndex()=0.
func Open(dir string, opts StoreOptions) (_ *Store, err error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "raftstore")
	rawFS := opts.FS
	if rawFS == nil {
		rawFS = vfs.Default
	}
	if err := rawFS.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("raftstore: create %s: %w", dir, err)
	}
	// Before anything in dir is touched (snaps.init removes the temporary
	// snapshot files a running node may be writing): a second process on
	// the same store stops here.
	dirLock, err := pebble.LockDirectory(dir, rawFS)
	if err != nil {
		return nil, fmt.Errorf("raftstore: %s is in use (is another ticketd serving this data folder? stop it, or give this node its own --data): %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = dirLock.Close()
		}
	}()
	disk := newDiskGuard(rawFS, dir, opts.Disk, logger, opts.Metrics)
	if err := disk.checkStart(); err != nil {
		return nil, err
	}
	// Every write goes through the guard's ENOSPC handler (disk.go).
	fs := vfs.OnDiskFull(rawFS, disk.onDiskFull)
	snaps := snapFiles{fs: fs, dir: fs.PathJoin(dir, snapDirName)}
	if err := snaps.init(); err != nil {
		return nil, err
	}
	plog := newPebbleLogger(logger.With("subsystem", "pebble"), opts.OnFatal)
	db, err := pebble.Open(dir, &pebble.Options{
		FS:                 fs,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             plog,
		Lock:               dirLock,
	})
	if err != nil {
		return nil, fmt.Errorf("raftstore: open pebble in %s: %w", dir, err)
	}
	s := &Store{db: db, wo: pebble.Sync, log: logger, metrics: opts.Metrics, snaps: snaps, disk: disk, dirLock: dirLock}
	if opts.NoSync {
		s.wo = pebble.NoSync
	}
	if err := s.initialise(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	st, err := loadState(db, snaps)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	if err := snaps.removeExcept(st.snapTerm, st.snapIndex); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	s.st = st
	s.view = db.NewSnapshot()
	disk.start()
	logger.Info("raft storage opened", "dir", dir, "first_index", st.offset+1, "last_index", st.last,
		"commit", st.commit, "applied", st.applied, "snapshot_index", st.snapIndex, "no_sync", opts.NoSync)
	return s, nil
}

// initialise writes the rows of an empty store, or checks the format
// version of an existing one.
func (s *Store) initialise() error {
	v, ok, err := get(s.db, keyVersion)
	if err != nil {
		return err
	}
	if ok {
		ver, err := decodeUint64("format version", v)
		if err != nil {
			return err
		}
		if ver != storeFormatVersion1 && ver != storeFormatVersion {
			return fmt.Errorf("%w: format version %d, this build reads %d and %d", ErrCorrupt, ver, storeFormatVersion1, storeFormatVersion)
		}
		return nil
	}
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("raftstore: scan: %w", err)
	}
	nonEmpty := it.First()
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("raftstore: scan: %w", err)
	}
	if nonEmpty {
		return fmt.Errorf("%w: rows present but no %s row", ErrCorrupt, keyVersion)
	}
	b := s.db.NewBatch()
	defer b.Close()
	rows := []struct {
		k []byte
		m marshaler
	}{
		{keyHardState, &raftpb.HardState{}},
		{keyConfState, &raftpb.ConfState{}},
		{keySnapMeta, &raftpb.SnapshotMetadata{}},
		{logKey(0), &raftpb.Entry{}},
	}
	for _, r := range rows {
		if err := setMarshaled(b, r.k, r.m); err != nil {
			return err
		}
	}
	for _, kv := range [][2][]byte{
		{keyApplied, encodeUint64(0)},
		{keyLastToken, encodeUint64(0)},
		{keyVersion, encodeUint64(storeFormatVersion)},
	} {
		if err := b.Set(kv[0], kv[1], nil); err != nil {
			return fmt.Errorf("raftstore: initialise: %w", err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("raftstore: initialise: %w", err)
	}
	return nil
}

// loadState reads and cross-checks the persisted indexes.
func loadState(r reader, snaps snapFiles) (storeState, error) {
	var st storeState
	hs, err := readHardState(r)
	if err != nil {
		return st, err
	}
	st.commit = hs.Commit
	if st.applied, err = readUint64(r, keyApplied, "applied index"); err != nil {
		return st, err
	}
	if st.lastToken, err = readUint64(r, keyLastToken, "last token"); err != nil {
		return st, err
	}
	if st.requests, err = readRequestsHeader(r); err != nil {
		return st, err
	}
	if st.sessions, err = readSessionsHeader(r); err != nil {
		return st, err
	}
	meta, err := readSnapMeta(r)
	if err != nil {
		return st, err
	}
	st.snapIndex, st.snapTerm = meta.Index, meta.Term
	if meta.Index > 0 {
		if _, ok, err := get(r, keySnapData); err != nil {
			return st, err
		} else if !ok && !snaps.exists(meta.Term, meta.Index) {
			return st, fmt.Errorf("%w: snapshot %d has neither a file (%s) nor a %s row", ErrCorrupt, meta.Index, snaps.name(meta.Term, meta.Index), keySnapData)
		}
	}

	// Walk the log keys once: they must be contiguous. The first row is the
	// dummy entry.
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefixLog, UpperBound: endLog})
	if err != nil {
		return st, fmt.Errorf("raftstore: scan log: %w", err)
	}
	n := 0
	for valid := it.First(); valid; valid = it.Next() {
		idx, err := parseLogKey(it.Key())
		if err != nil {
			_ = it.Close()
			return st, err
		}
		if n == 0 {
			v, err := it.ValueAndErr()
			if err != nil {
				_ = it.Close()
				return st, fmt.Errorf("raftstore: read log row %d: %w", idx, err)
			}
			e, err := decodeEntry(idx, v)
			if err != nil {
				_ = it.Close()
				return st, err
			}
			st.offset, st.offsetTerm = idx, e.Term
		} else if idx != st.last+1 {
			_ = it.Close()
			return st, fmt.Errorf("%w: log row %d missing (next row is %d)", ErrCorrupt, st.last+1, idx)
		}
		st.last = idx
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return st, fmt.Errorf("raftstore: scan log: %w", err)
	}
	if n == 0 {
		return st, fmt.Errorf("%w: log has no rows (the dummy entry is missing)", ErrCorrupt)
	}
	if _, err := readEntry(r, st.last); err != nil {
		return st, err
	}
	// offset <= snapIndex <= applied <= commit <= last always holds.
	if !(st.offset <= st.snapIndex && st.snapIndex <= st.applied && st.applied <= st.commit && st.commit <= st.last) {
		return st, fmt.Errorf("%w: indexes out of order: first-1=%d snapshot=%d applied=%d commit=%d last=%d",
			ErrCorrupt, st.offset, st.snapIndex, st.applied, st.commit, st.last)
	}
	return st, nil
}

// Disk is the store's disk guard: its Err is the low-space alarm.
func (s *Store) Disk() *DiskGuard { return s.disk }

// Close closes the store. It is safe to call more than once.
func (s *Store) Close() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	view := s.view
	s.view = nil
	s.mu.Unlock()
	s.disk.close()
	if err := errors.Join(view.Close(), s.db.Close(), s.dirLock.Close()); err != nil {
		return fmt.Errorf("raftstore: close: %w", err)
	}
	return nil
}
