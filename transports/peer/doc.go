// Package peer is ticketd's raft peer transport: it carries raftpb.Message
// values between the members of one cluster over their own TCP listener,
// never over the client bus.
//
// # What it owns
//
// The peer listener and the connections to and from every other member:
// the Transport, its configuration and its peer table (transport.go); the
// wire format (frame.go); the authentication handshake (handshake.go);
// authenticated sessions with per-frame integrity, and how either side
// opens one (session.go); per-peer bounded send queues, one writer per
// peer and reconnection with backoff (outbound.go); snapshot streaming
// (snapshot.go); which inbound connections wait for their handshake
// (admission.go); and the accept loop and delivery of inbound messages
// (inbound.go). It does not own raft state: it delivers to the local raft
// node through the Raft interface (Step, ReportUnreachable,
// ReportSnapshot; raft.Node satisfies it), bound by Start. Fault injection
// for tests and the harness goes through SetFilter.
//
// # Connections
//
// Connections are one-way. Each node dials every peer it sends to and
// keeps one long-lived message connection per peer; the listener only
// reads from it. Every MsgSnap travels on a connection of its own, so a
// large snapshot never holds up heartbeats and appends; the receiver
// answers it with one acknowledgement. A new authenticated connection of a
// peer replaces its previous one of the same kind.
//
// # Frame format
//
// Every frame is
//
//	version:1 | type:1 | length:4 (big endian) | payload:length | mac:32 (session frames only)
//
// version is Version1; any other value is ErrUnknownVersion. Handshake
// frames (hello, challenge, proof, reject) have fixed payload sizes and no
// MAC. Session frames (accept, msg, stream-start, stream-chunk, ack) carry
// an HMAC-SHA256 trailer, not counted in length:
//
//	mac = HMAC-SHA256(direction key, seq:8 | header:6 | payload)
//
// where seq numbers the frames of one direction of one connection from 0,
// so a forged, altered, replayed, dropped or reordered frame fails the
// check (ErrBadMAC) and the connection is closed.
//
// Payloads:
//
//	hello        kind:1 | dialer id:8 | listener id expected:8 | dialer nonce:32
//	challenge    listener id:8 | listener nonce:32 | listener proof:32
//	proof        dialer proof:32
//	reject       reason:1 (1 unknown peer, 2 wrong target id, 3 bad proof)
//	accept       empty
//	msg          one marshalled raftpb.Message, 1..MaxFrameSize bytes
//	stream-start meta length:8 | data length:8
//	stream-chunk the next 1..MaxFrameSize bytes of the stream
//	ack          0 delivered, 1 refused
//
// A message that does not fit in one frame (a snapshot, in practice) is
// streamed: stream-start, then chunks of at most ChunkSize carrying the
// message marshalled with Snapshot.Data emptied ("meta"), then the bytes of
// Snapshot.Data. The receiver rebuilds the message without copying the
// data again. Nothing else may interleave with a stream.
//
// ReadFrame and Reader decode frames from any io.Reader and return errors
// wrapping ErrBadFrame, ErrFrameTooLarge or ErrUnknownVersion; they check
// the header against the per-type layout and the limit before reading the
// payload, and allocate only as bytes arrive. FuzzReadFrame fuzzes them
// together with the stream reassembly and message decoding.
//
// # Handshake
//
// The cluster secret never crosses the wire. On a new connection (inside
// TLS when Config.TLS is set):
//
//  1. dialer -> listener: hello with its id, the id it expects the
//     listener to have, and a fresh random nonce Nd.
//  2. The listener checks the expected id is its own and the dialer's id is
//     a member (else it sends reject and closes), then answers with a
//     challenge: its id, a fresh nonce Nl, and
//     HMAC(secret, "listener proof" | transcript).
//  3. The dialer checks the id and the proof (else reject and close) and
//     sends HMAC(secret, "dialer proof" | transcript).
//  4. The listener checks the proof (else reject and close) and sends an
//     accept, the first session frame.
//
// The transcript is version | kind | dialer id | listener id | Nd | Nl |
// TLS channel binding (an RFC 5705 exporter value, empty without TLS).
// Both sides derive one session key per direction,
// HMAC(secret, "key dialer->listener" | transcript) and its mirror. Fresh
// nonces on both sides make a recorded handshake useless on a new
// connection; the labels keep a listener's proof from serving as a
// dialer's. Without TLS the traffic is authenticated but not encrypted:
// anyone on the path reads every lock key, owner and token, and the
// cluster's fence signing seeds (in raft entries and snapshots), with
// which it can sign fences every resource accepts. A peer network
// that is not loopback should therefore use mutual TLS (Config.TLS with
// client certificates required; ticketd serve --peer-tls-cert, --peer-tls-key,
// --peer-tls-ca), which the daemon warns about when it is missing.
//
// After the handshake every message must have From equal to the
// authenticated peer id and To equal to our id, and must not be a
// raft-local type; anything else is logged, counted in Stats.Rejected and
// closes the connection. Nothing unauthenticated ever reaches Raft.Step.
//
// # Limits
//
//   - MaxFrameSize (4 MiB) bounds a frame payload; handshake frames are
//     read with a limit of a few dozen bytes.
//   - MaxSnapshotSize (2 GiB, above the snapshot of the largest lock
//     table a node can hold) bounds one streamed message; the receiver
//     preallocates at most 1 MiB and grows as chunks arrive.
//   - Inbound connections not yet authenticated are bounded so that a
//     member always gets through, however many addresses a flood comes
//     from (admission.go, internal/connlimit): at most
//     MaxPendingHandshakesPerSource (8) from one source address and
//     MaxPendingHandshakes (64) from addresses that are not a member's; a
//     new connection beyond either evicts the oldest pending one (of its
//     address, or of all strangers) instead of being refused. A member's
//     addresses (the IP of its peer address, what its host name resolves
//     to, every 30 s, and the addresses it authenticated from) are
//     reserved: outside the 64, and never evicted by anyone else. A
//     connection must send its hello, TLS handshake included, within
//     HelloTimeout (2 s) and finish within HandshakeTimeout (5 s).
//   - Config.QueueSize (QueueSizeDefault 4096) bounds each peer's queue.
//     Send never blocks: a message that does not fit is dropped and counted
//     (raft tolerates loss); so is everything queued while a peer is
//     unreachable.
//   - Reconnects back off from BackoffMin (50ms) to BackoffMax (2s) with
//     jitter; an authenticated inbound connection from the member ends the
//     wait (it is up now: wakePeer). DialTimeout, WriteTimeout and
//     SnapshotTimeout bound the rest.
//
// # Failure reporting
//
// A failed dial or a lost connection calls Raft.ReportUnreachable. While
// the transport runs, each MsgSnap given to Send ends in one
// Raft.ReportSnapshot: SnapshotFinish once the receiver has
// acknowledged delivering it to its Raft.Step, SnapshotFailure if it could
// not be queued, was filtered, or the stream or acknowledgement failed
// (snapshots still queued when the transport closes or the peer is removed
// are not reported). Raft's methods are called from transport goroutines,
// never from Send.
//
// Logs an unauthenticated party can trigger (refused handshakes) are
// limited to a few per second; the counters in Stats are not. Collector
// (metrics.go) exports them to Prometheus (ticketd_peer_*), read at
// scrape time.
package peer
