package raftstore

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
	"go.etcd.io/raft/v3/raftpb"
)

// StateChange is the state rows that applying a run of committed entries
// changed, written in the same batch as the new applied index. Put and
// Delete are the net change of the whole run: a key granted and released in
// the same run must not appear in both (Write rejects that, since the two
// lists cannot say which came last). Build them after applying, from the
// touched keys: held now => Put, not held => Delete.
type StateChange struct {
	Index     uint64            // new applied index (highest entry applied)
	LastToken uint64            // core.Machine.LastToken() after applying
	Put       []core.Lock       // locks now held (created) — write row
	Delete    []string          // keys no longer held — delete row
	ConfState *raftpb.ConfState // non-nil when a conf change was applied
	// Control is core.Machine.ControlSnapshot() after applying, non-nil
	// when a control command was applied.
	Control []byte
	// Requests is the change of the request rows (requests.go), non-nil
	// when the request state changed.
	Requests *RequestChange
	// Sessions is the change of the session rows (sessions.go), non-nil
	// when a session or a delayed key changed.
	Sessions *SessionChange
	// PutHolders and DeleteHolders are the net change of the holder rows
	// (holders.go): every multi-holder key touched that is one now (its
	// whole row) and every one touched that is not.
	PutHolders    []core.KeyHolders
	DeleteHolders []string
}

// stageState adds a state change and its applied index to b. The caller
// built sc from the machine it just applied to, so its locks and control
// record are written as they are, not decoded again; only invariants that
// relate sc to the persisted state (or its own lists to each other) are
// checked.
func stageState(b *pebble.Batch, st *storeState, sc *StateChange) error {
	noop := len(sc.Put) == 0 && len(sc.Delete) == 0 && sc.ConfState == nil && sc.Control == nil && sc.Requests == nil && sc.Sessions == nil &&
		len(sc.PutHolders) == 0 && len(sc.DeleteHolders) == 0 && sc.LastToken == st.lastToken
	switch {
	case sc.Index == st.applied && noop:
		// Nothing new was applied, e.g. a snapshot installed by the same
		// Write with no committed entries after it.
		return nil
	case sc.Index <= st.applied:
		return fmt.Errorf("%w: applied index %d does not advance past %d", ErrInvariant, sc.Index, st.applied)
	case sc.LastToken < st.lastToken:
		return fmt.Errorf("%w: last token %d below persisted %d", ErrInvariant, sc.LastToken, st.lastToken)
	}
	if err := stageLocks(b, sc); err != nil {
		return err
	}
	if err := stageHolders(b, sc); err != nil {
		return err
	}
	if sc.ConfState != nil {
		if err := setMarshaled(b, keyConfState, sc.ConfState); err != nil {
			return err
		}
	}
	if sc.Control != nil {
		if err := b.Set(keyControl, sc.Control, nil); err != nil {
			return err
		}
	}
	if sc.Requests != nil {
		if err := stageRequests(b, st, sc.Requests); err != nil {
			return err
		}
	}
	if sc.Sessions != nil {
		if err := stageSessions(b, st, sc.Sessions); err != nil {
			return err
		}
	}
	if err := b.Set(keyApplied, encodeUint64(sc.Index), nil); err != nil {
		return err
	}
	if err := b.Set(keyLastToken, encodeUint64(sc.LastToken), nil); err != nil {
		return err
	}
	st.applied, st.lastToken = sc.Index, sc.LastToken
	return nil
}

// stageLocks adds the lock rows of sc.Put and the deletions of sc.Delete
// to b. A key may repeat only with the same effect; Put and Delete of one
// key cannot be ordered and would silently lose or resurrect a lock.
func stageLocks(b *pebble.Batch, sc *StateChange) error {
	puts := make(map[string]core.Lock, len(sc.Put))
	for _, l := range sc.Put {
		if err := checkLock(l); err != nil {
			return fmt.Errorf("%w: lock %q: %w", ErrInvariant, l.Key, err)
		}
		if l.Token > sc.LastToken {
			return fmt.Errorf("%w: lock %q token %d above last token %d", ErrInvariant, l.Key, l.Token, sc.LastToken)
		}
		if prev, dup := puts[l.Key]; dup {
			if prev != l {
				return fmt.Errorf("%w: key %q appears twice in Put with different locks; Put/Delete must be the net change",
					ErrInvariant, l.Key)
			}
			continue
		}
		puts[l.Key] = l
		if err := b.Set(lockKey(l.Key), core.EncodeLockRecord(l), nil); err != nil {
			return err
		}
	}
	for _, k := range sc.Delete {
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
	return nil
}

// checkLock checks the fields of a lock to be written, so that a row
// LoadMachine would refuse as corrupt is never written in the first place.
func checkLock(l core.Lock) error { return core.ValidateLock(l) }

// AppliedIndex returns the persisted applied index.
func (s *Store) AppliedIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.st.applied
}

// LoadMachine reads back the applied state on restart: the applied index,
// the lock table with its token counter, the control state, the request
// records, the sessions and delayed keys, the multi-holder keys, and the conf state as of that
// index. Every row is validated, and the request records and sessions
// against the rest.
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
	// Each row goes from its bytes straight into the machine's table
	// (core.Loader: no Lock, string or map entry per lock on the way; the
	// checks are DecodeLockRecord's, plus the row's key, the last token and
	// tokens held twice).
	it, err := s.view.NewIter(&pebble.IterOptions{LowerBound: prefixLock, UpperBound: endLock})
	if err != nil {
		return fail(err)
	}
	ld := core.NewLoader(lastToken, s.lockCountHint())
	for valid := it.First(); valid; valid = it.Next() {
		key := it.Key()[len(prefixLock):]
		v, err := it.ValueAndErr()
		if err != nil {
			err = fmt.Errorf("read lock row %q: %w", key, err)
		} else if err = ld.AddRecord(key, v); err != nil {
			err = fmt.Errorf("%w: lock row %q: %w", ErrCorrupt, key, err)
		}
		if err != nil {
			_ = it.Close()
			return fail(err)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fail(err)
	}
	if m, err = ld.Machine(); err != nil {
		return fail(fmt.Errorf("%w: lock rows: %w", ErrCorrupt, err))
	}
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
	if err := loadRequests(s.view, m); err != nil {
		return fail(err)
	}
	if err := loadSessions(s.view, m); err != nil {
		return fail(err)
	}
	if err := loadHolders(s.view, m); err != nil {
		return fail(err)
	}
	return applied, m, cs, nil
}

// lockCountHint is about how many lock rows the store holds, for sizing
// the table it loads into: the count its latest snapshot file declares
// (the rows differ from it only by the entries applied since), or 0.
// The caller holds mu.
func (s *Store) lockCountHint() int {
	if s.st.snapIndex == 0 {
		return 0
	}
	f, err := s.snaps.open(s.st.snapTerm, s.st.snapIndex)
	if err != nil {
		return 0 // a format 1 store (r/snapdata): load without a hint
	}
	defer f.Close()
	head := make([]byte, 32)
	n, _ := io.ReadFull(f, head)
	count, _ := core.SnapshotLockCount(head[:n])
	// Entries applied since may have added locks: a little room avoids
	// one doubling of the index.
	return count + count/16
}
