package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/ticketd/ticketd/internal/connlimit"
	"go.etcd.io/raft/v3/raftpb"
)

// Inbound: the accept loop authenticates each connection (session.go),
// then one goroutine per connection reads its frames, checks every message
// against the authenticated peer and delivers it to Raft.Step (a snapshot
// connection also gets its acknowledgement, snapshot.go).

// acceptLoop accepts connections until the listener closes, and admits
// each to the pending table (admission.go) until it authenticates.
func (t *Transport) acceptLoop(ln net.Listener) {
	defer t.wg.Done()
	var delay time.Duration
	for {
		raw, err := ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("peer: accept failed", "err", err, "retry_in", delay)
			select {
			case <-t.ctx.Done():
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		source := sourceOf(raw.RemoteAddr())
		pc := &pendingConn{raw: raw}
		e, _ := t.pending.Admit(source, t.isMemberSource(source), pc.evict)
		if e == nil {
			// Only when every pending connection from source is
			// reserved and source is at its limit.
			t.handshakeFailures.Add(1)
			if ok, suppressed := t.inboundLogs.Allow(time.Now()); ok {
				t.log.Warn("peer: too many pending handshakes, connection refused",
					"remote", raw.RemoteAddr().String(), "suppressed", suppressed)
			}
			_ = raw.Close()
			continue
		}
		t.wg.Add(1)
		go t.serveConn(pc, source, e)
	}
}

// serveConn authenticates one inbound connection, makes it its peer's
// current one of its kind, and reads it until it fails or closes.
func (t *Transport) serveConn(pc *pendingConn, source string, e *connlimit.Entry) {
	defer t.wg.Done()
	raw := pc.raw
	stop := context.AfterFunc(t.ctx, func() { _ = raw.Close() })
	remote := raw.RemoteAddr().String()
	s, err := t.serverHandshake(raw)
	t.pending.Done(e)
	if err != nil {
		stop()
		_ = raw.Close()
		if t.ctx.Err() == nil {
			t.handshakeFailures.Add(1)
			switch {
			case pc.evicted.Load():
				if ok, suppressed := t.inboundLogs.Allow(time.Now()); ok {
					t.log.Warn("peer: unauthenticated connection closed to make room for a newer one", "remote", remote, "suppressed", suppressed)
				}
			case errors.Is(err, ErrUnknownPeer):
				// A joining node dials before this node applied its
				// admission, and retries until it has: normal, so
				// at most one line a minute (peer: connect failed on the
				// dialer's side says whether it goes on).
				if ok, suppressed := t.unknownPeerLogs.Allow(time.Now()); ok {
					t.log.Info("peer: inbound handshake failed: not (yet) a member", "remote", remote, "err", err, "suppressed", suppressed)
				}
			default:
				if ok, suppressed := t.inboundLogs.Allow(time.Now()); ok {
					t.log.Warn("peer: inbound handshake failed", "remote", remote, "err", err, "suppressed", suppressed)
				}
			}
		}
		return
	}
	t.learnSource(s.peer, source)
	t.wakePeer(s.peer)
	s.stop = stop
	defer s.close()
	log := t.log.With("peer", s.peer, "kind", s.kind.String(), "remote", remote)
	if !t.register(s) {
		log.Warn("peer: inbound connection from a removed peer closed")
		return
	}
	defer t.unregister(s)
	log.Debug("peer: inbound connection authenticated")
	err = t.readLoop(s)
	switch {
	case t.ctx.Err() != nil:
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		log.Debug("peer: inbound connection closed", "err", err)
	default:
		log.Warn("peer: inbound connection dropped", "err", err)
	}
}

// sourceOf is the address a connection comes from, without its port.
func sourceOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// readLoop decodes and delivers the messages of one inbound connection. Any
// error closes the connection.
func (t *Transport) readLoop(s *session) error {
	var (
		dec      decoder
		deadline bool
	)
	for {
		// Idle message connections may wait forever (TCP keepalive finds
		// dead ones); a snapshot connection or an open stream may not.
		if s.kind == kindSnap || dec.streaming {
			if err := s.raw.SetReadDeadline(time.Now().Add(t.cfg.SnapshotTimeout)); err != nil {
				return err
			}
			deadline = true
		} else if deadline {
			if err := s.raw.SetReadDeadline(time.Time{}); err != nil {
				return err
			}
			deadline = false
		}
		f, err := s.readFrame()
		if err != nil {
			return err
		}
		m, done, err := dec.push(f)
		if err != nil {
			return err
		}
		if !done {
			continue
		}
		ok, err := t.deliver(s, m)
		if err != nil {
			t.rejected.Add(1)
			return err
		}
		if s.kind == kindSnap {
			if err := t.ackSnapshot(s, ok); err != nil {
				return err
			}
		}
	}
}

// deliver checks m against the authenticated peer and hands it to
// Raft.Step. A false result without error means it was dropped (filter,
// Step error); an error is a protocol violation.
func (t *Transport) deliver(s *session, m raftpb.Message) (bool, error) {
	switch {
	case m.From != s.peer:
		return false, fmt.Errorf("%w: %s from authenticated peer %d claims From=%d", ErrProtocol, m.Type, s.peer, m.From)
	case m.To != t.cfg.ID:
		return false, fmt.Errorf("%w: %s from peer %d is addressed to %d, we are %d", ErrProtocol, m.Type, s.peer, m.To, t.cfg.ID)
	case raft.IsLocalMsg(m.Type):
		return false, fmt.Errorf("%w: local-only %s from peer %d", ErrProtocol, m.Type, s.peer)
	case s.kind == kindSnap && m.Type != raftpb.MsgSnap:
		return false, fmt.Errorf("%w: %s on a snapshot connection from peer %d", ErrProtocol, m.Type, s.peer)
	}
	p := t.lookup(s.peer)
	if p == nil {
		return false, fmt.Errorf("%w: peer %d was removed", ErrUnknownPeer, s.peer)
	}
	if !t.allowed(m.From, t.cfg.ID) {
		p.filtered.Add(1)
		return false, nil
	}
	if err := t.raft.Step(t.ctx, m); err != nil {
		t.log.Debug("peer: raft step failed", "peer", s.peer, "type", m.Type, "err", err)
		return false, nil
	}
	p.received.Add(1)
	return true, nil
}
