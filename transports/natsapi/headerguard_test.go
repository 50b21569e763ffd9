package natsapi

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// chunkConn returns its data k bytes per Read.
type chunkConn struct {
	net.Conn
	data []byte
	k    int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.k)], c.data)
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkConn) Close() error { return nil }

func guardAll(t *testing.T, in string, k int) (string, error) {
	t.Helper()
	g := GuardConn(&chunkConn{data: []byte(in), k: k})
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := g.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return string(out), nil
		}
		if err != nil {
			return string(out), err
		}
	}
}

// Every bare LF of a header block becomes a space, wherever the reads
// split the stream; nothing else changes: payloads (bare LFs and all),
// INFO, PING, +OK, -ERR and MSG lines.
func TestGuardConnRewritesOnlyHeaderBareLF(t *testing.T) {
	hdr := "NATS/1.0\r\nX-A: 1\nNats-Request-Info: {\"acc\":\"A\"}\n\r\nNats-Request-Info: {\"acc\":\"B\"}\r\n\r\n"
	want := strings.ReplaceAll(strings.ReplaceAll(hdr, "\r\n", "\x00"), "\n", " ")
	want = strings.ReplaceAll(want, "\x00", "\r\n")
	payload := "line1\nHMSG fake 1 5 5\r\n\nNATS\n"
	hmsg := func(h string) string {
		return "HMSG ticketd.v1.lock.acquire 7 _R_.abc.def " + itoa(len(h)) + " " + itoa(len(h)+len(payload)) + "\r\n" + h + payload + "\r\n"
	}
	in := `INFO {"server_id":"x","max_payload":1048576,"headers":true,"connect_urls":["` + strings.Repeat("a", 300) + `"]}` + "\r\n" +
		"PING\r\n+OK\r\n-ERR 'Permissions Violation'\r\n" +
		"MSG a.b 1 " + itoa(len(payload)) + "\r\n" + payload + "\r\n" +
		hmsg(hdr) +
		"MSG a.b 2 reply.x " + itoa(len(payload)) + "\r\n" + payload + "\r\n" +
		"HMSG a.b 3 0 " + itoa(len(payload)) + "\r\n" + payload + "\r\n" +
		hmsg(hdr) + "PONG\r\n"
	expect := strings.Replace(in, hdr, want, -1)
	if expect == in {
		t.Fatal("the test's header has no bare LF")
	}
	for k := 1; k <= len(in); k++ {
		got, err := guardAll(t, in, k)
		if err != nil {
			t.Fatalf("reads of %d bytes: %v", k, err)
		}
		if got != expect {
			t.Fatalf("reads of %d bytes:\n got %q\nwant %q", k, got, expect)
		}
	}
	// What nats.go now reads is the server's identity only.
	h, err := nats.DecodeHeadersMsg([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	if vs := h.Values(HeaderRequestInfo); len(vs) != 1 || vs[0] != `{"acc":"B"}` {
		t.Fatalf("Nats-Request-Info after the guard: %q", vs)
	}
}

// A line the guard cannot follow closes the connection rather than let
// a header block through unread.
func TestGuardConnRefusesWhatItCannotFollow(t *testing.T) {
	for _, in := range []string{
		"HMSG a 1 x\r\n",
		"HMSG a 1 10 5\r\n",
		"MSG a 1 -3\r\n",
		"MSG a 1 9223372036854775807\r\n",
		"HMSG a 1 reply 2 3 4\r\n",
		"MSG a\r\n",
		"HMSG " + strings.Repeat("a", maxGuardLine) + "\r\n",
	} {
		if _, err := guardAll(t, in, 7); !errors.Is(err, ErrGuardProtocol) {
			t.Errorf("%.40q: %v, want ErrGuardProtocol", in, err)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// BenchmarkGuardConn: what the guard adds per request the node reads (an
// imported acquire: its HMSG line, nats-server's Nats-Request-Info, a body).
func BenchmarkGuardConn(b *testing.B) {
	hdr := "NATS/1.0\r\nNats-Request-Info: {\"acc\":\"TENANT_A\",\"rtt\":1043812,\"host\":\"127.0.0.1\",\"id\":12,\"user\":\"alice\",\"name\":\"svc\",\"lang\":\"go\",\"ver\":\"1.56.0\"}\r\n\r\n"
	body := `{"key":"a/orders/42","lease_ms":10000,"owner":"worker-1"}`
	msg := []byte("HMSG ticketd.v1.lock.acquire 1 _R_.abc123.def456 " + strconv.Itoa(len(hdr)) + " " + strconv.Itoa(len(hdr)+len(body)) + "\r\n" + hdr + body + "\r\n")
	g := &guardConn{}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if err := g.scan(msg); err != nil {
			b.Fatal(err)
		}
	}
}
