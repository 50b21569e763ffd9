package raftstore

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ticketd/ticketd/core"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var _ raft.Storage = (*Store)(nil)

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
// raft.ErrUnavailable when the log holds only the dummy entry. The newest
// entries come from memory (tail.go): the entries' Data may be shared and
// must not be modified.
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
	if lo == hi {
		return []raftpb.Entry{}, nil
	}
	if st.tail.covers(lo) && st.tail.covers(hi-1) {
		return st.tail.slice(lo, hi, maxSize), nil
	}
	ents := make([]raftpb.Entry, 0, min(hi-lo, 128))
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
	case st.tail.covers(i):
		return st.tail.ents[i-st.tail.first()].Term, nil
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
// Data is checked (magic, version, checksum) before it is returned; the
// locks are not decoded again: raft calls this from its own goroutine when
// a follower needs a snapshot, and the data was validated when it was
// written. The file is read without holding the store's lock, so a large
// snapshot does not hold up the raft loop's writes.
func (s *Store) Snapshot() (raftpb.Snapshot, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return raftpb.Snapshot{}, ErrStoreClosed
	}
	meta, err := readSnapMeta(s.view)
	if err != nil || meta.Index == 0 {
		s.mu.RUnlock()
		return raftpb.Snapshot{}, err
	}
	legacy, ok, err := get(s.view, keySnapData)
	var file vfs.File
	if err == nil && !ok {
		// Opened under the lock: a newer snapshot removes this file only
		// after it is published, and the open file stays readable.
		file, err = s.snaps.open(meta.Term, meta.Index)
	}
	s.mu.RUnlock()
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	data := legacy
	if file != nil {
		if data, err = readAll(file); err != nil {
			return raftpb.Snapshot{}, err
		}
	}
	if _, err := core.CheckSnapshot(data); err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("%w: snapshot %d data: %w", ErrCorrupt, meta.Index, err)
	}
	return raftpb.Snapshot{Data: data, Metadata: meta}, nil
}

// SnapshotIndex is the index of the latest snapshot (0: none), without
// reading its data.
func (s *Store) SnapshotIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.snapIndex
}

// CreateSnapshot durably records a raft snapshot at index with the given
// conf state and data: core snapshot bytes of the applied state at exactly
// that index. index must be <= AppliedIndex(); an index at or below the
// latest snapshot gives raft.ErrSnapOutOfDate, like
// MemoryStorage.CreateSnapshot. The data must be a core snapshot (checked
// by its checksum and header; its last token must match the applied one
// when index is the applied index). The log is not compacted; call
// Compact for that.
//
// It may run concurrently with Write (the node builds snapshots off its
// raft loop): the data goes to its own file without holding the writers'
// lock, and only the small metadata batch is committed under it, after
// checking again that no newer snapshot (a received one) was installed
// meanwhile.
func (s *Store) CreateSnapshot(index uint64, cs raftpb.ConfState, data []byte) error {
	info, err := core.CheckSnapshot(data)
	if err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w: data: %w", index, ErrInvariant, err)
	}
	return s.createSnapshotWith(index, cs, info.LastToken, writeBytes(data))
}

// createSnapshotWith is CreateSnapshot for a snapshot whose data fill
// writes to its file as it encodes them (buildSnapshot), with lastToken
// the token counter they carry. Its checks come first, before the
// encoding's work; the one that matters after it (a received snapshot
// installed meanwhile) is made again when the metadata is committed.
func (s *Store) createSnapshotWith(index uint64, cs raftpb.ConfState, lastToken uint64, fill func(w io.Writer) error) error {
	term, err := s.checkNewSnapshot(index, lastToken)
	if err != nil {
		return err
	}
	if err := s.snaps.writeWith(term, index, fill); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	st := s.st
	if index <= st.snapIndex {
		// A received snapshot was installed while ours was written.
		_ = s.snaps.removeExcept(st.snapTerm, st.snapIndex)
		return raft.ErrSnapOutOfDate
	}
	b := s.db.NewBatch()
	defer b.Close()
	meta := raftpb.SnapshotMetadata{ConfState: cs, Index: index, Term: term}
	if err := stageSnapMeta(b, &meta); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	if _, err := s.commit(b); err != nil {
		return fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	st.snapIndex, st.snapTerm = index, term
	s.publish(st)
	if err := s.snaps.removeExcept(term, index); err != nil {
		s.log.Warn("removing old snapshot files", "err", err)
	}
	s.log.Debug("created snapshot", "index", index, "term", term)
	return nil
}

// checkNewSnapshot checks that a snapshot at index may be created now and
// returns the term of its entry.
func (s *Store) checkNewSnapshot(index, lastToken uint64) (uint64, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return 0, ErrStoreClosed
	}
	st := s.st
	if index <= st.snapIndex {
		return 0, raft.ErrSnapOutOfDate
	}
	if index > st.applied {
		return 0, fmt.Errorf("raftstore: create snapshot: %w: index %d above applied index %d", ErrInvariant, index, st.applied)
	}
	if index == st.applied && lastToken != st.lastToken {
		return 0, fmt.Errorf("raftstore: create snapshot %d: %w: data last token %d, applied last token %d",
			index, ErrInvariant, lastToken, st.lastToken)
	}
	if index == st.offset {
		return st.offsetTerm, nil
	}
	e, err := readEntry(s.view, index)
	if err != nil {
		return 0, fmt.Errorf("raftstore: create snapshot %d: %w", index, err)
	}
	return e.Term, nil
}

// stageSnapMeta adds the metadata of a new snapshot (whose file is already
// durable) to b, and moves a format 1 store to format 2.
func stageSnapMeta(b *pebble.Batch, meta *raftpb.SnapshotMetadata) error {
	if err := setMarshaled(b, keySnapMeta, meta); err != nil {
		return err
	}
	if err := b.Delete(keySnapData, nil); err != nil {
		return err
	}
	return b.Set(keyVersion, encodeUint64(storeFormatVersion), nil)
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
	st.tail = st.tail.compacted(compactIndex)
	s.publish(st)
	s.log.Debug("compacted log", "first_index", compactIndex+1, "last_index", st.last)
	return nil
}
