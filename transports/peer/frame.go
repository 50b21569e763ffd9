package peer

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
)

// Frame format constants. See the package documentation for the layout.
const (
	// Version1 is the frame version this package writes and the only one
	// it accepts.
	Version1 byte = 1
	// HeaderSize is the fixed frame header: version:1 | type:1 | length:4.
	HeaderSize = 6
	// MACSize is the size of the HMAC-SHA256 trailer every session frame
	// carries after its payload. The length field does not count it.
	MACSize = sha256.Size
	// MaxFrameSize bounds the payload of one frame. A message that does not
	// fit is streamed.
	MaxFrameSize = 4 << 20
	// ChunkSize is the largest payload of a FrameStreamChunk the sender
	// writes. The receiver accepts any chunk up to MaxFrameSize.
	ChunkSize = 1 << 20
	// MaxSnapshotSize bounds one streamed message: its metadata plus its
	// snapshot data. It is above the snapshot of the largest lock table a
	// node can hold (core.MaxSnapshotSize, about 1.49 GB, asserted at
	// compile time by package daemon), so no table the cluster reaches can
	// make a follower impossible to catch up. Only an authenticated peer
	// can stream, and the receiver allocates as bytes arrive.
	MaxSnapshotSize = 2 << 30
)

// Sizes of the fixed-layout payloads.
const (
	nonceSize       = 32
	helloSize       = 1 + 8 + 8 + nonceSize         // kind | dialer id | listener id | nonce
	challengeSize   = 8 + nonceSize + MACSize       // listener id | nonce | proof
	proofSize       = MACSize                       // proof
	rejectSize      = 1                             // reason code
	streamStartSize = 8 + 8                         // meta length | data length
	ackSize         = 1                             // status
	maxHandshake    = max(helloSize, challengeSize) // largest handshake payload
)

// Errors returned by the frame decoder. Every decoding error wraps exactly
// one of these, so callers can classify with errors.Is.
var (
	// ErrBadFrame: the bytes are not a well-formed frame (truncated, unknown
	// type, wrong length for its type, out of sequence, bad message).
	ErrBadFrame = errors.New("peer: bad frame")
	// ErrFrameTooLarge: the length field exceeds the reader's limit.
	ErrFrameTooLarge = errors.New("peer: frame too large")
	// ErrUnknownVersion: the version byte is not Version1.
	ErrUnknownVersion = errors.New("peer: unknown frame version")
	// ErrSnapshotTooLarge: a stream declares more than MaxSnapshotSize bytes.
	ErrSnapshotTooLarge = errors.New("peer: streamed message too large")
)

// FrameType says what a frame carries. Types below FrameAccept belong to the
// handshake and carry no MAC; FrameAccept and above are session frames and
// are followed by a MACSize trailer.
type FrameType byte

// Frame types.
const (
	FrameHello     FrameType = 1 // dialer -> listener: kind, ids, nonce
	FrameChallenge FrameType = 2 // listener -> dialer: id, nonce, proof
	FrameProof     FrameType = 3 // dialer -> listener: proof
	FrameReject    FrameType = 4 // either side: handshake refused, reason code

	FrameAccept      FrameType = 16 // listener -> dialer: session established
	FrameMsg         FrameType = 17 // one marshalled raftpb.Message
	FrameStreamStart FrameType = 18 // a streamed message begins: meta and data lengths
	FrameStreamChunk FrameType = 19 // the next bytes of a streamed message
	FrameAck         FrameType = 20 // snapshot receiver -> sender: status
)

// Authenticated reports whether frames of this type carry a MAC trailer.
func (t FrameType) Authenticated() bool { return t >= FrameAccept }

func (t FrameType) String() string {
	switch t {
	case FrameHello:
		return "hello"
	case FrameChallenge:
		return "challenge"
	case FrameProof:
		return "proof"
	case FrameReject:
		return "reject"
	case FrameAccept:
		return "accept"
	case FrameMsg:
		return "msg"
	case FrameStreamStart:
		return "stream-start"
	case FrameStreamChunk:
		return "stream-chunk"
	case FrameAck:
		return "ack"
	}
	return fmt.Sprintf("type(%d)", byte(t))
}

// Frame is one decoded frame. MAC is meaningful only for authenticated
// types; the decoder reads it but does not verify it (the session does).
type Frame struct {
	Version byte
	Type    FrameType
	Payload []byte
	MAC     [MACSize]byte
}

// checkHeader validates a header against the per-type layout and limit
// before a single payload byte is read or allocated.
func checkHeader(version byte, t FrameType, n uint32, limit int) error {
	if version != Version1 {
		return fmt.Errorf("%w: %d", ErrUnknownVersion, version)
	}
	if uint64(n) > uint64(limit) {
		return fmt.Errorf("%w: %s payload of %d bytes, the limit is %d", ErrFrameTooLarge, t, n, limit)
	}
	want := -1 // exact size, or -1 for 1..limit
	switch t {
	case FrameHello:
		want = helloSize
	case FrameChallenge:
		want = challengeSize
	case FrameProof:
		want = proofSize
	case FrameReject:
		want = rejectSize
	case FrameAccept:
		want = 0
	case FrameStreamStart:
		want = streamStartSize
	case FrameAck:
		want = ackSize
	case FrameMsg, FrameStreamChunk:
		if n == 0 {
			return fmt.Errorf("%w: empty %s frame", ErrBadFrame, t)
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown frame type %d", ErrBadFrame, byte(t))
	}
	if int(n) != want {
		return fmt.Errorf("%w: %s payload is %d bytes, want %d", ErrBadFrame, t, n, want)
	}
	return nil
}

func putHeader(b []byte, t FrameType, n int) {
	b[0] = Version1
	b[1] = byte(t)
	binary.BigEndian.PutUint32(b[2:HeaderSize], uint32(n))
}

// AppendFrame appends the encoding of f to dst. It refuses what ReadFrame
// would refuse with a limit of MaxFrameSize.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxFrameSize {
		return dst, fmt.Errorf("%w: %s payload of %d bytes, the limit is %d", ErrFrameTooLarge, f.Type, len(f.Payload), MaxFrameSize)
	}
	if err := checkHeader(f.Version, f.Type, uint32(len(f.Payload)), MaxFrameSize); err != nil {
		return dst, err
	}
	var h [HeaderSize]byte
	putHeader(h[:], f.Type, len(f.Payload))
	dst = append(dst, h[:]...)
	dst = append(dst, f.Payload...)
	if f.Type.Authenticated() {
		dst = append(dst, f.MAC[:]...)
	}
	return dst, nil
}

// Reader decodes frames from a byte stream. It reuses one payload buffer, so
// a frame's Payload is valid only until the next call to Next. It allocates
// no more than about twice the bytes actually received, whatever a length
// field claims.
type Reader struct {
	r     io.Reader
	limit int
	hdr   [HeaderSize]byte
	buf   []byte
}

// NewReader returns a Reader that refuses payloads over limit bytes. A
// limit <= 0 or above MaxFrameSize means MaxFrameSize.
func NewReader(r io.Reader, limit int) *Reader {
	fr := &Reader{r: r}
	fr.SetLimit(limit)
	return fr
}

// SetLimit changes the payload limit for subsequent frames.
func (r *Reader) SetLimit(limit int) {
	if limit <= 0 || limit > MaxFrameSize {
		limit = MaxFrameSize
	}
	r.limit = limit
}

// ReadFrame decodes one frame from r, refusing payloads over limit bytes
// (see NewReader). It returns io.EOF, unwrapped, only when r ends cleanly
// before the first header byte. Malformed input yields an error wrapping
// ErrBadFrame, ErrFrameTooLarge or ErrUnknownVersion; an error from r itself
// is wrapped as is.
func ReadFrame(r io.Reader, limit int) (Frame, error) {
	return NewReader(r, limit).Next()
}

// Next decodes the next frame; see ReadFrame.
func (r *Reader) Next() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		switch {
		case err == io.EOF:
			return Frame{}, io.EOF
		case errors.Is(err, io.ErrUnexpectedEOF):
			return Frame{}, fmt.Errorf("%w: truncated header: %w", ErrBadFrame, err)
		}
		return Frame{}, fmt.Errorf("peer: read frame header: %w", err)
	}
	f := Frame{Version: r.hdr[0], Type: FrameType(r.hdr[1])}
	n := binary.BigEndian.Uint32(r.hdr[2:])
	if err := checkHeader(f.Version, f.Type, n, r.limit); err != nil {
		return Frame{}, err
	}
	payload, err := r.readPayload(int(n))
	if err != nil {
		return Frame{}, err
	}
	f.Payload = payload
	if f.Type.Authenticated() {
		if _, err := io.ReadFull(r.r, f.MAC[:]); err != nil {
			return Frame{}, truncated("mac", err)
		}
	}
	return f, nil
}

func truncated(what string, err error) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated %s: %w", ErrBadFrame, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("peer: read frame %s: %w", what, err)
}

// readPayload reads exactly n bytes into the reused buffer. Beyond 64 KiB it
// grows the buffer as data arrives, so a hostile length field cannot make
// it allocate memory the peer has not sent.
func (r *Reader) readPayload(n int) ([]byte, error) {
	const step = 64 << 10
	if n <= cap(r.buf) || n <= step {
		if cap(r.buf) < n {
			r.buf = make([]byte, n)
		}
		b := r.buf[:n]
		if _, err := io.ReadFull(r.r, b); err != nil {
			return nil, truncated("payload", err)
		}
		return b, nil
	}
	b := r.buf[:0]
	for len(b) < n {
		want := min(n, max(2*len(b), step))
		if cap(b) < want {
			nb := make([]byte, len(b), want)
			copy(nb, b)
			b = nb
		}
		k, err := io.ReadFull(r.r, b[len(b):want])
		b = b[:len(b)+k]
		if err != nil {
			r.buf = b[:0]
			return nil, truncated("payload", err)
		}
	}
	r.buf = b
	return b, nil
}

// connKind says what a connection is for; the dialer declares it in its
// hello.
type connKind byte

const (
	// kindMsg: a long-lived, one-way connection for ordinary messages.
	kindMsg connKind = 1
	// kindSnap: one MsgSnap per connection, acknowledged by the receiver.
	kindSnap connKind = 2
)

func (k connKind) String() string {
	switch k {
	case kindMsg:
		return "msg"
	case kindSnap:
		return "snap"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// hello is the FrameHello payload.
type hello struct {
	kind   connKind
	dialer uint64 // claimed id of the dialer
	target uint64 // id the dialer expects the listener to have
	nonce  [nonceSize]byte
}

func (h *hello) encode() []byte {
	b := make([]byte, helloSize)
	b[0] = byte(h.kind)
	binary.BigEndian.PutUint64(b[1:], h.dialer)
	binary.BigEndian.PutUint64(b[9:], h.target)
	copy(b[17:], h.nonce[:])
	return b
}

func decodeHello(b []byte) (hello, error) {
	if len(b) != helloSize {
		return hello{}, fmt.Errorf("%w: hello is %d bytes, want %d", ErrBadFrame, len(b), helloSize)
	}
	h := hello{
		kind:   connKind(b[0]),
		dialer: binary.BigEndian.Uint64(b[1:]),
		target: binary.BigEndian.Uint64(b[9:]),
	}
	copy(h.nonce[:], b[17:])
	if h.kind != kindMsg && h.kind != kindSnap {
		return hello{}, fmt.Errorf("%w: unknown connection kind %d", ErrBadFrame, b[0])
	}
	if h.dialer == 0 || h.target == 0 {
		return hello{}, fmt.Errorf("%w: zero node id in hello", ErrBadFrame)
	}
	return h, nil
}

// challenge is the FrameChallenge payload.
type challenge struct {
	listener uint64
	nonce    [nonceSize]byte
	proof    [MACSize]byte
}

func (c *challenge) encode() []byte {
	b := make([]byte, challengeSize)
	binary.BigEndian.PutUint64(b, c.listener)
	copy(b[8:], c.nonce[:])
	copy(b[8+nonceSize:], c.proof[:])
	return b
}

func decodeChallenge(b []byte) (challenge, error) {
	if len(b) != challengeSize {
		return challenge{}, fmt.Errorf("%w: challenge is %d bytes, want %d", ErrBadFrame, len(b), challengeSize)
	}
	var c challenge
	c.listener = binary.BigEndian.Uint64(b)
	copy(c.nonce[:], b[8:])
	copy(c.proof[:], b[8+nonceSize:])
	return c, nil
}

// Snapshot acknowledgement statuses (FrameAck payload).
const (
	ackOK       byte = 0
	ackRejected byte = 1
)

// streamStart is the FrameStreamStart payload. The chunks that follow carry
// metaLen bytes of marshalled message (with Snapshot.Data emptied) and then
// dataLen bytes of Snapshot.Data.
type streamStart struct {
	metaLen, dataLen uint64
}

func (s *streamStart) encode() []byte {
	b := make([]byte, streamStartSize)
	binary.BigEndian.PutUint64(b, s.metaLen)
	binary.BigEndian.PutUint64(b[8:], s.dataLen)
	return b
}

func decodeStreamStart(b []byte) (streamStart, error) {
	if len(b) != streamStartSize {
		return streamStart{}, fmt.Errorf("%w: stream start is %d bytes, want %d", ErrBadFrame, len(b), streamStartSize)
	}
	s := streamStart{metaLen: binary.BigEndian.Uint64(b), dataLen: binary.BigEndian.Uint64(b[8:])}
	if s.metaLen == 0 {
		return streamStart{}, fmt.Errorf("%w: stream without message metadata", ErrBadFrame)
	}
	if s.metaLen > MaxSnapshotSize || s.dataLen > MaxSnapshotSize || s.metaLen+s.dataLen > MaxSnapshotSize {
		return streamStart{}, fmt.Errorf("%w: stream declares %d+%d bytes, the limit is %d", ErrSnapshotTooLarge, s.metaLen, s.dataLen, MaxSnapshotSize)
	}
	return s, nil
}

// decoder turns the session frames of one connection into raft messages:
// single FrameMsg frames, or a FrameStreamStart followed by chunks. It does
// no I/O and checks no MACs (the session does), so it is fuzzed together
// with the frame reader.
type decoder struct {
	streaming bool
	start     streamStart
	meta      []byte
	data      []byte
}

// streamPrealloc caps what a stream start may make the decoder allocate up
// front; beyond it buffers double as chunks arrive (never past the declared
// length), so a 1 GiB snapshot costs about ten reallocations.
const streamPrealloc = 1 << 20

// appendBounded appends p to b, which the caller guarantees never exceeds
// limit bytes, growing capacity by doubling up to limit.
func appendBounded(b, p []byte, limit uint64) []byte {
	if need := len(b) + len(p); need > cap(b) {
		nc := int(min(limit, uint64(max(2*cap(b), need))))
		nb := make([]byte, len(b), nc)
		copy(nb, b)
		b = nb
	}
	return append(b, p...)
}

// push consumes one session frame. done reports that m is a complete message.
// After an error the decoder must not be used again.
func (d *decoder) push(f Frame) (m raftpb.Message, done bool, err error) {
	switch f.Type {
	case FrameMsg:
		if d.streaming {
			return m, false, fmt.Errorf("%w: message frame inside a stream", ErrBadFrame)
		}
		m, err = unmarshalMessage(f.Payload)
		return m, err == nil, err
	case FrameStreamStart:
		if d.streaming {
			return m, false, fmt.Errorf("%w: stream start inside a stream", ErrBadFrame)
		}
		s, err := decodeStreamStart(f.Payload)
		if err != nil {
			return m, false, err
		}
		d.streaming, d.start = true, s
		d.meta = make([]byte, 0, min(s.metaLen, streamPrealloc))
		d.data = make([]byte, 0, min(s.dataLen, streamPrealloc))
		return m, false, nil
	case FrameStreamChunk:
		if !d.streaming {
			return m, false, fmt.Errorf("%w: stream chunk outside a stream", ErrBadFrame)
		}
		p := f.Payload
		if room := d.start.metaLen - uint64(len(d.meta)); room > 0 {
			k := min(uint64(len(p)), room)
			d.meta = appendBounded(d.meta, p[:k], d.start.metaLen)
			p = p[k:]
		}
		if uint64(len(p)) > d.start.dataLen-uint64(len(d.data)) {
			return m, false, fmt.Errorf("%w: stream chunk overruns the declared length", ErrBadFrame)
		}
		d.data = appendBounded(d.data, p, d.start.dataLen)
		if uint64(len(d.meta)) < d.start.metaLen || uint64(len(d.data)) < d.start.dataLen {
			return m, false, nil
		}
		meta, data := d.meta, d.data
		*d = decoder{}
		if m, err = unmarshalMessage(meta); err != nil {
			return m, false, err
		}
		if len(data) > 0 {
			if m.Type != raftpb.MsgSnap || m.Snapshot == nil || len(m.Snapshot.Data) != 0 {
				return raftpb.Message{}, false, fmt.Errorf("%w: stream data for a %s without an empty snapshot", ErrBadFrame, m.Type)
			}
			m.Snapshot.Data = data
		}
		return m, true, nil
	}
	return m, false, fmt.Errorf("%w: unexpected %s frame in a session", ErrBadFrame, f.Type)
}

// fieldResponses is raftpb.Message's only self-recursive field. Responses
// are local to a node (storage-thread messages) and never cross the wire;
// refusing them before Unmarshal also rules out unbounded recursion on a
// hostile nesting.
const fieldResponses = 14

// unmarshalMessage decodes a raftpb.Message, refusing top-level fields a
// network message never has and anything protobuf would choke on.
func unmarshalMessage(b []byte) (raftpb.Message, error) {
	if err := scanTopLevel(b); err != nil {
		return raftpb.Message{}, err
	}
	var m raftpb.Message
	if err := m.Unmarshal(b); err != nil {
		return raftpb.Message{}, fmt.Errorf("%w: raft message: %w", ErrBadFrame, err)
	}
	return m, nil
}

// scanTopLevel walks the top-level protobuf fields of b without decoding
// them and refuses the responses field and group wire types.
func scanTopLevel(b []byte) error {
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("%w: raft message: bad field key", ErrBadFrame)
		}
		b = b[n:]
		field, wire := key>>3, key&7
		if field == fieldResponses {
			return fmt.Errorf("%w: raft message carries local-only responses", ErrBadFrame)
		}
		switch wire {
		case 0:
			_, n := binary.Uvarint(b)
			if n <= 0 {
				return fmt.Errorf("%w: raft message: bad varint", ErrBadFrame)
			}
			b = b[n:]
		case 1, 5:
			w := 8
			if wire == 5 {
				w = 4
			}
			if len(b) < w {
				return fmt.Errorf("%w: raft message: truncated field", ErrBadFrame)
			}
			b = b[w:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return fmt.Errorf("%w: raft message: bad length", ErrBadFrame)
			}
			b = b[n+int(l):]
		default:
			return fmt.Errorf("%w: raft message: wire type %d", ErrBadFrame, wire)
		}
	}
	return nil
}
