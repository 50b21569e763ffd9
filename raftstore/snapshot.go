package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// Snapshots off the raft loop.
//
// Encoding the table (hundreds of milliseconds at a million locks) and
// writing it (hundreds of megabytes) on the raft loop would stall ticks,
// heartbeats and every commit while it ran. So, as etcd does (it clones
// its store on the loop and saves the clone in a goroutine), the loop only
// takes a cheap consistent copy and hands it to one background goroutine:
//
//   - The copy is a Pebble snapshot of the store, O(1) to take. The lock
//     rows, the token counter, the control row, the request rows and the
//     session rows in Pebble are exactly the machine's state at the
//     applied index: the loop writes them in the same batch as the
//     applied index (persist), it is the only writer
//     of those rows, and it takes the copy after that batch committed and
//     before it applies anything else. The conf state as of that index
//     comes from the loop too.
//   - The goroutine walks the lock rows in key order (byte order, which
//     is the snapshot's order), then the ended request rows in sequence
//     order (the FIFO's order), then the session rows in ID order and
//     the delay rows in key order, and encodes the snapshot with
//     core.SnapshotEncoder (the same bytes Machine.Snapshot gives) straight
//     into its own file, a chunk at a time; then it commits the file's
//     metadata (Store.createSnapshotWith, CreateSnapshot's streaming form)
//     and compacts the log behind it.
//
// Why it is still safe:
//   - The data is the state at exactly index (above), and the store
//     records it at index with that index's term: the same snapshot the
//     loop would have taken.
//   - Raft keeps using the previous snapshot and the log until the new one
//     is published; Compact runs only after it is recorded, and only up to
//     its index, as before.
//   - A snapshot received from the leader may be installed by the loop
//     while the goroutine works (its file has another name: a snapshot is
//     installed only above the commit index, so above ours). The store
//     checks again, under the writers' lock, that no newer snapshot exists
//     before committing, and gives raft.ErrSnapOutOfDate otherwise (the
//     goroutine then drops its work); so an older snapshot never replaces
//     a newer one.
//   - One snapshot at a time. A membership change that needs a fresh
//     snapshot while one is being built gets the next one.
//   - A failure other than ErrSnapOutOfDate is reported to the loop, which
//     stops the node (the same as when it ran on the loop).

// snapshotCheckStopEvery is how many rows the encoder reads between checks
// for Stop.
const snapshotCheckStopEvery = 4096

// errSnapshotStopped ends a snapshot build because the node is stopping.
var errSnapshotStopped = errors.New("raftstore: snapshot abandoned: node stopping")

// stateView is a consistent copy of the applied state rows.
type stateView struct {
	snap      *pebble.Snapshot
	applied   uint64
	lastToken uint64
}

// viewState takes a stateView. The caller (the raft loop) guarantees no
// Write runs meanwhile, so the rows are those of the published applied
// index; CreateSnapshot and Compact, which may run concurrently, change
// neither the state rows nor the applied index.
func (s *Store) viewState() (*stateView, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrStoreClosed
	}
	return &stateView{snap: s.db.NewSnapshot(), applied: s.st.applied, lastToken: s.st.lastToken}, nil
}

// encodeSnapshotTo encodes the snapshot of v (count locks: the machine's
// count at v.applied) to w as it goes, and returns how many bytes it
// wrote. stop ends it early.
func encodeSnapshotTo(w io.Writer, v *stateView, count int, stop <-chan struct{}) (int64, error) {
	control, err := viewControl(v)
	if err != nil {
		return 0, err
	}
	enc := core.NewSnapshotEncoderTo(w, v.lastToken, count, control)
	if err := fillSnapshot(v, enc, stop); err != nil {
		return 0, err
	}
	n, err := enc.FinishTo()
	if err != nil {
		return n, fmt.Errorf("raftstore: encode snapshot at %d: %w", v.applied, err)
	}
	return n, nil
}

// viewControl reads the control state of v.
func viewControl(v *stateView) (core.ControlState, error) {
	var control core.ControlState
	switch rec, ok, err := get(v.snap, keyControl); {
	case err != nil:
		return control, err
	case ok:
		if control, err = core.DecodeControlState(rec); err != nil {
			return control, fmt.Errorf("%w: control state: %w", ErrCorrupt, err)
		}
	}
	return control, nil
}

// fillSnapshot feeds enc the state rows of v, in the snapshot's order:
// every section but the end (Finish).
func fillSnapshot(v *stateView, enc *core.SnapshotEncoder, stop <-chan struct{}) error {
	it, err := v.snap.NewIter(&pebble.IterOptions{LowerBound: prefixLock, UpperBound: endLock})
	if err != nil {
		return fmt.Errorf("raftstore: scan locks: %w", err)
	}
	rows := 0
	for valid := it.First(); valid; valid = it.Next() {
		if rows++; rows%snapshotCheckStopEvery == 0 {
			select {
			case <-stop:
				_ = it.Close()
				return errSnapshotStopped
			default:
			}
		}
		rec, err := it.ValueAndErr()
		if err == nil {
			err = enc.AddRecord(rec)
		}
		if err == nil && !bytes.Equal(it.Key()[len(prefixLock):], enc.LastKey()) {
			err = fmt.Errorf("%w: lock row %q holds another key", ErrCorrupt, it.Key())
		}
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("raftstore: encode snapshot at %d: %w", v.applied, err)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("raftstore: scan locks: %w", err)
	}
	h, err := readRequestsHeader(v.snap)
	if err == nil {
		err = enc.BeginRequests(h.clockMS, h.head, int(h.next-h.head))
	}
	if err == nil {
		err = forEachEnded(v.snap, h, func(e core.EndedRequest) error {
			if rows++; rows%snapshotCheckStopEvery == 0 {
				select {
				case <-stop:
					return errSnapshotStopped
				default:
				}
			}
			return enc.AddEnded(e)
		})
	}
	if err == nil {
		err = encodeSessions(v.snap, enc, stop)
	}
	if err == nil {
		err = encodeHolders(v.snap, enc, stop)
	}
	if errors.Is(err, errSnapshotStopped) {
		return err
	}
	if err != nil {
		return fmt.Errorf("raftstore: encode snapshot at %d: %w", v.applied, err)
	}
	return nil
}

// maybeSnapshot starts a snapshot in the background every SnapshotEntries
// applied entries (or now, when force is set), unless one is running. It
// runs on the raft loop and returns at once.
func (n *Node) maybeSnapshot(applied uint64, cs raftpb.ConfState, force bool) error {
	force = force || n.snapForce || n.snapRequested.Swap(false)
	if n.snapping.Load() {
		n.snapForce = force // take the next one as soon as this one ends
		return nil
	}
	last := n.snapIndex.Load()
	if applied <= last || !force && applied-last < n.cfg.SnapshotEntries {
		return nil
	}
	n.snapForce = false
	v, err := n.cfg.Store.viewState()
	if err != nil {
		return fmt.Errorf("snapshot at %d: %w", applied, err)
	}
	if v.applied != applied {
		_ = v.snap.Close()
		return fmt.Errorf("snapshot at %d: %w: store applied index is %d", applied, ErrInvariant, v.applied)
	}
	count := n.machine.Len() - n.machine.HolderCount() // the lock rows; the loop owns the machine between Readies
	n.snapping.Store(true)
	n.bg.Add(1)
	go n.buildSnapshot(v, count, cs)
	return nil
}

// buildSnapshot encodes, records and compacts behind one snapshot. It is
// the one background snapshot goroutine.
func (n *Node) buildSnapshot(v *stateView, count int, cs raftpb.ConfState) {
	defer n.bg.Done()
	defer n.snapping.Store(false)
	start := time.Now()
	// Encoded straight into the snapshot file, a chunk at a time, rather
	// than into one buffer of the whole snapshot first: at a million locks
	// that buffer was 36 MB of fresh pages, whose faults showed as a third
	// of the encoding's CPU, and the leader's RSS carried it (with it, a
	// snapshot took 0.61-0.64 s, median of 22 in each of three runs of
	// TestMillionLocks; streamed, 0.41-0.55 s in three; docs/benchmarks.md).
	var size int64
	var encoded time.Duration
	err := n.cfg.Store.createSnapshotWith(v.applied, cs, v.lastToken, func(w io.Writer) error {
		var err error
		size, err = encodeSnapshotTo(w, v, count, n.stopc)
		encoded = time.Since(start)
		return err
	})
	_ = v.snap.Close()
	switch {
	case errors.Is(err, errSnapshotStopped), errors.Is(err, ErrStoreClosed):
		return
	case errors.Is(err, raft.ErrSnapOutOfDate):
		n.log.Debug("snapshot superseded by a received one", "index", v.applied)
		return
	case err != nil:
		n.cfg.Metrics.snapshotFailed()
		n.reportBackground(fmt.Errorf("create snapshot at %d: %w", v.applied, err))
		return
	}
	n.cfg.Metrics.snapshotTaken()
	n.snapIndex.Store(v.applied)
	if v.applied > n.cfg.CompactKeep {
		at := v.applied - n.cfg.CompactKeep
		if err := n.cfg.Store.Compact(at); err != nil && !errors.Is(err, raft.ErrCompacted) && !errors.Is(err, ErrStoreClosed) {
			n.cfg.Metrics.snapshotFailed()
			n.reportBackground(fmt.Errorf("compact to %d: %w", at, err))
			return
		}
	}
	n.cfg.Metrics.observeSnapshot(time.Since(start), int(size))
	n.log.Info("snapshot taken", "index", v.applied, "locks", count, "bytes", size,
		"encode", encoded, "total", time.Since(start))
}

// RequestSnapshot asks for a snapshot at the next applied Ready, however
// few entries were applied since the last one.
func (n *Node) RequestSnapshot() { n.snapRequested.Store(true) }

// reportBackground hands a background failure to the loop, which stops the
// node with it.
func (n *Node) reportBackground(err error) {
	select {
	case n.bgErrc <- err:
	default: // the loop already has one to stop with
	}
}
