package peer

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"hash"
	"net"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// A session is one authenticated connection: its frames are sealed with a
// per-direction MAC. This file holds the session itself, how the Transport
// opens one on either side (TLS if configured, then the handshake of
// handshake.go), and the table of inbound sessions.

// macer computes the MAC trailer of the session frames of one direction:
// HMAC-SHA256(key, seq:8 | header | payload). seq counts frames from 0, so
// a replayed, dropped or reordered frame fails the check.
type macer struct {
	h   hash.Hash
	seq uint64
	pre [8 + HeaderSize]byte
	sum [MACSize]byte
}

func newMacer(key []byte) *macer { return &macer{h: hmac.New(sha256.New, key)} }

// next computes the MAC of the next frame and advances the sequence.
func (m *macer) next(hdr, payload []byte) []byte {
	binary.BigEndian.PutUint64(m.pre[:8], m.seq)
	copy(m.pre[8:], hdr)
	m.h.Reset()
	m.h.Write(m.pre[:])
	m.h.Write(payload)
	m.seq++
	return m.h.Sum(m.sum[:0])
}

// session is an authenticated connection to one peer.
type session struct {
	raw  net.Conn // the TCP connection; closing it unblocks everything
	conn net.Conn // raw, or a *tls.Conn over it
	r    *Reader
	peer uint64
	kind connKind
	in   *macer
	out  *macer
	wbuf []byte
	stop func() bool // unregisters the close-on-cancel hook
}

func newSession(raw, conn net.Conn, r *Reader, peer uint64, kind connKind, in, out []byte) *session {
	return &session{raw: raw, conn: conn, r: r, peer: peer, kind: kind, in: newMacer(in), out: newMacer(out)}
}

func (s *session) close() {
	if s.stop != nil {
		s.stop()
	}
	_ = s.raw.Close()
}

// readFrame reads the next session frame and verifies its MAC.
func (s *session) readFrame() (Frame, error) {
	f, err := s.r.Next()
	if err != nil {
		return Frame{}, err
	}
	if err := s.verify(f); err != nil {
		return Frame{}, err
	}
	return f, nil
}

// verify checks the MAC of a frame that was read outside readFrame.
func (s *session) verify(f Frame) error {
	if !f.Type.Authenticated() {
		return fmt.Errorf("%w: %s frame inside a session", ErrProtocol, f.Type)
	}
	var hdr [HeaderSize]byte
	putHeader(hdr[:], f.Type, len(f.Payload))
	if !hmac.Equal(s.in.next(hdr[:], f.Payload), f.MAC[:]) {
		return fmt.Errorf("%w: %s frame %d from peer %d", ErrBadMAC, f.Type, s.in.seq-1, s.peer)
	}
	return nil
}

// appendFrame appends a sealed session frame to dst.
func (s *session) appendFrame(dst []byte, t FrameType, payload []byte) []byte {
	start := len(dst)
	dst = slices.Grow(dst, HeaderSize+len(payload)+MACSize)
	dst = dst[:start+HeaderSize]
	putHeader(dst[start:], t, len(payload))
	dst = append(dst, payload...)
	return append(dst, s.out.next(dst[start:start+HeaderSize], payload)...)
}

// appendMsg appends m, whose marshalled size is size <= MaxFrameSize, as a
// sealed FrameMsg.
func (s *session) appendMsg(dst []byte, m *raftpb.Message, size int) ([]byte, error) {
	start := len(dst)
	dst = slices.Grow(dst, HeaderSize+size+MACSize)
	dst = dst[:start+HeaderSize+size]
	putHeader(dst[start:], FrameMsg, size)
	if _, err := m.MarshalToSizedBuffer(dst[start+HeaderSize:]); err != nil {
		return dst[:start], fmt.Errorf("peer: marshal %s: %w", m.Type, err)
	}
	return append(dst, s.out.next(dst[start:start+HeaderSize], dst[start+HeaderSize:])...), nil
}

// write writes b with a deadline.
func (s *session) write(b []byte, timeout time.Duration) error {
	if err := s.conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("peer: set write deadline: %w", err)
	}
	if _, err := s.conn.Write(b); err != nil {
		return fmt.Errorf("peer: write to %d: %w", s.peer, err)
	}
	return nil
}

// writeFrame seals and writes one session frame.
func (s *session) writeFrame(t FrameType, payload []byte, timeout time.Duration) error {
	s.wbuf = s.appendFrame(s.wbuf[:0], t, payload)
	return s.write(s.wbuf, timeout)
}

// writeMessage writes one message: as a single FrameMsg when it fits, or
// else as a stream whose chunks carry the message with Snapshot.Data
// emptied, then Snapshot.Data itself, so neither side ever holds a second
// copy of the snapshot.
func (s *session) writeMessage(m *raftpb.Message, timeout time.Duration) error {
	if size := m.Size(); size <= MaxFrameSize {
		var err error
		if s.wbuf, err = s.appendMsg(s.wbuf[:0], m, size); err != nil {
			return err
		}
		return s.write(s.wbuf, timeout)
	}
	meta, data := *m, []byte(nil)
	if m.Snapshot != nil && len(m.Snapshot.Data) > 0 {
		snap := *m.Snapshot
		data, snap.Data = snap.Data, nil
		meta.Snapshot = &snap
	}
	mb, err := meta.Marshal()
	if err != nil {
		return fmt.Errorf("peer: marshal %s: %w", m.Type, err)
	}
	if uint64(len(mb))+uint64(len(data)) > MaxSnapshotSize {
		return fmt.Errorf("%w: %s of %d bytes to %d, the limit is %d", ErrSnapshotTooLarge, m.Type, len(mb)+len(data), m.To, MaxSnapshotSize)
	}
	st := streamStart{metaLen: uint64(len(mb)), dataLen: uint64(len(data))}
	if err := s.writeFrame(FrameStreamStart, st.encode(), timeout); err != nil {
		return err
	}
	for _, part := range [][]byte{mb, data} {
		for len(part) > 0 {
			n := min(len(part), ChunkSize)
			if err := s.writeFrame(FrameStreamChunk, part[:n], timeout); err != nil {
				return err
			}
			part = part[n:]
		}
	}
	if cap(s.wbuf) > 2*ChunkSize {
		s.wbuf = nil
	}
	return nil
}

// dial connects to p, runs TLS (if configured) and the HMAC handshake, and
// returns a session that closes when p stops.
func (t *Transport) dial(p *peer, kind connKind) (*session, error) {
	d := net.Dialer{Timeout: t.cfg.DialTimeout}
	raw, err := d.DialContext(p.ctx, "tcp", p.addr)
	if err != nil {
		return nil, fmt.Errorf("peer: dial %d at %s: %w", p.id, p.addr, err)
	}
	stop := context.AfterFunc(p.ctx, func() { _ = raw.Close() })
	s, err := t.clientHandshake(p, raw, kind)
	if err != nil {
		stop()
		_ = raw.Close()
		return nil, fmt.Errorf("peer: handshake with %d at %s: %w", p.id, p.addr, err)
	}
	s.stop = stop
	return s, nil
}

func (t *Transport) clientHandshake(p *peer, raw net.Conn, kind connKind) (*session, error) {
	if err := raw.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout)); err != nil {
		return nil, err
	}
	conn, binding := raw, []byte(nil)
	if t.cfg.TLS != nil {
		cfg := t.cfg.TLS.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(p.addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(p.ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		var err error
		if binding, err = exportBinding(tc); err != nil {
			return nil, err
		}
		conn = tc
	}
	s, err := dialHandshake(raw, conn, t.secret, t.cfg.ID, p.id, kind, binding)
	if err != nil {
		return nil, err
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return s, nil
}

// serverHandshake runs the listener's side: the TLS handshake and the
// hello within HelloTimeout of accept, the whole within HandshakeTimeout.
func (t *Transport) serverHandshake(raw net.Conn) (*session, error) {
	accepted := time.Now()
	if err := raw.SetDeadline(accepted.Add(min(t.cfg.HelloTimeout, t.cfg.HandshakeTimeout))); err != nil {
		return nil, err
	}
	helloRead := func() error { return raw.SetDeadline(accepted.Add(t.cfg.HandshakeTimeout)) }
	conn, binding := raw, []byte(nil)
	if t.tlsServer != nil {
		tc := tls.Server(raw, t.tlsServer)
		if err := tc.HandshakeContext(t.ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		var err error
		if binding, err = exportBinding(tc); err != nil {
			return nil, err
		}
		conn = tc
	}
	s, err := acceptHandshake(raw, conn, t.secret, t.cfg.ID, t.isMember, binding, helloRead)
	if err != nil {
		return nil, err
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return s, nil
}

func exportBinding(tc *tls.Conn) ([]byte, error) {
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(tlsExporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("tls exporter: %w", err)
	}
	return b, nil
}

type inKey struct {
	peer uint64
	kind connKind
}

// register records s as the inbound connection of its peer and kind,
// closing the one it replaces (a restarted peer's old connection).
func (t *Transport) register(s *session) bool {
	k := inKey{s.peer, s.kind}
	t.mu.Lock()
	if t.closed || t.peers[s.peer] == nil {
		t.mu.Unlock()
		return false
	}
	old := t.inbound[k]
	t.inbound[k] = s
	t.mu.Unlock()
	if old != nil {
		old.close()
	}
	return true
}

func (t *Transport) unregister(s *session) {
	k := inKey{s.peer, s.kind}
	t.mu.Lock()
	if t.inbound[k] == s {
		delete(t.inbound, k)
	}
	t.mu.Unlock()
}
