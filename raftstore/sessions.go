package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
)

// The session rows: the state machine's sessions and delayed keys
// (core/sessions.go, cluster version 4). One header row holds the two
// counters and how many session and delay rows there are; each open
// session has a row keyed by its ID and each delayed key a row keyed by
// the key, so that applying a run of commands writes only the sessions and
// delays it changed, in the same batch as the applied index. Which locks a
// session holds is in the lock rows (core.Lock.SessionID).

// SessionChange is the session state after a run of commands, for the rows
// that changed: the header, the sessions and delayed keys now present that
// the run touched (Put), and those it touched that are gone (Delete).
type SessionChange struct {
	LastSessionID, LastDelaySeq uint64
	Sessions, Delays            int // how many rows of each there are after the run
	Put                         []core.Session
	Delete                      []uint64
	PutDelays                   []core.Delay
	DeleteDelays                []string
}

// sessionMark is the session rows' header.
type sessionMark struct{ lastID, lastSeq, sessions, delays uint64 }

func markSessions(m *core.Machine) sessionMark {
	return sessionMark{lastID: m.LastSessionID(), lastSeq: m.LastDelaySeq(), sessions: uint64(m.SessionCount()), delays: uint64(m.DelayCount())}
}

// touchedSessions are the session and delay rows a run of commands
// touched, in first-touch order.
type touchedSessions struct {
	ids      []uint64
	seenIDs  map[uint64]struct{}
	keys     []string
	seenKeys map[string]struct{}
}

func (t *touchedSessions) addID(id uint64) {
	if _, ok := t.seenIDs[id]; ok {
		return
	}
	if t.seenIDs == nil {
		t.seenIDs = make(map[uint64]struct{})
	}
	t.seenIDs[id] = struct{}{}
	t.ids = append(t.ids, id)
}

func (t *touchedSessions) addDelay(key string) {
	if _, ok := t.seenKeys[key]; ok {
		return
	}
	if t.seenKeys == nil {
		t.seenKeys = make(map[string]struct{})
	}
	t.seenKeys[key] = struct{}{}
	t.keys = append(t.keys, key)
}

// sessionChange is the change of the session rows from before to m's
// state, or nil when there is none.
func sessionChange(m *core.Machine, before sessionMark, t *touchedSessions) *SessionChange {
	now := markSessions(m)
	if now == before && len(t.ids) == 0 && len(t.keys) == 0 {
		return nil
	}
	sc := &SessionChange{LastSessionID: now.lastID, LastDelaySeq: now.lastSeq, Sessions: int(now.sessions), Delays: int(now.delays)}
	for _, id := range t.ids {
		if x, ok := m.Session(id); ok {
			sc.Put = append(sc.Put, x)
		} else {
			sc.Delete = append(sc.Delete, id)
		}
	}
	for _, k := range t.keys {
		if d, ok := m.Delay(k); ok {
			sc.PutDelays = append(sc.PutDelays, d)
		} else {
			sc.DeleteDelays = append(sc.DeleteDelays, k)
		}
	}
	return sc
}

// sessionKey is the key of the row of session id.
func sessionKey(id uint64) []byte {
	k := make([]byte, len(prefixSession)+8)
	copy(k, prefixSession)
	binary.BigEndian.PutUint64(k[len(prefixSession):], id)
	return k
}

// delayKey is the key of the row of the delayed key.
func delayKey(key string) []byte {
	k := make([]byte, 0, len(prefixDelay)+len(key))
	return append(append(k, prefixDelay...), key...)
}

func encodeSessionsHeader(m sessionMark) []byte {
	b := make([]byte, 0, 32)
	b = binary.BigEndian.AppendUint64(b, m.lastID)
	b = binary.BigEndian.AppendUint64(b, m.lastSeq)
	b = binary.BigEndian.AppendUint64(b, m.sessions)
	return binary.BigEndian.AppendUint64(b, m.delays)
}

// readSessionsHeader reads the header row; a store written before
// sessions (or that never had one) has none, which is the zero state.
func readSessionsHeader(r reader) (sessionMark, error) {
	v, ok, err := get(r, keySessions)
	if err != nil || !ok {
		return sessionMark{}, err
	}
	if len(v) != 32 {
		return sessionMark{}, fmt.Errorf("%w: %s is %d bytes, want 32", ErrCorrupt, keySessions, len(v))
	}
	m := sessionMark{lastID: binary.BigEndian.Uint64(v), lastSeq: binary.BigEndian.Uint64(v[8:]),
		sessions: binary.BigEndian.Uint64(v[16:]), delays: binary.BigEndian.Uint64(v[24:])}
	if m.sessions > core.MaxSessions || m.delays > core.MaxDelayedKeys {
		return sessionMark{}, fmt.Errorf("%w: %s counts %d sessions and %d delayed keys", ErrCorrupt, keySessions, m.sessions, m.delays)
	}
	return m, nil
}

// stageSessions adds the session rows of sc to b: the header, the rows of
// the sessions and delays put, the deletion of those gone. It checks sc
// against the persisted state st (the counters never move backwards, the
// counts stay within the bounds) and each row it writes the way
// LoadMachine will read it, so that no row it would refuse is written.
func stageSessions(b *pebble.Batch, st *storeState, sc *SessionChange) error {
	was := st.sessions
	switch {
	case sc.LastSessionID < was.lastID || sc.LastDelaySeq < was.lastSeq:
		return fmt.Errorf("%w: session counters %d, %d below persisted %d, %d", ErrInvariant, sc.LastSessionID, sc.LastDelaySeq, was.lastID, was.lastSeq)
	case sc.Sessions < 0 || sc.Sessions > core.MaxSessions || sc.Delays < 0 || sc.Delays > core.MaxDelayedKeys:
		return fmt.Errorf("%w: %d sessions, %d delayed keys", ErrInvariant, sc.Sessions, sc.Delays)
	}
	puts := make(map[uint64]struct{}, len(sc.Put))
	for _, x := range sc.Put {
		rec := core.EncodeSessionRecord(x)
		if _, err := core.DecodeSessionRecord(rec); err != nil || x.ID > sc.LastSessionID {
			return fmt.Errorf("%w: session %d (last %d): %v", ErrInvariant, x.ID, sc.LastSessionID, err)
		}
		puts[x.ID] = struct{}{}
		if err := b.Set(sessionKey(x.ID), rec, nil); err != nil {
			return err
		}
	}
	for _, id := range sc.Delete {
		if _, dup := puts[id]; dup {
			return fmt.Errorf("%w: session %d is in both Put and Delete", ErrInvariant, id)
		}
		if err := b.Delete(sessionKey(id), nil); err != nil {
			return err
		}
	}
	delays := make(map[string]struct{}, len(sc.PutDelays))
	for _, d := range sc.PutDelays {
		rec := core.EncodeDelayRecord(d)
		if _, err := core.DecodeDelayRecord(rec); err != nil || d.Seq > sc.LastDelaySeq {
			return fmt.Errorf("%w: delay of %q, sequence number %d (last %d): %v", ErrInvariant, d.Key, d.Seq, sc.LastDelaySeq, err)
		}
		delays[d.Key] = struct{}{}
		if err := b.Set(delayKey(d.Key), rec, nil); err != nil {
			return err
		}
	}
	for _, k := range sc.DeleteDelays {
		if _, dup := delays[k]; dup {
			return fmt.Errorf("%w: delayed key %q is in both Put and Delete", ErrInvariant, k)
		}
		if err := b.Delete(delayKey(k), nil); err != nil {
			return err
		}
	}
	now := sessionMark{lastID: sc.LastSessionID, lastSeq: sc.LastDelaySeq, sessions: uint64(sc.Sessions), delays: uint64(sc.Delays)}
	if err := b.Set(keySessions, encodeSessionsHeader(now), nil); err != nil {
		return err
	}
	st.sessions = now
	return nil
}

// stageSnapshotSessions replaces every session row with those of ss (a
// snapshot being installed).
func stageSnapshotSessions(b *pebble.Batch, st *storeState, ss *core.SessionState) error {
	if err := b.DeleteRange(prefixSession, endSession, nil); err != nil {
		return err
	}
	if err := b.DeleteRange(prefixDelay, endDelay, nil); err != nil {
		return err
	}
	for _, x := range ss.Sessions {
		if err := b.Set(sessionKey(x.ID), core.EncodeSessionRecord(x), nil); err != nil {
			return err
		}
	}
	for _, d := range ss.Delays {
		if err := b.Set(delayKey(d.Key), core.EncodeDelayRecord(d), nil); err != nil {
			return err
		}
	}
	now := sessionMark{lastID: ss.LastSessionID, lastSeq: ss.LastDelaySeq, sessions: uint64(len(ss.Sessions)), delays: uint64(len(ss.Delays))}
	if now == (sessionMark{}) {
		// A state without sessions has no header row, as before cluster
		// version 4.
		if err := b.Delete(keySessions, nil); err != nil {
			return err
		}
	} else if err := b.Set(keySessions, encodeSessionsHeader(now), nil); err != nil {
		return err
	}
	st.sessions = now
	return nil
}

// forEachSessionRow calls f with every session row of r in ID order, then
// every delay row in key order, and checks each row is under its own key
// and that there are as many of each as the header h says.
func forEachSessionRow(r reader, h sessionMark, session func(core.Session) error, delay func(core.Delay) error) error {
	n := uint64(0)
	err := scanRows(r, prefixSession, endSession, func(k, v []byte) error {
		x, err := core.DecodeSessionRecord(v)
		if err != nil {
			return fmt.Errorf("%w: session row %x: %w", ErrCorrupt, k, err)
		}
		if !bytes.Equal(k, sessionKey(x.ID)) {
			return fmt.Errorf("%w: session row %x holds session %d", ErrCorrupt, k, x.ID)
		}
		if n++; n > h.sessions {
			return fmt.Errorf("%w: more session rows than the %d the header says", ErrCorrupt, h.sessions)
		}
		return session(x)
	})
	if err != nil {
		return err
	}
	if n != h.sessions {
		return fmt.Errorf("%w: %d session rows, the header says %d", ErrCorrupt, n, h.sessions)
	}
	n = 0
	err = scanRows(r, prefixDelay, endDelay, func(k, v []byte) error {
		d, err := core.DecodeDelayRecord(v)
		if err != nil {
			return fmt.Errorf("%w: delay row %q: %w", ErrCorrupt, k, err)
		}
		if !bytes.Equal(k[len(prefixDelay):], []byte(d.Key)) {
			return fmt.Errorf("%w: delay row %q holds key %q", ErrCorrupt, k, d.Key)
		}
		if n++; n > h.delays {
			return fmt.Errorf("%w: more delay rows than the %d the header says", ErrCorrupt, h.delays)
		}
		return delay(d)
	})
	if err != nil {
		return err
	}
	if n != h.delays {
		return fmt.Errorf("%w: %d delay rows, the header says %d", ErrCorrupt, n, h.delays)
	}
	return nil
}

// scanRows calls f with the key and value of every row in [lower, upper).
func scanRows(r reader, lower, upper []byte, f func(k, v []byte) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("raftstore: scan %q: %w", lower, err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err == nil {
			err = f(it.Key(), v)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("raftstore: scan %q: %w", lower, err)
	}
	return nil
}

// loadSessions reads the session rows back into m (after its locks,
// control state and request records), which checks them against the rest
// of the state (every session lock's session open, no delayed key held,
// nothing before cluster version 4).
func loadSessions(r reader, m *core.Machine) error {
	h, err := readSessionsHeader(r)
	if err != nil {
		return err
	}
	ss := core.SessionState{LastSessionID: h.lastID, LastDelaySeq: h.lastSeq}
	err = forEachSessionRow(r, h, func(x core.Session) error {
		ss.Sessions = append(ss.Sessions, x)
		return nil
	}, func(d core.Delay) error {
		ss.Delays = append(ss.Delays, d)
		return nil
	})
	if err != nil {
		return err
	}
	if err := m.LoadSessions(ss); err != nil {
		return fmt.Errorf("%w: sessions: %w", ErrCorrupt, err)
	}
	return nil
}

// encodeSessions adds the session rows of r to a snapshot being encoded
// (after its locks and request records). stop is checked as the lock rows'
// walk checks it.
func encodeSessions(r reader, enc *core.SnapshotEncoder, stop <-chan struct{}) error {
	h, err := readSessionsHeader(r)
	if err != nil {
		return err
	}
	if err := enc.BeginSessions(h.lastID, h.lastSeq, int(h.sessions), int(h.delays)); err != nil {
		return err
	}
	rows := 0
	check := func() error {
		if rows++; rows%snapshotCheckStopEvery == 0 {
			select {
			case <-stop:
				return errSnapshotStopped
			default:
			}
		}
		return nil
	}
	return forEachSessionRow(r, h, func(x core.Session) error {
		if err := check(); err != nil {
			return err
		}
		return enc.AddSession(x)
	}, func(d core.Delay) error {
		if err := check(); err != nil {
			return err
		}
		return enc.AddDelay(d)
	})
}
