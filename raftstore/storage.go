package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
	"go.etcd.io/raft/v3"
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

var _ raft.Storage = (*Store)(nil)

// StoreOptions configures Open.
type StoreOptions struct {
	// NoSync disables fsync (tests/benchmarks only). Default (false) = every
	// Write is pebble.Sync.
	NoSync bool
	// Logger receives the store's and Pebble's logs; nil = slog.Default().
	Logger *slog.Logger
	// OnSync, if set, is called after every Write committed with fsync (or,
	// with NoSync, every committed Write) with its duration and the number
	// of raft entries it carried (for metrics). A Write with nothing to
	// persist, or a MaySkipSync write, does not call it. It is called with
	// no lock held.
	OnSync func(d time.Duration, entries int)
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
	db     *pebble.DB
	wo     *pebble.WriteOptions
	log    *slog.Logger
	onSync func(time.Duration, int)

	// writeMu serialises the writers (Write, CreateSnapshot, Compact, Close).
	// Only a writer holding writeMu changes st, view and closed, and it does
	// so under mu as well.
	writeMu sync.Mutex

	mu     sync.RWMutex
	st     storeState
	view   *pebble.Snapshot // consistent with st
	closed bool
}

// storeState is the in-memory cache of the persisted indexes.
type storeState struct {
	offset     uint64 // index of the dummy entry = FirstIndex()-1
	offsetTerm uint64 // its term
	last       uint64 // LastIndex()
	commit     uint64 // persisted HardState.Commit
	applied    uint64 // persisted applied index
	lastToken  uint64 // persisted last token
	snapIndex  uint64 // index of the latest snapshot (0 = none)
}

// AppliedState is what applying a run of committed entries changed. Put and
// Delete are the net change of the whole run: a key granted and released in
// the same run must not appear in both (Write rejects that, since the two
// lists cannot say which came last). Build them after applying, from the
// touched keys: held now => Put, not held => Delete.
type AppliedState struct {
	Index     uint64            // new applied index (highest entry applied)
	LastToken uint64            // core.Machine.LastToken() after applying
	Put       []core.Lock       // locks now held (created) — write row
	Delete    []string          // keys no longer held — delete row
	ConfState *raftpb.ConfState // non-nil when a conf change was applied
	// Control is core.Machine.ControlSnapshot() after applying, non-nil
	// when a control command was applied.
	Control []byte
}

// ReadyWrite is everything one raft.Ready asks to persist.
type ReadyWrite struct {
	// HardState to persist; raft.IsEmptyHardState => unchanged.
	HardState raftpb.HardState
	// Entries to append; stored entries with index >= Entries[0].Index are
	// dropped first (raft log truncation). Entries at or below the dummy
	// entry are ignored, as in MemoryStorage.Append.
	Entries []raftpb.Entry
	// Snapshot to install; raft.IsEmptySnap => none. Its Data is a core
	// snapshot. Installing replaces all lock rows, the last token, the
	// applied index (= Metadata.Index) and the conf state, and discards the
	// whole log like MemoryStorage.ApplySnapshot (the dummy entry becomes
	// (Metadata.Index, Metadata.Term)); Entries of the same ReadyWrite are
	// then appended after it.
	Snapshot raftpb.Snapshot
	// Applied is the applied state to persist; nil => nothing applied.
	Applied *AppliedState
	// MaySkipSync says the write carries nothing raft needs on disk before
	// messages go out (no entries, no term or vote change, no snapshot):
	// typically the applied state of already-durable log entries. Such a
	// write is committed without fsync; Pebble's WAL is ordered, so a
	// crash loses it only together with every later write, and the
	// entries are re-applied from the durable log on restart. It is
	// ignored (the write syncs) when Entries or Snapshot are non-empty.
	MaySkipSync bool
}

// Open opens (creating if needed) the store in dir. An empty store behaves
// like raft.NewMemoryStorage: a dummy entry at index 0, term 0, so
// FirstIndex()=1 and LastIndex()=0.
func Open(dir string, opts StoreOptions) (*Store, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "raftstore")
	db, err := pebble.Open(dir, &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{logger.With("subsystem", "pebble")},
	})
	if err != nil {
		return nil, fmt.Errorf("raftstore: open pebble in %s: %w", dir, err)
	}
	s := &Store{db: db, wo: pebble.Sync, log: logger, onSync: opts.OnSync}
	if opts.NoSync {
		s.wo = pebble.NoSync
	}
	if err := s.initialise(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	st, err := loadState(db)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	s.st = st
	s.view = db.NewSnapshot()
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
		if ver != storeFormatVersion {
			return fmt.Errorf("%w: format version %d, this build reads %d", ErrCorrupt, ver, storeFormatVersion)
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
func loadState(r reader) (storeState, error) {
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
	meta, err := readSnapMeta(r)
	if err != nil {
		return st, err
	}
	st.snapIndex = meta.Index
	if meta.Index > 0 {
		if _, ok, err := get(r, keySnapData); err != nil {
			return st, err
		} else if !ok {
			return st, fmt.Errorf("%w: snapshot %d has no %s row", ErrCorrupt, meta.Index, keySnapData)
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
	if err := errors.Join(view.Close(), s.db.Close()); err != nil {
		return fmt.Errorf("raftstore: close: %w", err)
	}
	return nil
}

// InitialState implements raft.Storage. The ConfState is the one as of the
// persisted applied index (AppliedIndex), which is what raft.Config.Applied
// must be set to on restart.
func (s *Store) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return raftpb.HardState{}, raftpb.ConfState{}, ErrStoreClosed
	}
	hs, err := readHardState(s.view)
	if err != nil {
		return raftpb.HardState{}, raftpb.ConfState{}, err
	}
	cs, err := readConfState(s.view)
	if err != nil {
		return raftpb.HardState{}, raftpb.ConfState{}, err
	}
	return hs, cs, nil
}

// Entries implements raft.Storage: the entries [lo, hi), at least one if
// any, and no more than fit in maxSize bytes (raftpb.Entry.Size) beyond the
// first. It returns raft.ErrCompacted when lo <= FirstIndex()-1 and
// raft.ErrUnavailable when the log holds only the dummy entry. The slice and
// the entries' Data are freshly allocated.
func (s *Store) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	st := s.st
	if lo <= st.offset {
		return nil, raft.ErrCompacted
	}
	if hi > st.last+1 {
		return nil, fmt.Errorf("%w: entries hi %d is out of bound last index %d", ErrInvariant, hi, st.last)
	}
	if st.last == st.offset {
		return nil, raft.ErrUnavailable
	}
	if lo > hi {
		return nil, fmt.Errorf("%w: entries lo %d above hi %d", ErrInvariant, lo, hi)
	}
	ents := make([]raftpb.Entry, 0, min(hi-lo, 128))
	if lo == hi {
		return ents, nil
	}
	it, err := s.view.NewIter(&pebble.IterOptions{LowerBound: logKey(lo), UpperBound: logKey(hi)})
	if err != nil {
		return nil, fmt.Errorf("raftstore: entries [%d, %d): %w", lo, hi, err)
	}
	var size uint64
	next, limited := lo, false
	for valid := it.First(); valid; valid = it.Next() {
		e, err := iterEntry(it)
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		if e.Index != next {
			_ = it.Close()
			return nil, fmt.Errorf("%w: log row %d missing (next row is %d)", ErrCorrupt, next, e.Index)
		}
		size += uint64(e.Size())
		if len(ents) > 0 && size > maxSize {
			limited = true
			break
		}
		ents = append(ents, e)
		next++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, fmt.Errorf("raftstore: entries [%d, %d): %w", lo, hi, err)
	}
	if next < hi && !limited {
		return nil, fmt.Errorf("%w: log row %d missing (last index %d)", ErrCorrupt, next, st.last)
	}
	return ents, nil
}

// Term implements raft.Storage: the term of entry i for i in
// [FirstIndex()-1, LastIndex()], raft.ErrCompacted below and
// raft.ErrUnavailable above.
func (s *Store) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrStoreClosed
	}
	st := s.st
	switch {
	case i < st.offset:
		return 0, raft.ErrCompacted
	case i > st.last:
		return 0, raft.ErrUnavailable
	case i == st.offset:
		return st.offsetTerm, nil
	}
	e, err := readEntry(s.view, i)
	if err != nil {
		return 0, err
	}
	return e.Term, nil
}

// LastIndex implements raft.Storage.
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrStoreClosed
	}
	return s.st.last, nil
}

// FirstIndex implements raft.Storage.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrStoreClosed
	}
	return s.st.offset + 1, nil
}

// Snapshot implements raft.Storage: the latest snapshot recorded by
// CreateSnapshot or installed by Write, or the empty snapshot if none. Its
// Data is validated as a core snapshot before it is returned.
func (s *Store) Snapshot() (raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return raftpb.Snapshot{}, ErrStoreClosed
	}
	meta, err := readSnapMeta(s.view)
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	if meta.Index == 0 {
		return raftpb.Snapshot{}, nil
	}
	data, ok, err := get(s.view, keySnapData)
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	if !ok {
		return raftpb.Snapshot{}, fmt.Errorf("%w: snapshot %d has no %s row", ErrCorrupt, meta.Index, keySnapData)
	}
	if _, _, err := core.DecodeSnapshot(data); err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("%w: snapshot %d data: %w", ErrCorrupt, meta.Index, err)
	}
	return raftpb.Snapshot{Data: data, Metadata: meta}, nil
}

// AppliedIndex returns the persisted applied index.
func (s *Store) AppliedIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.applied
}

// Write persists w in ONE Pebble batch, committed with pebble.Sync (unless
// NoSync). Order inside: snapshot install, entries, hardstate, applied
// state. The applied index and the lock rows it produced are in the same
// batch, so a crash never applies an entry twice or loses one.
//
// Write checks, and refuses with ErrInvariant (writing nothing): a gap
// between the log and Entries, non-contiguous Entries, truncating an entry at
// or below the persisted commit index, a snapshot at or below the applied or
// latest snapshot index (also raft.ErrSnapOutOfDate) or lowering the last
// token, an Applied.Index that does not advance (an Applied at the current
// index that changes nothing is accepted as a no-op), a lock that does not
// validate or carries a token above Applied.LastToken, a key in both Put and
// Delete or twice in Put with different locks (Put/Delete must be the net
// change of the run), and a result where applied > commit or
// commit > last index.
func (s *Store) Write(w ReadyWrite) error {
	d, n, err := s.write(w)
	if err != nil {
		return err
	}
	if n >= 0 && s.onSync != nil {
		s.onSync(d, n)
	}
	return nil
}

// write does Write's work under writeMu. n is the number of entries carried,
// or -1 when nothing was committed.
func (s *Store) write(w ReadyWrite) (time.Duration, int, error) {
	hasSnap := !raft.IsEmptySnap(w.Snapshot)
	hasHS := !raft.IsEmptyHardState(w.HardState)
	if !hasSnap && !hasHS && len(w.Entries) == 0 && w.Applied == nil {
		return 0, -1, nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return 0, -1, ErrStoreClosed
	}
	st := s.st
	b := s.db.NewBatch()
	defer b.Close()
	if hasSnap {
		if err := stageSnapshot(b, &st, w.Snapshot); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: install snapshot %d: %w", w.Snapshot.Metadata.Index, err)
		}
	}
	if err := stageEntries(b, &st, w.Entries); err != nil {
		return 0, -1, fmt.Errorf("raftstore: write: append: %w", err)
	}
	if hasHS {
		if err := setMarshaled(b, keyHardState, &w.HardState); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: %w", err)
		}
		st.commit = w.HardState.Commit
	}
	if w.Applied != nil {
		if err := stageApplied(b, &st, w.Applied); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: apply %d: %w", w.Applied.Index, err)
		}
	}
	if st.applied > st.commit || st.commit > st.last {
		return 0, -1, fmt.Errorf("raftstore: write: %w: applied %d, commit %d, last index %d out of order",
			ErrInvariant, st.applied, st.commit, st.last)
	}
	wo := s.wo
	synced := wo.Sync
	if w.MaySkipSync && len(w.Entries) == 0 && !hasSnap {
		wo, synced = pebble.NoSync, false
	}
	d, err := s.commitWith(b, wo)
	if err != nil {
		return 0, -1, fmt.Errorf("raftstore: write: %w", err)
	}
	s.publish(st)
	if hasSnap {
		s.log.Info("installed snapshot", "index", w.Snapshot.Metadata.Index, "term", w.Snapshot.Metadata.Term,
			"last_token", st.lastToken)
	}
	if !synced && s.wo.Sync {
		return d, -1, nil // an allowed unsynced write: no fsync to report
	}
	return d, len(w.Entries), nil
}

// stageSnapshot adds the installation of snap to b.
func stageSnapshot(b *pebble.Batch, st *storeState, snap raftpb.Snapshot) error {
	meta := snap.Metadata
	if meta.Index <= st.snapIndex || meta.Index <= st.applied {
		return fmt.Errorf("%w: snapshot index %d, latest snapshot %d, applied %d: %w",
			ErrInvariant, meta.Index, st.snapIndex, st.applied, raft.ErrSnapOutOfDate)
	}
	ss, err := core.DecodeSnapshotState(snap.Data)
	if err != nil {
		return fmt.Errorf("%w: data: %w", ErrInvariant, err)
	}
	lastToken, locks := ss.LastToken, ss.Locks
	if err := b.Set(keyControl, core.EncodeControlState(ss.Control), nil); err != nil {
		return err
	}
	if lastToken < st.lastToken {
		return fmt.Errorf("%w: snapshot last token %d below persisted last token %d", ErrInvariant, lastToken, st.lastToken)
	}
	if err := b.DeleteRange(prefixLock, endLock, nil); err != nil {
		return err
	}
	for _, l := range locks {
		if err := b.Set(lockKey(l.Key), core.EncodeLockRecord(l), nil); err != nil {
			return err
		}
	}
	if err := b.DeleteRange(prefixLog, endLog, nil); err != nil {
		return err
	}
	if err := setMarshaled(b, logKey(meta.Index), &raftpb.Entry{Index: meta.Index, Term: meta.Term}); err != nil {
		return err
	}
	if err := setMarshaled(b, keySnapMeta, &meta); err != nil {
		return err
	}
	if err := b.Set(keySnapData, snap.Data, nil); err != nil {
		return err
	}
	if err := setMarshaled(b, keyConfState, &meta.ConfState); err != nil {
		return err
	}
	if err := b.Set(keyApplied, encodeUint64(meta.Index), nil); err != nil {
		return err
	}
	if err := b.Set(keyLastToken, encodeUint64(lastToken), nil); err != nil {
		return err
	}
	st.offset, st.offsetTerm, st.last = meta.Index, meta.Term, meta.Index
	st.applied, st.lastToken, st.snapIndex = meta.Index, lastToken, meta.Index
	return nil
}

// stageEntries adds an append to b with MemoryStorage.Append semantics.
func stageEntries(b *pebble.Batch, st *storeState, ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	for i := 1; i < len(ents); i++ {
		if ents[i].Index != ents[0].Index+uint64(i) {
			return fmt.Errorf("%w: entries not contiguous: index %d follows %d", ErrInvariant, ents[i].Index, ents[i-1].Index)
		}
	}
	first := st.offset + 1
	last := ents[0].Index + uint64(len(ents)) - 1
	if last < first {
		return nil // all compacted already
	}
	if ents[0].Index < first {
		ents = ents[first-ents[0].Index:]
	}
	switch at := ents[0].Index; {
	case at > st.last+1:
		return fmt.Errorf("%w: missing log entry [last: %d, append at: %d]", ErrInvariant, st.last, at)
	case at <= st.last:
		if at <= st.commit {
			return fmt.Errorf("%w: append at %d would truncate committed entries (commit %d)", ErrInvariant, at, st.commit)
		}
		if err := b.DeleteRange(logKey(at), endLog, nil); err != nil {
			return err
		}
	}
	for i := range ents {
		if err := setMarshaled(b, logKey(ents[i].Index), &ents[i]); err != nil {
			return err
		}
	}
	st.last = last
	return nil
}

// stageApplied adds an applied state to b.
func stageApplied(b *pebble.Batch, st *storeState, a *AppliedState) error {
	noop := len(a.Put) == 0 && len(a.Delete) == 0 && a.ConfState == nil && a.Control == nil && a.LastToken == st.lastToken
	switch {
	case a.Index == st.applied && noop:
		// Nothing new was applied, e.g. a snapshot installed by the same
		// Write with no committed entries after it.
		return nil
	case a.Index <= st.applied:
		return fmt.Errorf("%w: applied index %d does not advance past %d", ErrInvariant, a.Index, st.applied)
	case a.LastToken < st.lastToken:
		return fmt.Errorf("%w: last token %d below persisted %d", ErrInvariant, a.LastToken, st.lastToken)
	}
	// A key may repeat only with the same effect; Put and Delete of one key
	// cannot be ordered and would silently lose or resurrect a lock.
	puts := make(map[string][]byte, len(a.Put))
	for _, l := range a.Put {
		rec := core.EncodeLockRecord(l)
		if _, err := core.DecodeLockRecord(rec); err != nil {
			return fmt.Errorf("%w: lock %q: %w", ErrInvariant, l.Key, err)
		}
		if l.Token > a.LastToken {
			return fmt.Errorf("%w: lock %q token %d above last token %d", ErrInvariant, l.Key, l.Token, a.LastToken)
		}
		if prev, dup := puts[l.Key]; dup {
			if !bytes.Equal(prev, rec) {
				return fmt.Errorf("%w: key %q appears twice in Put with different locks; Put/Delete must be the net change",
					ErrInvariant, l.Key)
			}
			continue
		}
		puts[l.Key] = rec
		if err := b.Set(lockKey(l.Key), rec, nil); err != nil {
			return err
		}
	}
	for _, k := range a.Delete {
		if err := core.ValidateKey(k); err != nil {
			return fmt.Errorf("%w: delete %q: %w", ErrInvariant, k, err)
		}
		if _, dup := puts[k]; dup {
			return fmt.Errorf("%w: key %q is in both Put and Delete; Put/Delete must be the net change", ErrInvariant, k)
		}
		if err := b.Delete(lockKey(k), nil); err != nil {
			return err
		}
	}
	if a.ConfState != nil {
		if err := setMarshaled(b, keyConfState, a.ConfState); err != nil {
			return err
		}
	}
	if a.Control != nil {
		if _, err := core.DecodeControlState(a.Control); err != nil {
			return fmt.Errorf("%w: control state: %w", ErrInvariant, err)
		}
		if err := b.Set(keyControl, a.Control, nil); err != nil {
			return err
		}
	}
	if err := b.Set(keyApplied, encodeUint64(a.Index), nil); err != nil {
		return err
	}
	if err := b.Set(keyLastToken, encodeUint64(a.LastToken), nil); err != nil {
		return err
	}
	st.applied, st.lastToken = a.Index, a.LastToken
	return nil
}

// LoadMachine reads back the applied state on restart: the applied index,
// the lock table with its token counter, and the conf state as of that
// index. Every lock row is validated.
func (s *Store) LoadMachine() (applied uint64, m *core.Machine, cs raftpb.ConfState, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, nil, raftpb.ConfState{}, ErrStoreClosed
	}
	fail := func(err error) (uint64, *core.Machine, raftpb.ConfState, error) {
		return 0, nil, raftpb.ConfState{}, fmt.Errorf("raftstore: load machine: %w", err)
	}
	if applied, err = readUint64(s.view, keyApplied, "applied index"); err != nil {
		return fail(err)
	}
	lastToken, err := readUint64(s.view, keyLastToken, "last token")
	if err != nil {
		return fail(err)
	}
	if cs, err = readConfState(s.view); err != nil {
		return fail(err)
	}
	it, err := s.view.NewIter(&pebble.IterOptions{LowerBound: prefixLock, UpperBound: endLock})
	if err != nil {
		return fail(err)
	}
	var locks []core.Lock
	tokens := make(map[uint64]string)
	for valid := it.First(); valid; valid = it.Next() {
		l, err := iterLock(it, lastToken)
		if err == nil {
			if other, dup := tokens[l.Token]; dup {
				err = fmt.Errorf("%w: token %d held by both %q and %q", ErrCorrupt, l.Token, other, l.Key)
			}
		}
		if err != nil {
			_ = it.Close()
			return fail(err)
		}
		tokens[l.Token] = l.Key
		locks = append(locks, l)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fail(err)
	}
	m = core.NewMachine()
	m.Load(lastToken, locks)
	switch rec, closer, err := s.view.Get(keyControl); {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fail(fmt.Errorf("read control state: %w", err))
	default:
		lerr := m.LoadControl(rec)
		_ = closer.Close()
		if lerr != nil {
			return fail(fmt.Errorf("%w: control state: %w", ErrCorrupt, lerr))
		}
	}
	return applied, m, cs, nil
}

// iterLock decodes and validates the lock row under it.
func iterLock(it *pebble.Iterator, lastToken uint64) (core.Lock, error) {
	key := string(it.Key()[len(prefixLock):])
	v, err := it.ValueAndErr()
	if err != nil {
		return core.Lock{}, fmt.Errorf("read lock row %q: %w", key, err)
	}
	l, err := core.DecodeLockRecord(v)
	if err != nil {
		return core.Lock{}, fmt.Errorf("%w: lock row %q: %w", ErrCorrupt, key, err)
	}
	if l.Key != key {
		return core.Lock{}, fmt.Errorf("%w: lock row %q holds key %q", ErrCorrupt, key, l.Key)
	}
	if l.Token > lastToken {
		return core.Lock{}, fmt.Errorf("%w: lock row %q token %d above last token %d", ErrCorrupt, key, l.Token, lastToken)
	}
	return l, nil
}

// CreateSnapshot durably records a raft snapshot at index with the given
// conf state and data: core.Machine.Snapshot() bytes taken at exactly that
// applied index. index must be <= AppliedIndex(); an index at or below the
// latest snapshot gives raft.ErrSnapOutOfDate, like
// MemoryStorage.CreateSnapshot. The data must decode as a core snapshot.
// The log is not compacted; call Compact for that.
func (s *Store) CreateSnapshot(index uint64, cs raftpb.ConfState, data []byte) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	st := s.st
	if index <= st.snapIndex {
		return raft.ErrSnapOutOfDate
	}
	if index > st.applied {
		return fmt.Errorf("raftstore: create snapshot: %w: index %d above applied index %d", ErrInvariant, index, st.applied)
	}
	term := st.offsetTerm
	if index != st.offset {
		e, err := readEntry(s.view, index)
		if err != nil {
			return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
		}
		term = e.Term
	}
	lastToken, _, err := core.DecodeSnapshot(data)
	if err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w: data: %w", index, ErrInvariant, err)
	}
	if index == st.applied && lastToken != st.lastToken {
		return fmt.Errorf("raftstore: create snapshot %d: %w: data last token %d, applied last token %d",
			index, ErrInvariant, lastToken, st.lastToken)
	}
	b := s.db.NewBatch()
	defer b.Close()
	meta := raftpb.SnapshotMetadata{ConfState: cs, Index: index, Term: term}
	if err := setMarshaled(b, keySnapMeta, &meta); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	if err := b.Set(keySnapData, data, nil); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	if _, err := s.commit(b); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	st.snapIndex = index
	s.publish(st)
	s.log.Debug("created snapshot", "index", index, "term", term, "bytes", len(data))
	return nil
}

// Compact discards the log entries before compactIndex, with exactly the
// semantics of raft.MemoryStorage.Compact: entry compactIndex becomes the
// dummy entry (only its index and term are kept), so afterwards
// FirstIndex() == compactIndex+1, Term(compactIndex) still answers and
// Entries(lo, ...) with lo <= compactIndex gives raft.ErrCompacted.
// compactIndex <= FirstIndex()-1 gives raft.ErrCompacted, as in
// MemoryStorage.
//
// Unlike MemoryStorage, which trusts its caller, compactIndex must also be
// <= AppliedIndex() and <= the latest snapshot's index (otherwise a follower
// that needs entries below FirstIndex would be sent a snapshot that does not
// reach FirstIndex-1); a violation returns ErrInvariant. So: CreateSnapshot(i)
// first, then Compact(j) for any j <= i.
func (s *Store) Compact(compactIndex uint64) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	st := s.st
	switch {
	case compactIndex <= st.offset:
		return raft.ErrCompacted
	case compactIndex > st.last:
		return fmt.Errorf("raftstore: %w: compact %d is out of bound last index %d", ErrInvariant, compactIndex, st.last)
	case compactIndex > st.applied:
		return fmt.Errorf("raftstore: %w: compact %d is above applied index %d", ErrInvariant, compactIndex, st.applied)
	case compactIndex > st.snapIndex:
		return fmt.Errorf("raftstore: %w: compact %d is beyond the latest snapshot %d; create a snapshot first",
			ErrInvariant, compactIndex, st.snapIndex)
	}
	e, err := readEntry(s.view, compactIndex)
	if err != nil {
		return fmt.Errorf("raftstore: compact %d: %w", compactIndex, err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange(logKey(st.offset), logKey(compactIndex), nil); err != nil {
		return fmt.Errorf("raftstore: compact %d: %w", compactIndex, err)
	}
	if err := setMarshaled(b, logKey(compactIndex), &raftpb.Entry{Index: compactIndex, Term: e.Term}); err != nil {
		return fmt.Errorf("raftstore: compact %d: %w", compactIndex, err)
	}
	if _, err := s.commit(b); err != nil {
		return fmt.Errorf("raftstore: compact %d: %w", compactIndex, err)
	}
	st.offset, st.offsetTerm = compactIndex, e.Term
	s.publish(st)
	s.log.Debug("compacted log", "first_index", compactIndex+1, "last_index", st.last)
	return nil
}

// commit commits b with the store's write options and times it.
func (s *Store) commit(b *pebble.Batch) (time.Duration, error) {
	return s.commitWith(b, s.wo)
}

func (s *Store) commitWith(b *pebble.Batch, wo *pebble.WriteOptions) (time.Duration, error) {
	start := time.Now()
	if err := b.Commit(wo); err != nil {
		return 0, fmt.Errorf("commit batch: %w", err)
	}
	return time.Since(start), nil
}

// publish makes st (already durable) visible to readers together with a
// fresh Pebble snapshot. The caller holds writeMu.
func (s *Store) publish(st storeState) {
	s.mu.Lock()
	old := s.view
	s.st = st
	s.view = s.db.NewSnapshot()
	s.mu.Unlock()
	// Readers use the view only under mu.RLock, so nobody holds old now.
	if err := old.Close(); err != nil {
		s.log.Error("closing pebble snapshot", "err", err)
	}
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

// pebbleLogger routes Pebble's logs to slog. Pebble expects Fatalf not to
// return; it panics (after logging) instead of exiting the process.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) { p.l.Info(fmt.Sprintf(format, args...)) }

func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Error(fmt.Sprintf(format, args...)) }

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "fatal", true)
	panic("raftstore: pebble: " + msg)
}
