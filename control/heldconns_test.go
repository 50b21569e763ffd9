package control

import (
	"crypto/tls"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// dialSlowBody opens a TLS connection from the loopback address ip, sends
// the headers of a request to path whose body never arrives (one byte of
// a declared 4096) and leaves it so: the server reads its body, the
// connection serves a request. Skipped where ip cannot be bound.
func dialSlowBody(t *testing.T, ip, addr, path, credential string) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 3 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the attacker need not trust the server
	if err != nil {
		t.Skipf("cannot dial from %s (%v)", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	auth := ""
	if credential != "" {
		auth = "Authorization: Bearer " + credential + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{", path, auth); err != nil {
		t.Fatal(err)
	}
}

// Connections that serve a request are never evicted, so an attacker who
// keeps MaxConns requests in progress, each with a body that trickles in
// (a POST to /v1/identity, which needs no credential, or to any admin
// path with a wrong one), from MaxConns/MaxConnsPerSource addresses, kept
// every admin call out: the admin's new connection found no room. A
// request whose body has not arrived is not served yet: it may not keep
// the admin out.
func TestSlowBodiesDoNotLockOutTheAdmin(t *testing.T) {
	for _, tc := range []struct{ name, path, credential string }{
		{"identity, no credential", "/v1/identity", ""},
		{"admin path, wrong credential", "/v1/members", "wrong-credential-0000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, url, opts := tlsPlane(t, nil)
			for _, ip := range manySources(MaxConnsDefault/MaxConnsPerSourceDefault+1, MaxConnsPerSourceDefault) {
				dialSlowBody(t, ip, p.Addr(), tc.path, tc.credential)
			}
			testkit.Eventually(t, 5*time.Second, "the slow requests accepted", func() bool {
				total, _ := p.conns.Len("")
				return total == MaxConnsDefault
			})
			if ok, last := adminCalls(t, url, 5, opts); ok != 5 {
				t.Fatalf("%d of 5 admin calls succeeded while %d requests trickled their bodies (last error: %v)", ok, MaxConnsDefault, last)
			}
		})
	}
}
