package control

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// One IPv6 host is usually given a whole /64, and picks any address in it
// for each new connection: counted per address, a guesser would get a
// fresh failure budget (and connection share) per connection. Sources are
// IPv4 addresses and IPv6 /64 networks, the same for the failure limiter
// and the connection table.
func TestSourcesAreIPv6Networks(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	l := newFailureLimiter(3, time.Hour, func() time.Time { return now })
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	for i := range 3 { // the guesser, a new address of its /64 for each attempt
		if !l.failed(sourceOfAddr(tcp(fmt.Sprintf("2001:db8:1:2::%x", i+1)))) {
			t.Fatalf("attempt %d refused within the burst", i+1)
		}
	}
	if ok, _ := l.allowed(sourceOfAddr(tcp("2001:db8:1:2:ffff:eeee:dddd:9"))); ok {
		t.Fatal("another address of the guesser's /64 starts with a fresh budget")
	}
	if ok, _ := l.allowed(sourceOfAddr(tcp("2001:db8:1:3::1"))); !ok {
		t.Fatal("the next /64 is throttled for the guesser's failures")
	}
	for _, tc := range []struct{ remote, want string }{
		{"[2001:db8:1:2::77]:443", "2001:db8:1:2::/64"},
		{"10.0.0.7:443", "10.0.0.7"},
		{"[::ffff:10.0.0.7]:443", "10.0.0.7"},
		{"[::1]:443", "::/64"},
	} {
		r := &http.Request{RemoteAddr: tc.remote}
		addr, err := net.ResolveTCPAddr("tcp", tc.remote)
		if err != nil {
			t.Fatal(err)
		}
		if got, conn := sourceOf(r), sourceOfAddr(addr); got != tc.want || conn != tc.want {
			t.Errorf("%s: request source %q, connection source %q, want %q for both", tc.remote, got, conn, tc.want)
		}
	}
}
