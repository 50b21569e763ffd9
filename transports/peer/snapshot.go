package peer

import (
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshots: every MsgSnap travels on a connection of its own, one at a
// time per peer, and its outcome is reported to raft once the receiver has
// acknowledged it (or it failed).

// failSnapshotAsync reports a snapshot failure off the caller's goroutine:
// Send is called from the raft loop, which ReportSnapshot may feed back
// into. Before Start no raft is bound, so there is nobody to report to.
func (t *Transport) failSnapshotAsync(p *peer) {
	p.snapsFailed.Add(1)
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed || t.raft == nil {
		return
	}
	r := t.raft
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		r.ReportSnapshot(p.id, raft.SnapshotFailure)
	}()
}

// runSnapshots sends p's MsgSnap messages one at a time, each on its own
// connection, and reports each outcome.
func (t *Transport) runSnapshots(p *peer) {
	defer t.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case m := <-p.snaps:
			start := time.Now()
			err := t.sendSnapshot(p, &m)
			if t.ctx.Err() != nil {
				return // shutting down: nobody to report to
			}
			status := raft.SnapshotFinish
			if err != nil {
				status = raft.SnapshotFailure
				p.snapsFailed.Add(1)
				t.log.Warn("peer: snapshot failed", "peer", p.id, "index", m.Snapshot.Metadata.Index, "err", err)
			} else {
				p.snapsSent.Add(1)
				t.log.Info("peer: snapshot sent", "peer", p.id, "index", m.Snapshot.Metadata.Index,
					"bytes", len(m.Snapshot.Data), "took", time.Since(start))
			}
			t.raft.ReportSnapshot(p.id, status)
		}
	}
}

func (t *Transport) sendSnapshot(p *peer, m *raftpb.Message) error {
	if m.Snapshot == nil {
		m.Snapshot = &raftpb.Snapshot{}
	}
	if !t.allowed(t.cfg.ID, p.id) {
		p.filtered.Add(1)
		return errors.New("peer: dropped by filter")
	}
	s, err := t.dial(p, kindSnap)
	if err != nil {
		t.reportUnreachable(p.id)
		return err
	}
	defer s.close()
	if err := s.writeMessage(m, t.cfg.WriteTimeout); err != nil {
		return err
	}
	if err := s.raw.SetReadDeadline(time.Now().Add(t.cfg.SnapshotTimeout)); err != nil {
		return fmt.Errorf("peer: set read deadline: %w", err)
	}
	f, err := s.readFrame()
	if err != nil {
		return fmt.Errorf("peer: waiting for snapshot ack: %w", err)
	}
	if f.Type != FrameAck {
		return fmt.Errorf("%w: got %s, want ack", ErrProtocol, f.Type)
	}
	if f.Payload[0] != ackOK {
		return ErrSnapshotRejected
	}
	return nil
}

// ackSnapshot answers the MsgSnap just read from a snapshot connection:
// ackOK once Raft.Step has taken it, ackRejected if it was dropped.
func (t *Transport) ackSnapshot(s *session, delivered bool) error {
	status := ackOK
	if !delivered {
		status = ackRejected
	}
	return s.writeFrame(FrameAck, []byte{status}, t.cfg.WriteTimeout)
}
