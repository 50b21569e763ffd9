package peer

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

var testSecret = []byte("ticketd-test-cluster-secret-0123")

type handshakeResult struct {
	s   *session
	err error
}

// pipeHandshake runs both sides of the handshake over net.Pipe.
func pipeHandshake(t *testing.T, dialerSecret, listenerSecret []byte, dialer, target, listener uint64, members ...uint64) (d, l handshakeResult) {
	t.Helper()
	c1, c2 := net.Pipe()
	t.Cleanup(func() { c1.Close(); c2.Close() })
	deadline := time.Now().Add(5 * time.Second)
	c1.SetDeadline(deadline)
	c2.SetDeadline(deadline)
	known := func(id uint64) bool {
		for _, m := range members {
			if m == id {
				return true
			}
		}
		return false
	}
	lc := make(chan handshakeResult, 1)
	go func() {
		s, err := acceptHandshake(c2, c2, listenerSecret, listener, known, nil, nil)
		if err != nil {
			c2.Close() // as the transport does; unblocks a dialer still reading
		}
		lc <- handshakeResult{s, err}
	}()
	s, err := dialHandshake(c1, c1, dialerSecret, dialer, target, kindMsg, nil)
	if err != nil {
		c1.Close()
	}
	return handshakeResult{s, err}, <-lc
}

func TestHandshakeEstablishesSession(t *testing.T) {
	d, l := pipeHandshake(t, testSecret, testSecret, 1, 2, 2, 1, 3)
	if d.err != nil || l.err != nil {
		t.Fatalf("dialer: %v, listener: %v", d.err, l.err)
	}
	if d.s.peer != 2 || l.s.peer != 1 || l.s.kind != kindMsg {
		t.Fatalf("peers: dialer sees %d, listener sees %d (%s)", d.s.peer, l.s.peer, l.s.kind)
	}
	m := raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 5}
	done := make(chan error, 1)
	go func() { done <- d.s.writeMessage(&m, time.Second) }()
	f, err := l.s.readFrame()
	if err != nil {
		t.Fatal(err)
	}
	var dec decoder
	got, ok, err := dec.push(f)
	if err != nil || !ok || got.Term != 5 || got.From != 1 {
		t.Fatalf("got %+v ok=%v err=%v", got, ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestHandshakeWrongSecret(t *testing.T) {
	other := []byte("a-different-cluster-secret-45678")
	d, l := pipeHandshake(t, testSecret, other, 1, 2, 2, 1)
	if !errors.Is(d.err, ErrAuthFailed) {
		t.Errorf("dialer: %v, want ErrAuthFailed", d.err)
	}
	if !errors.Is(l.err, ErrRejected) || !errors.Is(l.err, ErrAuthFailed) {
		t.Errorf("listener: %v, want ErrRejected wrapping ErrAuthFailed", l.err)
	}
}

func TestHandshakeUnknownDialer(t *testing.T) {
	d, l := pipeHandshake(t, testSecret, testSecret, 9, 2, 2, 1, 3)
	if !errors.Is(l.err, ErrUnknownPeer) {
		t.Errorf("listener: %v, want ErrUnknownPeer", l.err)
	}
	if !errors.Is(d.err, ErrRejected) || !errors.Is(d.err, ErrUnknownPeer) {
		t.Errorf("dialer: %v, want ErrRejected wrapping ErrUnknownPeer", d.err)
	}
}

func TestHandshakeSelfAndWrongTarget(t *testing.T) {
	// A dialer claiming the listener's own id.
	if _, l := pipeHandshake(t, testSecret, testSecret, 2, 2, 2, 1, 2); !errors.Is(l.err, ErrUnknownPeer) {
		t.Errorf("self: listener %v, want ErrUnknownPeer", l.err)
	}
	// The dialer reached node 2 but meant node 5.
	d, l := pipeHandshake(t, testSecret, testSecret, 1, 5, 2, 1)
	if !errors.Is(l.err, ErrWrongPeer) || !errors.Is(d.err, ErrWrongPeer) {
		t.Errorf("wrong target: dialer %v, listener %v, want ErrWrongPeer on both", d.err, l.err)
	}
}

// sealedPair returns the two ends' session MAC state for one direction.
func sealedPair(t *testing.T) (out, in *session) {
	d, l := pipeHandshake(t, testSecret, testSecret, 1, 2, 2, 1)
	if d.err != nil || l.err != nil {
		t.Fatal(d.err, l.err)
	}
	return d.s, l.s
}

func TestSessionMACRejectsTamperReplayReorder(t *testing.T) {
	payload := mustMarshal(t, raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 2})
	frames := func(out *session, n int) [][]byte {
		var fs [][]byte
		for range n {
			fs = append(fs, out.appendFrame(nil, FrameMsg, payload))
		}
		return fs
	}
	read := func(in *session, b []byte) error {
		in.r = NewReader(bytes.NewReader(b), MaxFrameSize)
		_, err := in.readFrame()
		return err
	}
	t.Run("ok", func(t *testing.T) {
		out, in := sealedPair(t)
		for i, f := range frames(out, 3) {
			if err := read(in, f); err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
		}
	})
	t.Run("tampered payload", func(t *testing.T) {
		out, in := sealedPair(t)
		f := frames(out, 1)[0]
		f[HeaderSize+1] ^= 1
		if err := read(in, f); !errors.Is(err, ErrBadMAC) {
			t.Fatalf("err = %v, want ErrBadMAC", err)
		}
	})
	t.Run("tampered mac", func(t *testing.T) {
		out, in := sealedPair(t)
		f := frames(out, 1)[0]
		f[len(f)-1] ^= 1
		if err := read(in, f); !errors.Is(err, ErrBadMAC) {
			t.Fatalf("err = %v, want ErrBadMAC", err)
		}
	})
	t.Run("replayed", func(t *testing.T) {
		out, in := sealedPair(t)
		f := frames(out, 1)[0]
		if err := read(in, f); err != nil {
			t.Fatal(err)
		}
		if err := read(in, f); !errors.Is(err, ErrBadMAC) {
			t.Fatalf("replay: err = %v, want ErrBadMAC", err)
		}
	})
	t.Run("reordered", func(t *testing.T) {
		out, in := sealedPair(t)
		fs := frames(out, 2)
		if err := read(in, fs[1]); !errors.Is(err, ErrBadMAC) {
			t.Fatalf("second frame first: err = %v, want ErrBadMAC", err)
		}
	})
	t.Run("wrong direction", func(t *testing.T) {
		out, _ := sealedPair(t)
		// A frame the dialer sealed, reflected back at the dialer.
		f := frames(out, 1)[0]
		if err := read(out, f); !errors.Is(err, ErrBadMAC) {
			t.Fatalf("reflected: err = %v, want ErrBadMAC", err)
		}
	})
	t.Run("handshake frame in session", func(t *testing.T) {
		_, in := sealedPair(t)
		if err := read(in, mustFrame(t, FrameProof, make([]byte, proofSize))); !errors.Is(err, ErrProtocol) {
			t.Fatalf("err = %v, want ErrProtocol", err)
		}
	})
}

func TestTranscriptLabelsAndBindingMatter(t *testing.T) {
	tr := transcript{kind: kindMsg, dialer: 1, listnr: 2, dialerNonce: [nonceSize]byte{1}, listenerNonce: [nonceSize]byte{2}}
	a := tr.mac(testSecret, labelListenerProof)
	if a == tr.mac(testSecret, labelDialerProof) {
		t.Fatal("listener and dialer proofs coincide")
	}
	for name, mod := range map[string]func(*transcript){
		"kind":    func(x *transcript) { x.kind = kindSnap },
		"dialer":  func(x *transcript) { x.dialer = 3 },
		"nonce":   func(x *transcript) { x.listenerNonce[0] = 9 },
		"binding": func(x *transcript) { x.binding = []byte{1} },
	} {
		x := tr
		mod(&x)
		if x.mac(testSecret, labelListenerProof) == a {
			t.Errorf("changing %s does not change the proof", name)
		}
	}
}
