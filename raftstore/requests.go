package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
)

// The request rows: the state machine's request records (core/requests.go)
// besides the request ids the lock rows carry. One header row holds the
// data clock and the sequence numbers of the ended records, and each ended
// record has its own row, keyed by its sequence number, so that applying a
// run of commands writes only the records it appended and deletes the
// range it pruned, in the same batch as the applied index.

// RequestChange is the request state after a run of commands, for the
// rows that changed: the header, the ended records appended by the run
// and still kept, and the pruned range.
type RequestChange struct {
	DataClockMS uint64
	// The ended records are now Head..Next-1; rows below Head are
	// deleted.
	Head, Next uint64
	// Ended are the records appended by the run that are still kept: the
	// rows max(previous Next, Head)..Next-1, in order.
	Ended []core.EndedRequest
}

// requestMark is where the request state stood before a run.
type requestMark struct{ clockMS, head, next uint64 }

func markRequests(m *core.Machine) requestMark {
	head, next := m.EndedSeqs()
	return requestMark{clockMS: m.DataClockMS(), head: head, next: next}
}

// requestChange is the change of the request rows from before to m's
// state, or nil when there is none.
func requestChange(m *core.Machine, before requestMark) *RequestChange {
	now := markRequests(m)
	if now == before {
		return nil
	}
	rc := &RequestChange{DataClockMS: now.clockMS, Head: now.head, Next: now.next}
	for seq := max(before.next, now.head); seq < now.next; seq++ {
		e, _ := m.EndedRequestAt(seq)
		rc.Ended = append(rc.Ended, e)
	}
	return rc
}

// endedKey is the key of the row of the ended record with sequence
// number seq.
func endedKey(seq uint64) []byte {
	k := make([]byte, len(prefixEnded)+8)
	copy(k, prefixEnded)
	binary.BigEndian.PutUint64(k[len(prefixEnded):], seq)
	return k
}

func encodeRequestsHeader(m requestMark) []byte {
	b := make([]byte, 0, 24)
	b = binary.BigEndian.AppendUint64(b, m.clockMS)
	b = binary.BigEndian.AppendUint64(b, m.head)
	return binary.BigEndian.AppendUint64(b, m.next)
}

// readRequestsHeader reads the header row; a store written before request
// records (or that never had one) has none, which is the zero state.
func readRequestsHeader(r reader) (requestMark, error) {
	v, ok, err := get(r, keyRequests)
	if err != nil || !ok {
		return requestMark{}, err
	}
	if len(v) != 24 {
		return requestMark{}, fmt.Errorf("%w: %s is %d bytes, want 24", ErrCorrupt, keyRequests, len(v))
	}
	m := requestMark{clockMS: binary.BigEndian.Uint64(v), head: binary.BigEndian.Uint64(v[8:]), next: binary.BigEndian.Uint64(v[16:])}
	if m.head > m.next || m.next-m.head > core.MaxRequestRecords {
		return requestMark{}, fmt.Errorf("%w: %s names ended records %d..%d", ErrCorrupt, keyRequests, m.head, m.next)
	}
	return m, nil
}

// stageRequests adds the request rows of rc to b: the header, the rows of
// the records appended, and the deletion of the pruned ones. It checks rc
// against the persisted state st: nothing moves backwards, and the
// appended records are exactly the rows the header says are new.
func stageRequests(b *pebble.Batch, st *storeState, rc *RequestChange) error {
	was := st.requests
	from := max(was.next, rc.Head)
	switch {
	case rc.DataClockMS < was.clockMS:
		return fmt.Errorf("%w: data clock %d below persisted %d", ErrInvariant, rc.DataClockMS, was.clockMS)
	case rc.Head < was.head || rc.Next < was.next || rc.Head > rc.Next:
		return fmt.Errorf("%w: ended requests %d..%d after %d..%d", ErrInvariant, rc.Head, rc.Next, was.head, was.next)
	case rc.Next-rc.Head > core.MaxRequestRecords || uint64(len(rc.Ended)) != rc.Next-from:
		return fmt.Errorf("%w: %d ended requests appended for rows %d..%d", ErrInvariant, len(rc.Ended), from, rc.Next)
	}
	if pruned := min(rc.Head, was.next); pruned > was.head {
		if err := b.DeleteRange(endedKey(was.head), endedKey(pruned), nil); err != nil {
			return err
		}
	}
	for i, e := range rc.Ended {
		if err := b.Set(endedKey(from+uint64(i)), core.EncodeEndedRequest(e), nil); err != nil {
			return err
		}
	}
	now := requestMark{clockMS: rc.DataClockMS, head: rc.Head, next: rc.Next}
	if err := b.Set(keyRequests, encodeRequestsHeader(now), nil); err != nil {
		return err
	}
	st.requests = now
	return nil
}

// stageSnapshotRequests replaces every request row with those of rs (a
// snapshot being installed).
func stageSnapshotRequests(b *pebble.Batch, st *storeState, rs *core.RequestState) error {
	if err := b.DeleteRange(prefixEnded, endEnded, nil); err != nil {
		return err
	}
	for i, e := range rs.Ended {
		if err := b.Set(endedKey(rs.EndedHead+uint64(i)), core.EncodeEndedRequest(e), nil); err != nil {
			return err
		}
	}
	now := requestMark{clockMS: rs.DataClockMS, head: rs.EndedHead, next: rs.EndedHead + uint64(len(rs.Ended))}
	if err := b.Set(keyRequests, encodeRequestsHeader(now), nil); err != nil {
		return err
	}
	st.requests = now
	return nil
}

// forEachEnded calls f with every ended request row of r, in order, and
// checks they are exactly the rows the header h names.
func forEachEnded(r reader, h requestMark, f func(core.EndedRequest) error) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefixEnded, UpperBound: endEnded})
	if err != nil {
		return fmt.Errorf("raftstore: scan ended requests: %w", err)
	}
	want := h.head
	for valid := it.First(); valid; valid = it.Next() {
		err = iterEnded(it, want, h.next)
		var e core.EndedRequest
		if err == nil {
			var v []byte
			if v, err = it.ValueAndErr(); err == nil {
				if e, err = core.DecodeEndedRequest(v); err != nil {
					err = fmt.Errorf("%w: ended request row %d: %w", ErrCorrupt, want, err)
				}
			}
		}
		if err == nil {
			err = f(e)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
		want++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("raftstore: scan ended requests: %w", err)
	}
	if want != h.next {
		return fmt.Errorf("%w: ended request rows end at %d, the header says %d", ErrCorrupt, want, h.next)
	}
	return nil
}

// iterEnded checks that the row under it is the ended request row want,
// below next.
func iterEnded(it *pebble.Iterator, want, next uint64) error {
	k := it.Key()
	if len(k) != len(prefixEnded)+8 {
		return fmt.Errorf("%w: ended request key %q", ErrCorrupt, k)
	}
	if seq := binary.BigEndian.Uint64(k[len(prefixEnded):]); seq != want || seq >= next {
		return fmt.Errorf("%w: ended request row %d where row %d of %d was due", ErrCorrupt, seq, want, next)
	}
	return nil
}

// loadRequests reads the request rows back into m (after its locks and
// control state), which checks them against the rest of the state.
func loadRequests(r reader, m *core.Machine) error {
	h, err := readRequestsHeader(r)
	if err != nil {
		return err
	}
	rs := core.RequestState{DataClockMS: h.clockMS, EndedHead: h.head}
	if n := h.next - h.head; n > 0 {
		rs.Ended = make([]core.EndedRequest, 0, n)
	}
	if err := forEachEnded(r, h, func(e core.EndedRequest) error {
		rs.Ended = append(rs.Ended, e)
		return nil
	}); err != nil {
		return err
	}
	if err := m.LoadRequests(rs); err != nil {
		return fmt.Errorf("%w: request records: %w", ErrCorrupt, err)
	}
	return nil
}
