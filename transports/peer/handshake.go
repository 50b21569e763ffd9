package peer

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// Errors of the handshake and of authenticated sessions.
var (
	// ErrAuthFailed: the other side did not prove knowledge of the cluster
	// secret.
	ErrAuthFailed = errors.New("peer: authentication failed")
	// ErrUnknownPeer: the claimed node id is not a member (or is our own).
	ErrUnknownPeer = errors.New("peer: unknown peer")
	// ErrWrongPeer: the listener is not the node the dialer meant to reach.
	ErrWrongPeer = errors.New("peer: peer id mismatch")
	// ErrRejected: the other side refused the handshake; the reason follows.
	ErrRejected = errors.New("peer: handshake rejected by remote")
	// ErrBadMAC: a session frame failed its MAC check (tampering, replay,
	// reordering, or a different session key).
	ErrBadMAC = errors.New("peer: frame authentication failed")
	// ErrProtocol: an authenticated peer broke the protocol (unexpected
	// frame, forged From, message not addressed to us).
	ErrProtocol = errors.New("peer: protocol violation")
)

// Reject reason codes (FrameReject payload).
const (
	rejectUnknownPeer byte = 1
	rejectWrongTarget byte = 2
	rejectBadProof    byte = 3
)

func rejectReason(code byte) error {
	switch code {
	case rejectUnknownPeer:
		return fmt.Errorf("%w: %w: we are not a member it knows", ErrRejected, ErrUnknownPeer)
	case rejectWrongTarget:
		return fmt.Errorf("%w: %w: it is not the node we dialled", ErrRejected, ErrWrongPeer)
	case rejectBadProof:
		return fmt.Errorf("%w: %w: proofs do not match (different cluster secret or cluster ID?)", ErrRejected, ErrAuthFailed)
	}
	return fmt.Errorf("%w: reason %d", ErrRejected, code)
}

// Domain-separation labels. Proofs and keys are HMACs of the transcript
// under the cluster secret; distinct labels keep one from standing in for
// another (a listener's proof is never a valid dialer proof).
const (
	labelListenerProof = "ticketd/peer/v1 listener proof"
	labelDialerProof   = "ticketd/peer/v1 dialer proof"
	labelKeyDialer     = "ticketd/peer/v1 key dialer->listener"
	labelKeyListener   = "ticketd/peer/v1 key listener->dialer"
)

// transcript is everything both sides agreed on during the handshake.
// binding is the TLS exporter value when the connection runs over TLS, so
// the proofs are tied to that TLS session too.
type transcript struct {
	kind           connKind
	dialer, listnr uint64
	dialerNonce    [nonceSize]byte
	listenerNonce  [nonceSize]byte
	binding        []byte
}

func (tr *transcript) mac(secret []byte, label string) [MACSize]byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	var b [2 + 8 + 8]byte
	b[0] = Version1
	b[1] = byte(tr.kind)
	binary.BigEndian.PutUint64(b[2:], tr.dialer)
	binary.BigEndian.PutUint64(b[10:], tr.listnr)
	h.Write(b[:])
	h.Write(tr.dialerNonce[:])
	h.Write(tr.listenerNonce[:])
	h.Write([]byte{byte(len(tr.binding))})
	h.Write(tr.binding)
	var out [MACSize]byte
	h.Sum(out[:0])
	return out
}

func randomNonce() [nonceSize]byte {
	var n [nonceSize]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return n
}

func writeRaw(conn net.Conn, t FrameType, payload []byte) error {
	b, err := AppendFrame(nil, Frame{Version: Version1, Type: t, Payload: payload})
	if err != nil {
		return err
	}
	if _, err := conn.Write(b); err != nil {
		return fmt.Errorf("peer: handshake write: %w", err)
	}
	return nil
}

func reject(conn net.Conn, code byte) { _ = writeRaw(conn, FrameReject, []byte{code}) }

func newHandshakeReader(conn net.Conn) *Reader {
	return NewReader(bufio.NewReaderSize(conn, 64<<10), maxHandshake)
}

func readHandshake(r *Reader, want FrameType) (Frame, error) {
	f, err := r.Next()
	if err != nil {
		return Frame{}, fmt.Errorf("peer: handshake: reading %s: %w", want, err)
	}
	if f.Type == FrameReject && want != FrameReject {
		return Frame{}, rejectReason(f.Payload[0])
	}
	if f.Type != want {
		return Frame{}, fmt.Errorf("%w: handshake: got %s, want %s", ErrProtocol, f.Type, want)
	}
	return f, nil
}

// dialHandshake runs the dialer's side over an established (and, with TLS,
// already TLS-handshaken) connection. The caller sets the deadline.
func dialHandshake(raw, conn net.Conn, secret []byte, self, target uint64, kind connKind, binding []byte) (*session, error) {
	r := newHandshakeReader(conn)
	tr := transcript{kind: kind, dialer: self, listnr: target, dialerNonce: randomNonce(), binding: binding}
	h := hello{kind: kind, dialer: self, target: target, nonce: tr.dialerNonce}
	if err := writeRaw(conn, FrameHello, h.encode()); err != nil {
		return nil, err
	}
	f, err := readHandshake(r, FrameChallenge)
	if err != nil {
		return nil, err
	}
	c, err := decodeChallenge(f.Payload)
	if err != nil {
		return nil, err
	}
	if c.listener != target {
		reject(conn, rejectWrongTarget)
		return nil, fmt.Errorf("%w: listener claims id %d, we dialled %d", ErrWrongPeer, c.listener, target)
	}
	tr.listenerNonce = c.nonce
	want := tr.mac(secret, labelListenerProof)
	if !hmac.Equal(c.proof[:], want[:]) {
		reject(conn, rejectBadProof)
		return nil, fmt.Errorf("%w: listener %d did not prove the cluster secret", ErrAuthFailed, target)
	}
	proof := tr.mac(secret, labelDialerProof)
	if err := writeRaw(conn, FrameProof, proof[:]); err != nil {
		return nil, err
	}
	kd, kl := tr.mac(secret, labelKeyDialer), tr.mac(secret, labelKeyListener)
	s := newSession(raw, conn, r, target, kind, kl[:], kd[:])
	f, err = r.Next()
	if err != nil {
		return nil, fmt.Errorf("peer: handshake: reading accept: %w", err)
	}
	if f.Type == FrameReject {
		return nil, rejectReason(f.Payload[0])
	}
	if err := s.verify(f); err != nil {
		return nil, err
	}
	if f.Type != FrameAccept {
		return nil, fmt.Errorf("%w: handshake: got %s, want accept", ErrProtocol, f.Type)
	}
	r.SetLimit(MaxFrameSize)
	return s, nil
}

// acceptHandshake runs the listener's side. known reports whether an id is
// a current member other than self; helloRead, if set, is called once the
// hello has arrived (the caller extends its deadline).
func acceptHandshake(raw, conn net.Conn, secret []byte, self uint64, known func(uint64) bool, binding []byte, helloRead func() error) (*session, error) {
	r := newHandshakeReader(conn)
	f, err := readHandshake(r, FrameHello)
	if err != nil {
		return nil, err
	}
	if helloRead != nil {
		if err := helloRead(); err != nil {
			return nil, err
		}
	}
	h, err := decodeHello(f.Payload)
	if err != nil {
		return nil, err
	}
	if h.target != self {
		reject(conn, rejectWrongTarget)
		return nil, fmt.Errorf("%w: dialer %d meant to reach %d, we are %d", ErrWrongPeer, h.dialer, h.target, self)
	}
	if h.dialer == self || !known(h.dialer) {
		reject(conn, rejectUnknownPeer)
		return nil, fmt.Errorf("%w: dialer claims id %d", ErrUnknownPeer, h.dialer)
	}
	tr := transcript{kind: h.kind, dialer: h.dialer, listnr: self, dialerNonce: h.nonce, listenerNonce: randomNonce(), binding: binding}
	c := challenge{listener: self, nonce: tr.listenerNonce, proof: tr.mac(secret, labelListenerProof)}
	if err := writeRaw(conn, FrameChallenge, c.encode()); err != nil {
		return nil, err
	}
	f, err = readHandshake(r, FrameProof)
	if err != nil {
		return nil, fmt.Errorf("dialer %d: %w", h.dialer, err)
	}
	want := tr.mac(secret, labelDialerProof)
	if !hmac.Equal(f.Payload, want[:]) {
		reject(conn, rejectBadProof)
		return nil, fmt.Errorf("%w: dialer claiming id %d did not prove the cluster secret", ErrAuthFailed, h.dialer)
	}
	kd, kl := tr.mac(secret, labelKeyDialer), tr.mac(secret, labelKeyListener)
	s := newSession(raw, conn, r, h.dialer, h.kind, kd[:], kl[:])
	s.wbuf = s.appendFrame(s.wbuf[:0], FrameAccept, nil)
	if _, err := conn.Write(s.wbuf); err != nil {
		return nil, fmt.Errorf("peer: handshake write: %w", err)
	}
	r.SetLimit(MaxFrameSize)
	return s, nil
}
