package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Outbound: Send queues messages per peer; one goroutine per peer keeps an
// authenticated message connection up, reconnecting with backoff, and
// drains the queue into it in batches. MsgSnap takes its own path
// (snapshot.go).

// Send queues messages for their peers and returns at once: a message
// whose peer queue is full is dropped and counted (raft retransmits). MsgSnap
// goes to a separate per-peer queue and its own connection; a MsgSnap that
// cannot be queued is reported as raft.SnapshotFailure. Messages for
// unknown peers, for local raft targets, or with a From other than our ID
// are dropped.
func (t *Transport) Send(msgs []raftpb.Message) {
	for i := range msgs {
		m := &msgs[i]
		if m.To == t.cfg.ID || raft.IsLocalMsgTarget(m.To) {
			continue
		}
		t.mu.RLock()
		p, closed := t.peers[m.To], t.closed
		t.mu.RUnlock()
		if closed {
			return
		}
		if p == nil || m.From != t.cfg.ID {
			t.unroutable.Add(1)
			t.log.Debug("peer: unroutable message dropped", "type", m.Type, "from", m.From, "to", m.To)
			continue
		}
		snap := m.Type == raftpb.MsgSnap
		if !t.allowed(t.cfg.ID, m.To) {
			p.filtered.Add(1)
			if snap {
				t.failSnapshotAsync(p)
			}
			continue
		}
		q := p.queue
		if snap {
			q = p.snaps
		}
		select {
		case q <- *m:
		default:
			p.dropped.Add(1)
			if snap {
				t.failSnapshotAsync(p)
			}
		}
	}
}

func (t *Transport) startPeerLocked(p *peer) {
	p.ctx, p.cancel = context.WithCancel(t.ctx)
	t.wg.Add(2)
	go t.runPeer(p)
	go t.runSnapshots(p)
}

type backoff struct{ lo, hi, cur time.Duration }

// next doubles the delay up to hi and returns it with "equal jitter": a
// random value in [cur/2, cur].
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.lo
	} else {
		b.cur = min(2*b.cur, b.hi)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

// runPeer keeps one authenticated message connection to p and drains its
// queue into it, reconnecting with backoff.
func (t *Transport) runPeer(p *peer) {
	defer t.wg.Done()
	log := t.log.With("peer", p.id, "addr", p.addr)
	bo := backoff{lo: t.cfg.BackoffMin, hi: t.cfg.BackoffMax}
	failing := false
	for p.ctx.Err() == nil {
		s, err := t.dial(p, kindMsg)
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			switch {
			case !failing && errors.Is(err, ErrUnknownPeer):
				// A joining node, or one restarting before the peer
				// applied its admission: retried until it has.
				log.Info("peer: connect failed: not (yet) a member the peer knows; retrying", "err", err)
			case !failing:
				log.Warn("peer: connect failed", "err", err)
			default:
				log.Debug("peer: connect failed", "err", err)
			}
			failing = true
			t.reportUnreachable(p.id)
			if !t.pause(p, bo.next()) {
				return
			}
			continue
		}
		failing = false
		bo.cur = 0
		p.connected.Store(true)
		log.Info("peer: connected")
		err = t.writeLoop(p, s)
		p.connected.Store(false)
		if p.ctx.Err() != nil {
			return
		}
		log.Warn("peer: connection lost", "err", err)
		t.reportUnreachable(p.id)
		if !t.pause(p, bo.next()) {
			return
		}
	}
}

// pause waits d, or until wakePeer, dropping what is queued meanwhile:
// raft retransmits, and a queue full of stale messages would only delay
// fresh ones after a reconnect. It returns false if the peer is stopping.
func (t *Transport) pause(p *peer, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-p.wake:
			return true
		case <-p.queue:
			p.dropped.Add(1)
		}
	}
}

// writeLoop writes queued messages in batches until the connection fails
// or the peer stops.
func (t *Transport) writeLoop(p *peer, s *session) error {
	remoteClosed := t.watchRemoteClose(s)
	defer func() {
		s.close()
		<-remoteClosed
	}()
	w := batchWriter{t: t, p: p, s: s}
	for {
		var m raftpb.Message
		select {
		case <-p.ctx.Done():
			return p.ctx.Err()
		case <-remoteClosed:
			return fmt.Errorf("peer: connection to %d closed by remote", p.id)
		case m = <-p.queue:
		}
		if err := w.writeBatch(m); err != nil {
			return err
		}
	}
}

// watchRemoteClose returns a channel closed once s can no longer be read.
// The listener never writes on a message connection after its accept, so
// a read returning means the connection has closed.
func (t *Transport) watchRemoteClose(s *session) <-chan struct{} {
	closed := make(chan struct{})
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer close(closed)
		var b [1]byte
		_, _ = s.conn.Read(b[:])
	}()
	return closed
}

// batchWriter seals the messages of one message connection into a buffer
// and writes them with as few Writes as the batch limits allow. It is used
// by writeLoop's goroutine only.
type batchWriter struct {
	t       *Transport
	p       *peer
	s       *session
	buf     []byte // sealed frames not yet written
	pending uint64 // messages in buf
}

// writeBatch writes m and whatever else is queued already, up to
// maxBatchBytes or maxBatchMsgs per Write. Only a failed write is an
// error: a message that cannot be sealed is dropped and logged.
func (w *batchWriter) writeBatch(m raftpb.Message) error {
	for {
		if err := w.add(&m); err != nil {
			return err
		}
		if len(w.buf) >= maxBatchBytes || w.pending >= maxBatchMsgs {
			return w.flush()
		}
		select {
		case m = <-w.p.queue:
		default:
			return w.flush()
		}
	}
}

// add appends m to the batch or, when m does not fit in one frame,
// flushes the batch and streams m on its own.
func (w *batchWriter) add(m *raftpb.Message) error {
	size := m.Size()
	if size > MaxFrameSize {
		return w.stream(m)
	}
	var err error
	if w.buf, err = w.s.appendMsg(w.buf, m, size); err != nil {
		w.p.dropped.Add(1)
		w.t.log.Error("peer: message dropped", "peer", w.p.id, "type", m.Type, "err", err)
		return nil
	}
	w.pending++
	return nil
}

// stream flushes the batch, then writes m as a stream of frames.
func (w *batchWriter) stream(m *raftpb.Message) error {
	if err := w.flush(); err != nil {
		return err
	}
	if err := w.s.writeMessage(m, w.t.cfg.WriteTimeout); err != nil {
		w.p.dropped.Add(1)
		if !errors.Is(err, errEncode) {
			return err
		}
		w.t.log.Error("peer: message dropped", "peer", w.p.id, "type", m.Type, "err", err)
		return nil
	}
	w.p.sent.Add(1)
	return nil
}

// flush writes the batch and counts its messages as sent or, if the write
// failed, dropped. A buffer grown far beyond a batch is not kept.
func (w *batchWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.s.write(w.buf, w.t.cfg.WriteTimeout)
	if err != nil {
		w.p.dropped.Add(w.pending)
	} else {
		w.p.sent.Add(w.pending)
	}
	if cap(w.buf) > 2*maxBatchBytes {
		w.buf = nil
	}
	w.buf, w.pending = w.buf[:0], 0
	return err
}

// wakePeer ends the reconnect backoff of member id's writer, if it is
// waiting one: the member just authenticated an inbound connection, so it
// is up and listening now. Without this a member that was down for a
// while (a new follower, a restarted node) waited up to BackoffMax (2 s)
// for the leader's next dial; a new follower's catch-up in TestMillionLocks
// waited 0.7-1.5 s for it. Only an authenticated member can wake it, once
// per connection it opens, and the dial that follows is one the backoff
// would have made anyway.
func (t *Transport) wakePeer(id uint64) {
	p := t.lookup(id)
	if p == nil {
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}
