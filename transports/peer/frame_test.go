package peer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func mustFrame(t testing.TB, typ FrameType, payload []byte) []byte {
	t.Helper()
	b, err := AppendFrame(nil, Frame{Version: Version1, Type: typ, Payload: payload})
	if err != nil {
		t.Fatalf("AppendFrame(%s): %v", typ, err)
	}
	return b
}

func mustMarshal(t testing.TB, m raftpb.Message) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func header(version byte, typ FrameType, n uint32) []byte {
	b := []byte{version, byte(typ), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[2:], n)
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	msg := mustMarshal(t, raftpb.Message{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 9,
		Entries: []raftpb.Entry{{Term: 3, Index: 10, Data: []byte("grant")}}})
	h := hello{kind: kindMsg, dialer: 1, target: 2, nonce: [nonceSize]byte{1, 2, 3}}
	c := challenge{listener: 2, nonce: [nonceSize]byte{4}, proof: [MACSize]byte{5}}
	st := streamStart{metaLen: 10, dataLen: 20}
	cases := []Frame{
		{Version: Version1, Type: FrameHello, Payload: h.encode()},
		{Version: Version1, Type: FrameChallenge, Payload: c.encode()},
		{Version: Version1, Type: FrameProof, Payload: bytes.Repeat([]byte{7}, proofSize)},
		{Version: Version1, Type: FrameReject, Payload: []byte{rejectBadProof}},
		{Version: Version1, Type: FrameAccept, Payload: []byte{}, MAC: [MACSize]byte{9}},
		{Version: Version1, Type: FrameMsg, Payload: msg, MAC: [MACSize]byte{1, 1}},
		{Version: Version1, Type: FrameStreamStart, Payload: st.encode()},
		{Version: Version1, Type: FrameStreamChunk, Payload: bytes.Repeat([]byte{0xAB}, ChunkSize)},
		{Version: Version1, Type: FrameAck, Payload: []byte{ackOK}},
	}
	var stream []byte
	for _, f := range cases {
		b, err := AppendFrame(nil, f)
		if err != nil {
			t.Fatalf("%s: %v", f.Type, err)
		}
		want := HeaderSize + len(f.Payload)
		if f.Type.Authenticated() {
			want += MACSize
		}
		if len(b) != want {
			t.Fatalf("%s: encoded %d bytes, want %d", f.Type, len(b), want)
		}
		stream = append(stream, b...)
	}
	r := NewReader(bytes.NewReader(stream), MaxFrameSize)
	for _, want := range cases {
		got, err := r.Next()
		if err != nil {
			t.Fatalf("%s: %v", want.Type, err)
		}
		if got.Version != want.Version || got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) || got.MAC != want.MAC {
			t.Fatalf("%s: round trip mismatch", want.Type)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
	if h2, err := decodeHello(h.encode()); err != nil || h2 != h {
		t.Fatalf("hello round trip: %+v %v", h2, err)
	}
	if c2, err := decodeChallenge(c.encode()); err != nil || c2 != c {
		t.Fatalf("challenge round trip: %+v %v", c2, err)
	}
	if st2, err := decodeStreamStart(st.encode()); err != nil || st2 != st {
		t.Fatalf("stream start round trip: %+v %v", st2, err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	okHello := (&hello{kind: kindMsg, dialer: 1, target: 2}).encode()
	cases := []struct {
		name  string
		in    []byte
		limit int
		want  error
	}{
		{"empty", nil, 0, io.EOF},
		{"partial header", []byte{Version1, byte(FrameMsg), 0}, 0, ErrBadFrame},
		{"version 0", append(header(0, FrameMsg, 1), 1), 0, ErrUnknownVersion},
		{"version 2", append(header(2, FrameMsg, 1), 1), 0, ErrUnknownVersion},
		{"unknown type", append(header(Version1, 99, 1), 1), 0, ErrBadFrame},
		{"type zero", header(Version1, 0, 0), 0, ErrBadFrame},
		{"over MaxFrameSize", header(Version1, FrameMsg, MaxFrameSize+1), 0, ErrFrameTooLarge},
		{"length 4GiB-1", header(Version1, FrameStreamChunk, 0xFFFFFFFF), 0, ErrFrameTooLarge},
		{"over reader limit", header(Version1, FrameMsg, 100), 64, ErrFrameTooLarge},
		{"hello too short", append(header(Version1, FrameHello, helloSize-1), okHello[:helloSize-1]...), 0, ErrBadFrame},
		{"challenge too long", header(Version1, FrameChallenge, challengeSize+1), 0, ErrBadFrame},
		{"accept with payload", append(header(Version1, FrameAccept, 1), 0), 0, ErrBadFrame},
		{"empty msg", header(Version1, FrameMsg, 0), 0, ErrBadFrame},
		{"empty chunk", header(Version1, FrameStreamChunk, 0), 0, ErrBadFrame},
		{"ack too long", header(Version1, FrameAck, 2), 0, ErrBadFrame},
		{"truncated payload", append(header(Version1, FrameHello, helloSize), okHello[:10]...), 0, ErrBadFrame},
		{"missing payload", header(Version1, FrameHello, helloSize), 0, ErrBadFrame},
		{"truncated mac", append(append(header(Version1, FrameMsg, 1), 8), make([]byte, MACSize-1)...), 0, ErrBadFrame},
		{"missing mac", append(header(Version1, FrameMsg, 1), 8), 0, ErrBadFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.in), tc.limit)
			if tc.want == io.EOF {
				if err != io.EOF {
					t.Fatalf("err = %v, want bare io.EOF", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if len(err.Error()) < 6 || err.Error()[:6] != "peer: " {
				t.Fatalf("error %q is not prefixed with the package name", err)
			}
		})
	}
}

// A length field is not a promise: the reader must not allocate what the
// peer has not sent.
func TestReadFrameAllocatesOnlyWhatArrives(t *testing.T) {
	in := append(header(Version1, FrameStreamChunk, MaxFrameSize), make([]byte, 100)...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := ReadFrame(bytes.NewReader(in), MaxFrameSize); !errors.Is(err, ErrBadFrame) {
			t.Fatalf("err = %v, want ErrBadFrame", err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 2<<20 {
		t.Fatalf("10 truncated 4 MiB frames allocated %d bytes", got)
	}
}

func TestAppendFrameRejects(t *testing.T) {
	cases := []struct {
		name string
		f    Frame
		want error
	}{
		{"version", Frame{Version: 2, Type: FrameAck, Payload: []byte{0}}, ErrUnknownVersion},
		{"type", Frame{Version: Version1, Type: 77}, ErrBadFrame},
		{"size for type", Frame{Version: Version1, Type: FrameHello, Payload: []byte{1}}, ErrBadFrame},
		{"too large", Frame{Version: Version1, Type: FrameMsg, Payload: make([]byte, MaxFrameSize+1)}, ErrFrameTooLarge},
	}
	for _, tc := range cases {
		if _, err := AppendFrame(nil, tc.f); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestDecodePayloadErrors(t *testing.T) {
	bad := (&hello{kind: 9, dialer: 1, target: 2}).encode()
	if _, err := decodeHello(bad); !errors.Is(err, ErrBadFrame) {
		t.Errorf("unknown kind: %v", err)
	}
	zero := (&hello{kind: kindMsg, dialer: 0, target: 2}).encode()
	if _, err := decodeHello(zero); !errors.Is(err, ErrBadFrame) {
		t.Errorf("zero id: %v", err)
	}
	for _, st := range []streamStart{
		{metaLen: 1, dataLen: MaxSnapshotSize},
		{metaLen: MaxSnapshotSize + 1},
		{metaLen: 1 << 63, dataLen: 1 << 63},
	} {
		if _, err := decodeStreamStart(st.encode()); !errors.Is(err, ErrSnapshotTooLarge) {
			t.Errorf("%+v: %v, want ErrSnapshotTooLarge", st, err)
		}
	}
	if _, err := decodeStreamStart((&streamStart{dataLen: 5}).encode()); !errors.Is(err, ErrBadFrame) {
		t.Errorf("no meta: %v", err)
	}
}

func chunkFrames(meta, data []byte, chunk int) []Frame {
	st := streamStart{metaLen: uint64(len(meta)), dataLen: uint64(len(data))}
	fs := []Frame{{Version: Version1, Type: FrameStreamStart, Payload: st.encode()}}
	all := append(append([]byte(nil), meta...), data...)
	for len(all) > 0 {
		n := min(chunk, len(all))
		fs = append(fs, Frame{Version: Version1, Type: FrameStreamChunk, Payload: all[:n]})
		all = all[n:]
	}
	return fs
}

func TestDecoderReassemblesStream(t *testing.T) {
	data := bytes.Repeat([]byte("snapshot"), 1000)
	m := raftpb.Message{Type: raftpb.MsgSnap, To: 2, From: 1, Term: 4,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 77, Term: 4,
			ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}}
	meta := mustMarshal(t, m)
	// Chunks straddle the meta/data boundary on purpose.
	for _, chunk := range []int{1, 7, len(meta), len(meta) + 1, 4096, len(meta) + len(data)} {
		var d decoder
		var got raftpb.Message
		frames := chunkFrames(meta, data, chunk)
		for i, f := range frames {
			out, done, err := d.push(f)
			if err != nil {
				t.Fatalf("chunk %d, frame %d: %v", chunk, i, err)
			}
			if done != (i == len(frames)-1) {
				t.Fatalf("chunk %d, frame %d: done = %v", chunk, i, done)
			}
			got = out
		}
		if got.Snapshot == nil || got.Snapshot.Metadata.Index != 77 || !bytes.Equal(got.Snapshot.Data, data) {
			t.Fatalf("chunk %d: bad reassembly", chunk)
		}
		if d.streaming {
			t.Fatalf("chunk %d: decoder still streaming", chunk)
		}
	}
}

func TestDecoderRejectsOutOfSequence(t *testing.T) {
	app := mustMarshal(t, raftpb.Message{Type: raftpb.MsgApp, To: 2, From: 1})
	start := Frame{Version: Version1, Type: FrameStreamStart, Payload: (&streamStart{metaLen: uint64(len(app)), dataLen: 3}).encode()}
	msg := Frame{Version: Version1, Type: FrameMsg, Payload: app}
	chunk := func(b []byte) Frame { return Frame{Version: Version1, Type: FrameStreamChunk, Payload: b} }
	cases := []struct {
		name   string
		frames []Frame
	}{
		{"chunk outside a stream", []Frame{chunk([]byte{1})}},
		{"msg inside a stream", []Frame{start, msg}},
		{"start inside a stream", []Frame{start, start}},
		{"overrun", []Frame{start, chunk(append(append([]byte(nil), app...), 1, 2, 3, 4))}},
		{"data for a non-snapshot", []Frame{start, chunk(app), chunk([]byte{1, 2, 3})}},
		{"handshake frame", []Frame{{Version: Version1, Type: FrameHello}}},
		{"accept", []Frame{{Version: Version1, Type: FrameAccept}}},
		{"garbage message", []Frame{{Version: Version1, Type: FrameMsg, Payload: []byte{0xFF, 0xFF}}}},
	}
	for _, tc := range cases {
		var d decoder
		var err error
		for _, f := range tc.frames {
			if _, _, err = d.push(f); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: err = %v, want ErrBadFrame", tc.name, err)
		}
	}
}

// Responses are local-only and the one recursive field of raftpb.Message:
// a deep hostile nesting must be refused without recursing.
func TestUnmarshalRefusesResponses(t *testing.T) {
	one := mustMarshal(t, raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2, From: 1,
		Responses: []raftpb.Message{{Type: raftpb.MsgAppResp}}})
	if _, err := unmarshalMessage(one); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("responses: err = %v, want ErrBadFrame", err)
	}
	// 500,000 levels of field 14, about 2 MiB: lens[i] is the length of
	// the content of level i, counted from the innermost.
	const depth = 500_000
	lens := make([]uint64, depth)
	for i := 1; i < depth; i++ {
		lens[i] = lens[i-1] + 1 + uint64(len(binary.AppendUvarint(nil, lens[i-1])))
	}
	var deep []byte
	for i := depth - 1; i >= 0; i-- {
		deep = binary.AppendUvarint(append(deep, fieldResponses<<3|2), lens[i])
	}
	if _, err := unmarshalMessage(deep); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("deep nesting: err = %v, want ErrBadFrame", err)
	}
	for _, b := range [][]byte{{0x0b}, {0x08}, {0x12, 0x05, 1}, {0x09, 1, 2}} { // group, truncated varint, short length, short fixed64
		if _, err := unmarshalMessage(b); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%x: err = %v, want ErrBadFrame", b, err)
		}
	}
}
