package peer

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// fuzzSeeds are the frame sequences the committed corpus in
// testdata/fuzz/FuzzReadFrame was generated from, by name.
func fuzzSeeds(tb testing.TB) map[string][]byte {
	app := mustMarshal(tb, raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 2, Term: 3, LogTerm: 3, Index: 7, Commit: 6,
		Entries: []raftpb.Entry{{Term: 3, Index: 8, Data: []byte("grant lock/a")}}})
	snapMeta := mustMarshal(tb, raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 3,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}})
	sealed := func(t FrameType, p []byte) []byte {
		b, err := AppendFrame(nil, Frame{Version: Version1, Type: t, Payload: p, MAC: [MACSize]byte{0xAA}})
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	h := hello{kind: kindMsg, dialer: 1, target: 2, nonce: [nonceSize]byte{1, 2, 3, 4}}
	c := challenge{listener: 2, nonce: [nonceSize]byte{5, 6}, proof: [MACSize]byte{7}}
	data := []byte("snapshot data for the fuzzer")
	stream := streamStart{metaLen: uint64(len(snapMeta)), dataLen: uint64(len(data))}
	return map[string][]byte{
		"hello":        mustFrame(tb, FrameHello, h.encode()),
		"challenge":    mustFrame(tb, FrameChallenge, c.encode()),
		"proof":        mustFrame(tb, FrameProof, bytes.Repeat([]byte{9}, proofSize)),
		"reject":       mustFrame(tb, FrameReject, []byte{rejectUnknownPeer}),
		"accept_msg":   cat(sealed(FrameAccept, nil), sealed(FrameMsg, app)),
		"ack":          sealed(FrameAck, []byte{ackOK}),
		"stream":       cat(sealed(FrameStreamStart, stream.encode()), sealed(FrameStreamChunk, snapMeta[:5]), sealed(FrameStreamChunk, append(snapMeta[5:], data...))),
		"stream_short": cat(sealed(FrameStreamStart, stream.encode()), sealed(FrameStreamChunk, snapMeta)),
		"stream_huge":  sealed(FrameStreamStart, (&streamStart{metaLen: 1, dataLen: MaxSnapshotSize}).encode()),
		"responses":    sealed(FrameMsg, mustMarshal(tb, raftpb.Message{Type: raftpb.MsgHeartbeat, Responses: []raftpb.Message{{}}})),
		"bad_version":  append(header(2, FrameMsg, 1), 0),
		"too_large":    header(Version1, FrameStreamChunk, MaxFrameSize+1),
		"truncated":    mustFrame(tb, FrameHello, h.encode())[:20],
		"unknown_type": append(header(Version1, 42, 1), 0),
	}
}

// FuzzReadFrame feeds arbitrary bytes through the frame reader and, for
// session frames, the stream reassembly and message decoder the inbound
// path uses. Every error must be typed, every accepted frame must re-encode
// to exactly the bytes it came from, and every decoded message must
// survive a marshal round trip.
func FuzzReadFrame(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), MaxFrameSize)
		var dec decoder
		consumed := 0
		for {
			fr, err := r.Next()
			if err == io.EOF {
				if consumed != len(data) {
					t.Fatalf("io.EOF after %d of %d bytes", consumed, len(data))
				}
				return
			}
			if err != nil {
				if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, ErrUnknownVersion) {
					t.Fatalf("untyped error: %v", err)
				}
				return
			}
			enc, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatalf("accepted frame does not re-encode: %v", err)
			}
			if len(enc) > len(data)-consumed || !bytes.Equal(enc, data[consumed:consumed+len(enc)]) {
				t.Fatalf("re-encoded %s frame differs from its input", fr.Type)
			}
			consumed += len(enc)

			switch fr.Type {
			case FrameHello:
				if h, err := decodeHello(fr.Payload); err == nil && !bytes.Equal(h.encode(), fr.Payload) {
					t.Fatal("hello does not round trip")
				} else if err != nil && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("untyped hello error: %v", err)
				}
			case FrameChallenge:
				if c, err := decodeChallenge(fr.Payload); err != nil || !bytes.Equal(c.encode(), fr.Payload) {
					t.Fatalf("challenge does not round trip: %v", err)
				}
			case FrameMsg, FrameStreamStart, FrameStreamChunk:
				m, done, err := dec.push(fr)
				if err != nil {
					if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrSnapshotTooLarge) {
						t.Fatalf("untyped decoder error: %v", err)
					}
					dec = decoder{} // the transport would close the connection here
					continue
				}
				if !done {
					continue
				}
				if len(m.Responses) != 0 {
					t.Fatal("decoded a message with responses")
				}
				b, err := m.Marshal()
				if err != nil {
					t.Fatalf("decoded message does not marshal: %v", err)
				}
				if _, err := unmarshalMessage(b); err != nil {
					t.Fatalf("re-marshalled message does not decode: %v", err)
				}
			}
		}
	})
}
