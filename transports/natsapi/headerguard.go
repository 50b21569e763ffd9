package natsapi

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Header guard: the node's connection reads headers as nats-server does.
//
// nats-server and nats.go split a message's header block into lines
// differently. nats-server finds (and, on a request crossing a service
// import, removes) a client's Nats-Request-Info only at the start of a
// line ended by CRLF (server/client.go, getHeaderKeyIndex), then appends
// its own at the end of the block; nats.go ends a line at any LF and the
// block at the first empty line (nats.go, readMIMEHeader). So a client
// that writes "X: 1\nNats-Request-Info: {\"acc\":\"TENANT_A\"}\n\r\n" gets
// its line past the server, and nats.go reads it, and stops before the
// server's: the node would believe the forged identity.
//
// GuardConn closes that gap on the node's own connection: in every header
// block it receives, an LF that does not end a CRLF (one nats-server
// never treats as a line end) becomes a space, in place, before nats.go
// parses it. nats.go then sees exactly the lines nats-server saw, so the
// only Nats-Request-Info it can read after an import is the server's.
// Payloads pass untouched; the guard follows the protocol only far enough
// to know where each header block starts and ends.

// maxGuardLine bounds a protocol line the guard reads whole (MSG and HMSG
// lines: subject, sid, reply and sizes). nats-server's own control lines
// are far shorter (max_control_line, 4 KiB by default); INFO and -ERR
// lines, which the guard does not read whole, may be longer.
const maxGuardLine = 64 << 10

// maxGuardMsg bounds the message sizes the guard accepts: far above
// nats-server's largest max_payload (1 GiB), far below an overflow.
const maxGuardMsg = 1 << 32

// ErrGuardProtocol: the server sent something the header guard could not
// follow; the connection is closed (nats.go reconnects).
var ErrGuardProtocol = errors.New("natsapi: header guard: unexpected NATS protocol line")

// GuardedInProcess is a nats.InProcessConnProvider whose connections are
// guarded (GuardConn): the node's connection to its embedded server.
type GuardedInProcess struct {
	Server nats.InProcessConnProvider
}

var _ nats.InProcessConnProvider = GuardedInProcess{}

// InProcessConn opens a guarded in-process connection.
func (g GuardedInProcess) InProcessConn() (net.Conn, error) {
	c, err := g.Server.InProcessConn()
	if err != nil {
		return nil, err
	}
	return GuardConn(c), nil
}

// GuardConn wraps a plain (not TLS) NATS client connection so that header
// blocks read from it are split into lines as nats-server splits them.
func GuardConn(c net.Conn) net.Conn { return &guardConn{Conn: c} }

// guard states: where the next byte read falls.
const (
	guardLine    = iota // a protocol line (the op's first bytes in line)
	guardSkipEOL        // the rest of a line the guard does not need
	guardHeader         // header bytes of an HMSG (hdr left)
	guardPayload        // payload and trailing CRLF (skip left)
)

// guardConn rewrites, in the bytes Read returns, every bare LF of a header
// block. Read is called by nats.go's reader goroutine only.
type guardConn struct {
	net.Conn
	state  int
	line   []byte // the current MSG/HMSG line, bounded by maxGuardLine
	hdr    int    // header bytes left
	skip   int    // payload bytes (and CRLF) left
	prevCR bool   // the last header byte was CR
	err    error
}

func (g *guardConn) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if perr := g.scan(p[:n]); perr != nil {
		g.err = perr
		_ = g.Conn.Close()
		return 0, perr
	}
	return n, err
}

// scan follows the protocol through b, rewriting bare LFs of header
// blocks in place.
func (g *guardConn) scan(b []byte) error {
	for len(b) > 0 {
		switch g.state {
		case guardPayload:
			k := min(g.skip, len(b))
			g.skip -= k
			b = b[k:]
			if g.skip == 0 {
				g.state = guardLine
			}
		case guardHeader:
			k := min(g.hdr, len(b))
			for i, c := range b[:k] {
				if c == '\n' && !g.prevCR {
					b[i] = ' '
				}
				g.prevCR = c == '\r'
			}
			g.hdr -= k
			b = b[k:]
			if g.hdr == 0 {
				g.state = guardPayload
			}
		case guardSkipEOL:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				return nil
			}
			b = b[i+1:]
			g.state = guardLine
		case guardLine:
			i := bytes.IndexByte(b, '\n')
			end := len(b)
			if i >= 0 {
				end = i + 1
			}
			if len(g.line)+end > maxGuardLine {
				return fmt.Errorf("%w: a line of more than %d bytes", ErrGuardProtocol, maxGuardLine)
			}
			g.line = append(g.line, b[:end]...)
			b = b[end:]
			if !isMsgLine(g.line) && (len(g.line) >= len("HMSG ") || i >= 0) {
				// INFO, PING, PONG, +OK, -ERR: nothing to guard.
				g.line = g.line[:0]
				if i < 0 {
					g.state = guardSkipEOL
				}
				continue
			}
			if i < 0 {
				return nil
			}
			err := g.startMsg(g.line)
			g.line = g.line[:0]
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// isMsgLine tells whether line (possibly partial) is or may become an
// MSG or HMSG line.
func isMsgLine(line []byte) bool {
	for _, op := range [][]byte{[]byte("MSG "), []byte("HMSG ")} {
		k := min(len(op), len(line))
		if bytes.EqualFold(line[:k], op[:k]) {
			return true
		}
	}
	return false
}

// startMsg reads the sizes of an MSG or HMSG line and sets up the states
// that follow it.
func (g *guardConn) startMsg(line []byte) error {
	var buf [6][]byte // HMSG subject sid reply hdr total
	f, ok := fields(line, buf[:0])
	bad := func() error { return fmt.Errorf("%w: %q", ErrGuardProtocol, bytes.TrimSpace(line)) }
	if !ok {
		return bad()
	}
	size := func(b []byte) (int, bool) {
		n, err := strconv.Atoi(string(b))
		return n, err == nil && n >= 0 && n <= maxGuardMsg
	}
	if len(f[0]) == len("MSG") { // MSG subject sid [reply] size
		if len(f) < 4 || len(f) > 5 {
			return bad()
		}
		total, ok := size(f[len(f)-1])
		if !ok {
			return bad()
		}
		g.hdr, g.skip = 0, total+2
		g.state = guardPayload
		return nil
	}
	// HMSG subject sid [reply] hdr_size total_size
	if len(f) < 5 || len(f) > 6 {
		return bad()
	}
	hdr, ok1 := size(f[len(f)-2])
	total, ok2 := size(f[len(f)-1])
	if !ok1 || !ok2 || hdr > total {
		return bad()
	}
	g.hdr, g.skip, g.prevCR = hdr, total-hdr+2, false
	g.state = guardHeader
	if hdr == 0 {
		g.state = guardPayload
	}
	return nil
}

// fields splits line at spaces and tabs (a protocol line's separators)
// into dst; false when it has more fields than cap(dst).
func fields(line []byte, dst [][]byte) ([][]byte, bool) {
	line = bytes.TrimRight(line, "\r\n")
	for {
		line = bytes.TrimLeft(line, " \t")
		if len(line) == 0 {
			return dst, true
		}
		if len(dst) == cap(dst) {
			return dst, false
		}
		i := bytes.IndexAny(line, " \t")
		if i < 0 {
			i = len(line)
		}
		dst = append(dst, line[:i])
		line = line[i:]
	}
}
