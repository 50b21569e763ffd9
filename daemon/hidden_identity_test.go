package daemon_test

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// reply reads the next MSG or HMSG the server sends and returns its
// payload (headers included, as sent).
func (rc *rawClient) reply(t *testing.T) string {
	t.Helper()
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] != "MSG" && f[0] != "HMSG") {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(f[len(f)-1], "%d", &n); err != nil {
			t.Fatalf("bad line %q", line)
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, b); err != nil {
			t.Fatal(err)
		}
		return string(b[:n])
	}
}

// A tenant cannot shed its identity either: a header block with an empty
// line, a line without a colon, or a line that starts with a bare CR,
// before its end, hides the Nats-Request-Info that nats-server appends on
// the import from a reader that stops, or skips, there. Such a request
// was served as anonymous: alice, at her --max-locks-per-identity of 1,
// got another lock under the anonymous identity, and would get whatever
// an access list grants "". It is refused now, and nothing is granted.
func TestHiddenRequestInfoIsNotAnonymous(t *testing.T) {
	d := startTenantNode(t, func(cfg *daemon.Config) { cfg.MaxLocksPerIdentity = 1 })
	alice := dialRaw(t, d.ClientURL(), "alice")
	fmt.Fprintf(alice.c, "SUB _INBOX.hidden.* 1\r\n")
	for i, hdr := range []string{
		"NATS/1.0\r\nX-A: 1\r\n\r\nX-B: 2\r\n\r\n", // an empty line before the end
		"NATS/1.0\r\n\r\n\r\n",                     // only empty lines
		"NATS/1.0\r\nX-A: 1\r\n\r\r\n",             // the server's line would start after a bare CR
		"NATS/1.0\r\nX-A: 1\r\n\r",                 // a block that does not end in CRLF
		"NATS/1.0\r\nno colon\r\n\r\n",             // a line nats.go cannot parse: no headers at all
	} {
		body := fmt.Sprintf(`{"key":"hide/%d","lease_ms":60000}`, i)
		fmt.Fprintf(alice.c, "HPUB %s _INBOX.hidden.%d %d %d\r\n%s%s\r\n", protocol.SubjectAcquire, i, len(hdr), len(hdr)+len(body), hdr, body)
		got := alice.reply(t)
		var l core.Lock
		var held bool
		d.Node().View(func(m *core.Machine) { l, held = m.Get(fmt.Sprintf("hide/%d", i)) })
		if held {
			t.Errorf("header %q: granted to identity %q (reply %q), want refused", hdr, l.Identity, got)
			continue
		}
		if !strings.Contains(got, "permission_denied") || strings.Contains(got, "anonymous") {
			t.Errorf("header %q: reply %q, want permission_denied", hdr, got)
		}
	}
	// Well-formed headers are served as alice.
	alice.hpub(t, protocol.SubjectAcquire, "NATS/1.0\r\nX-A: 1\r\n\r\n", `{"key":"hide/ok","lease_ms":60000}`)
	var l core.Lock
	testkit.Eventually(t, 10*time.Second, "alice's lock granted", func() bool {
		var ok bool
		d.Node().View(func(m *core.Machine) { l, ok = m.Get("hide/ok") })
		return ok
	})
	if l.Identity != "TENANT_A/alice" {
		t.Fatalf("alice's lock records %q", l.Identity)
	}
}

// A header block Go's NATS client cannot parse is reported on the node's
// connection as an asynchronous error, which nats.go's default handler
// writes to stderr, one line per message and queued without bound: any
// tenant could flood the node's stderr (and its memory, while the writes
// lag). The node's handler logs them through a limit instead.
func TestUndecodableHeadersDoNotFloodStderr(t *testing.T) {
	const flood = 300
	d := startTenantNode(t, func(*daemon.Config) {})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	defer func() { os.Stderr = stderr }()
	var captured strings.Builder
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(&captured, r)
	}()
	alice := dialRaw(t, d.ClientURL(), "alice")
	fmt.Fprintf(alice.c, "SUB _INBOX.bad.* 1\r\n")
	hdr, body := "NATS/1.0\r\nno colon\r\n\r\n", `{"key":"bad","lease_ms":1000}`
	for i := range flood {
		fmt.Fprintf(alice.c, "HPUB %s _INBOX.bad.%d %d %d\r\n%s%s\r\n", protocol.SubjectAcquire, i, len(hdr), len(hdr)+len(body), hdr, body)
	}
	for range flood {
		alice.reply(t)
	}
	os.Stderr = stderr
	_ = w.Close()
	<-copied
	if n := strings.Count(captured.String(), "could not decode headers"); n > 0 {
		t.Fatalf("%d of %d undecodable header blocks written to stderr", n, flood)
	}
}
