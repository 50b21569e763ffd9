package daemon_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// rawClient is a NATS client written by hand, as an attacker would: it
// sends header blocks that no NATS library would write.
type rawClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, url, user string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "nats://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	rc := &rawClient{c: c, r: bufio.NewReader(c)}
	if _, err := rc.r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"user\":%q,\"pass\":%q,\"headers\":true,\"verbose\":false,\"pedantic\":false}\r\nPING\r\n", user, user+"-password")
	if line, err := rc.r.ReadString('\n'); err != nil || line != "PONG\r\n" {
		t.Fatalf("connect as %s: %q %v", user, line, err)
	}
	return rc
}

// hpub publishes body with the header block hdr (as given, bytes and all)
// and a reply subject, and waits for the server to have read it.
func (rc *rawClient) hpub(t *testing.T, subject, hdr, body string) {
	t.Helper()
	fmt.Fprintf(rc.c, "HPUB %s _INBOX.forge.%d %d %d\r\n%s%s\r\nPING\r\n", subject, time.Now().UnixNano(), len(hdr), len(hdr)+len(body), hdr, body)
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "PONG\r\n" {
			return
		}
		if strings.HasPrefix(line, "-ERR") {
			t.Fatalf("server refused the publish: %q", line)
		}
	}
}

// The identity nats-server writes on a request that crosses a service
// import cannot be forged with a header line nats-server does not see as a
// line: one ended by a bare LF, or after an empty line that hides the
// server's own header from a reader that splits at LF. bob (TENANT_B)
// claims to be TENANT_A/alice in each way; every lock he gets records him.
func TestForgedRequestInfoLineEndings(t *testing.T) {
	d := startTenantNode(t, func(*daemon.Config) {})
	bob := dialRaw(t, d.ClientURL(), "bob")
	forged := `{"acc":"TENANT_A","user":"alice"}`
	for i, hdr := range []string{
		"NATS/1.0\r\nX-A: 1\nNats-Request-Info: " + forged + "\r\n\r\n",           // the forged line and the server's
		"NATS/1.0\nNats-Request-Info: " + forged + "\r\n\r\n",                     // forged in the status line
		"NATS/1.0\r\nX-A: 1\nNats-Request-Info: " + forged + "\n\r\n\r\n",         // an empty line hides the server's
		"NATS/1.0\nNats-Request-Info: " + forged + "\n\r\n\r\n",                   // both
		"NATS/1.0\r\nNats-Request-Info: " + forged + "\r\n\r\n",                   // plain: the server replaces it
		"NATS/1.0\r\nnats-request-info: " + forged + "\r\n\r\n",                   // another case
		"NATS/1.0\r\nX-A: 1\nNats-Request-Info: " + forged + "\n\nX-B: 2\r\n\r\n", // empty line ended by bare LFs
	} {
		key := fmt.Sprintf("forge/%d", i)
		bob.hpub(t, protocol.SubjectAcquire, hdr, fmt.Sprintf(`{"key":%q,"lease_ms":60000}`, key))
		var l core.Lock
		testkit.Eventually(t, 10*time.Second, key+" granted", func() bool {
			var ok bool
			d.Node().View(func(m *core.Machine) { l, ok = m.Get(key) })
			return ok
		})
		if l.Identity != "TENANT_B/bob" {
			t.Errorf("header %q: the lock records identity %q, want TENANT_B/bob", hdr, l.Identity)
		}
	}
}
