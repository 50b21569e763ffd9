package raftstore

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// ReadyWrite is everything one raft.Ready asks to persist.
type ReadyWrite struct {
	// HardState to persist; raft.IsEmptyHardState => unchanged.
	HardState raftpb.HardState
	// Entries to append; stored entries with index >= Entries[0].Index are
	// dropped first (raft log truncation). Entries at or below the dummy
	// entry are ignored, as in MemoryStorage.Append.
	Entries []raftpb.Entry
	// Snapshot to install; raft.IsEmptySnap => none. Its Data is a core
	// snapshot. Installing replaces all lock rows, the control row, the
	// request rows, the session rows, the last token, the applied index (= Metadata.Index)
	// and the conf state, and discards the whole log like
	// MemoryStorage.ApplySnapshot (the dummy entry becomes
	// (Metadata.Index, Metadata.Term)); Entries of the same ReadyWrite are
	// then appended after it.
	Snapshot raftpb.Snapshot
	// Rows, if not nil, are Snapshot's lock rows already being staged
	// (StageSnapshotRows); nil makes Write stage them.
	Rows *SnapshotRows
	// State is the change of the state rows with the new applied index;
	// nil => nothing applied.
	State *StateChange
	// MaySkipSync says the write carries nothing raft needs on disk before
	// messages go out (no entries, no term or vote change, no snapshot):
	// typically the state change of already-durable log entries. Such a
	// write is committed without fsync; Pebble's WAL is ordered, so a
	// crash loses it only together with every later write, and the
	// entries are re-applied from the durable log on restart. It is
	// ignored (the write syncs) when Entries or Snapshot are non-empty.
	MaySkipSync bool
}

// Write persists w in ONE Pebble batch, committed with pebble.Sync (unless
// NoSync). Order inside: snapshot install, entries, hardstate, state
// change. The applied index and the lock rows it produced are in the same
// batch, so a crash never applies an entry twice or loses one.
//
// Write checks, and refuses with ErrInvariant (writing nothing): a gap
// between the log and Entries, non-contiguous Entries, truncating an entry at
// or below the persisted commit index, a snapshot at or below the applied or
// latest snapshot index (also raft.ErrSnapOutOfDate) or lowering the last
// token, a State.Index that does not advance (a State at the current
// applied index that changes nothing is accepted as a no-op), a lock that
// does not validate or carries a token above State.LastToken, a key in both Put and
// Delete or twice in Put with different locks (Put/Delete must be the net
// change of the run), and a result where applied > commit or
// commit > last index.
func (s *Store) Write(w ReadyWrite) error {
	d, n, err := s.write(w)
	if err != nil {
		return err
	}
	if n >= 0 {
		s.metrics.observeFsync(d, n)
	}
	return nil
}

// write does Write's work under writeMu. n is the number of entries carried,
// or -1 when nothing was committed.
func (s *Store) write(w ReadyWrite) (time.Duration, int, error) {
	hasSnap := !raft.IsEmptySnap(w.Snapshot)
	hasHS := !raft.IsEmptyHardState(w.HardState)
	if !hasSnap && !hasHS && len(w.Entries) == 0 && w.State == nil {
		return 0, -1, nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed {
		return 0, -1, ErrStoreClosed
	}
	st := s.st
	rows := w.Rows
	if hasSnap && rows == nil {
		rows = s.StageSnapshotRows(w.Snapshot.Data)
		defer rows.Discard()
	}
	var b *pebble.Batch
	if hasSnap {
		// The batch with the lock rows; the rest of the install and of
		// this Ready goes into it, so all of it commits at once.
		var err error
		if b, err = rows.take(); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: install snapshot %d: %w: data: %w", w.Snapshot.Metadata.Index, ErrInvariant, err)
		}
	} else {
		b = s.db.NewBatch()
	}
	defer b.Close()
	if hasSnap {
		if err := stageSnapshot(b, &st, w.Snapshot, &rows.state); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: install snapshot %d: %w", w.Snapshot.Metadata.Index, err)
		}
		// The data goes to its file first; the batch naming it commits
		// below (snapfile.go).
		meta := w.Snapshot.Metadata
		if err := s.snaps.write(meta.Term, meta.Index, w.Snapshot.Data); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: install snapshot %d: %w", meta.Index, err)
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
	if w.State != nil {
		if err := stageState(b, &st, w.State); err != nil {
			return 0, -1, fmt.Errorf("raftstore: write: apply %d: %w", w.State.Index, err)
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
		if err := s.snaps.removeExcept(st.snapTerm, st.snapIndex); err != nil {
			s.log.Warn("removing old snapshot files", "err", err)
		}
		s.log.Debug("installed snapshot", "index", w.Snapshot.Metadata.Index, "term", w.Snapshot.Metadata.Term,
			"last_token", st.lastToken, "commit_took", d)
	}
	if !synced && s.wo.Sync {
		return d, -1, nil // an allowed unsynced write: no fsync to report
	}
	return d, len(w.Entries), nil
}

// stageSnapshot adds the installation of snap to b (but for its data
// file, which Write writes before committing b, and the lock rows, which
// b holds already: StageSnapshotRows). ss is the snapshot's state without
// its locks.
func stageSnapshot(b *pebble.Batch, st *storeState, snap raftpb.Snapshot, ss *core.SnapshotState) error {
	meta := snap.Metadata
	if meta.Index <= st.snapIndex || meta.Index <= st.applied {
		return fmt.Errorf("%w: snapshot index %d, latest snapshot %d, applied %d: %w",
			ErrInvariant, meta.Index, st.snapIndex, st.applied, raft.ErrSnapOutOfDate)
	}
	lastToken := ss.LastToken
	if err := b.Set(keyControl, core.EncodeControlState(ss.Control), nil); err != nil {
		return err
	}
	if err := stageSnapshotRequests(b, st, &ss.Requests); err != nil {
		return err
	}
	if err := stageSnapshotSessions(b, st, &ss.Sessions); err != nil {
		return err
	}
	if err := stageSnapshotHolders(b, ss.Holders); err != nil {
		return err
	}
	if lastToken < st.lastToken {
		return fmt.Errorf("%w: snapshot last token %d below persisted last token %d", ErrInvariant, lastToken, st.lastToken)
	}
	if err := b.DeleteRange(prefixLog, endLog, nil); err != nil {
		return err
	}
	if err := setMarshaled(b, logKey(meta.Index), &raftpb.Entry{Index: meta.Index, Term: meta.Term}); err != nil {
		return err
	}
	if err := stageSnapMeta(b, &meta); err != nil {
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
	st.offset, st.offsetTerm, st.last, st.tail = meta.Index, meta.Term, meta.Index, logTail{}
	st.applied, st.lastToken, st.snapIndex, st.snapTerm = meta.Index, lastToken, meta.Index, meta.Term
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
	st.tail = st.tail.appended(ents)
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

// SnapshotRows are a received snapshot's lock rows, staged into a batch of
// their own by a goroutine (StageSnapshotRows) while the raft loop
// restores its machine from the same bytes: the two walks of a 1M-lock
// snapshot ran one after the other on the loop of a catching-up follower
// (0.5 s and 0.76 s in TestMillionLocks). Nothing reaches the store before
// Write commits that batch, with the rest of the install and the applied
// index, at once, exactly as when Write staged the rows itself.
type SnapshotRows struct {
	done  chan struct{}
	b     *pebble.Batch
	state core.SnapshotState // the snapshot without its locks
	err   error
}

// StageSnapshotRows starts staging the lock rows of snapshot data (a
// range deletion of the old ones, then one row per lock, validated as
// core.SnapshotRecords does). Pass the result to Write in ReadyWrite.Rows,
// and Discard it in any case once done with it.
func (s *Store) StageSnapshotRows(data []byte) *SnapshotRows {
	// One row per lock, each about 1.6 times its bytes in the snapshot:
	// sized once, not regrown (and copied) a dozen times.
	r := &SnapshotRows{done: make(chan struct{}), b: s.db.NewBatchWithSize(2 * len(data))}
	go func() {
		defer close(r.done)
		if r.err = r.b.DeleteRange(prefixLock, endLock, nil); r.err != nil {
			return
		}
		var rowKey []byte
		r.state, _, r.err = core.SnapshotRecords(data, func(key, record []byte) error {
			rowKey = append(append(rowKey[:0], prefixLock...), key...)
			return r.b.Set(rowKey, record, nil)
		})
	}()
	return r
}

// take waits for the rows and hands their batch over (the caller closes
// it), or returns the error that stopped them.
func (r *SnapshotRows) take() (*pebble.Batch, error) {
	<-r.done
	if r.err != nil {
		return nil, r.err
	}
	b := r.b
	r.b = nil
	return b, nil
}

// Discard waits for the rows and drops them unless Write took them.
func (r *SnapshotRows) Discard() {
	<-r.done
	if r.b != nil {
		_ = r.b.Close()
		r.b = nil
	}
}
