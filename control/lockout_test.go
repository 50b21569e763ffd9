package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// tlsPlane serves the control API of a leader over TLS on 127.0.0.1 and
// returns its https URL and the options of a client that trusts it.
func tlsPlane(t *testing.T, mod func(*Config)) (*Plane, string, []CallOption) {
	t.Helper()
	files := testkit.TLS(t)
	server, err := ServerTLS(files.Cert, files.Key, "")
	if err != nil {
		t.Fatal(err)
	}
	l := &fakeLeadership{}
	l.leader.Store(true)
	cfg := Config{ID: 1, Node: newFakeNode(), Leadership: l, Credential: testAdmin, Listen: "127.0.0.1:0", TLS: server,
		Logger: testkit.QuietLogger()}
	if mod != nil {
		mod(&cfg)
	}
	p := New(cfg)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	client, err := ClientTLS(files.CA, "", "")
	if err != nil {
		t.Fatal(err)
	}
	return p, "https://" + p.Addr(), []CallOption{WithTLS(client)}
}

// adminCalls makes n admin calls, each on a new connection as the CLI
// does, and returns how many succeeded and the last error.
func adminCalls(t *testing.T, url string, n int, opts []CallOption) (int, error) {
	t.Helper()
	var ok int
	var last error
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := Call(ctx, []string{url}, "/v1/members", testAdmin, Request{}, opts...)
		cancel()
		if err == nil {
			ok++
		} else {
			last = err
		}
	}
	return ok, last
}

// dialIdle opens a TCP connection from the loopback address ip and leaves
// it silent; the test is skipped where ip cannot be bound.
func dialIdle(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from %s (%v): this system routes only 127.0.0.1", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The lockout: about five wrong bearer tokens a second from the
// admin's own address kept the admin's correct credential answered
// too_many_attempts, 10 tries of 10. A correct credential is never
// refused for its source's failures; the wrong ones still are.
func TestWrongTokensDoNotLockOutTheAdmin(t *testing.T) {
	_, url, opts := tlsPlane(t, func(c *Config) { c.FailureDelay = 50 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	began := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	wg.Add(1)
	go func() { // the guesser, on the admin's address: 5 a second, for the test's life at most
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 500 && ctx.Err() == nil; i++ {
			cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := Call(cctx, []string{url}, "/v1/members", fmt.Sprintf("wrong-guess-%04d-padding", i), Request{}, opts...)
			ccancel()
			var ce *Error
			if errors.As(err, &ce) {
				mu.Lock()
				codes[ce.Code]++
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	// Let the guesser spend the source's whole burst first.
	testkit.Eventually(t, 20*time.Second, "the source throttled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return codes[CodeTooManyAttempts] > 0
	})
	ok, last := adminCalls(t, url, 10, opts)
	cancel()
	wg.Wait()
	if ok != 10 {
		t.Fatalf("%d of 10 admin calls succeeded while a guesser shared the address (last error: %v)", ok, last)
	}
	// The burst, and one attempt earned back per FailureRefillDefault.
	if most := FailureBurstDefault + int(time.Since(began)/FailureRefillDefault) + 1; codes[CodeUnauthorized] > most {
		t.Fatalf("the guesser got %v: its failures are no longer limited", codes)
	}
}

// A source over its failure budget has each credential checked only after
// FailureDelay, and its connections are evictable meanwhile: however many
// it opens, it gets at most about MaxConnsPerSource checks per delay.
func TestThrottledSourceChecksBounded(t *testing.T) {
	const delay = 200 * time.Millisecond
	p, url, opts := tlsPlane(t, func(c *Config) { c.FailureBurst, c.FailureDelay = 2, delay })
	for range 3 {
		adminCallsWith(t, url, "wrong-credential-000000", opts)
	}
	if ok, _ := p.failures.allowed("127.0.0.1"); ok {
		t.Fatal("the source is not throttled after its burst")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	began := time.Now()
	for g := range 4 * MaxConnsPerSourceDefault {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 {
				err := adminCallsWith(t, url, fmt.Sprintf("wrong-credential-%d-%d", g, i), opts)
				var ce *Error
				if errors.As(err, &ce) && ce.Code == CodeTooManyAttempts {
					mu.Lock()
					answered++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	// One more round may finish as the clock runs out.
	if most := MaxConnsPerSourceDefault * (int(elapsed/delay) + 1); answered > most {
		t.Fatalf("%d guesses checked in %v from one source; want at most %d", answered, elapsed, most)
	}
	if ok, _ := adminCalls(t, url, 1, opts); ok != 1 {
		t.Fatal("the correct credential refused from a throttled source")
	}
}

func adminCallsWith(t *testing.T, url, credential string, opts []CallOption) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Call(ctx, []string{url}, "/v1/members", credential, Request{}, opts...)
	return err
}

// The second lockout: 64 idle TCP connections (before TLS) made
// every admin call fail with EOF. Connections are limited per source, and
// a new one evicts the oldest idle or unauthenticated one, of its own
// source or of all, so no flood of idle connections keeps an admin out.
func TestIdleConnectionsDoNotLockOutTheAdmin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources []string // one idle connection per entry
		held    int      // how many of them the listener keeps
	}{
		{"64 from one other address", repeat("127.0.3.1", MaxConnsDefault), MaxConnsPerSourceDefault},
		{"64 from the admin's address", repeat("127.0.0.1", MaxConnsDefault), MaxConnsPerSourceDefault},
		{"72 from 9 addresses", manySources(9, MaxConnsPerSourceDefault), MaxConnsDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, url, opts := tlsPlane(t, func(c *Config) { c.HandshakeTimeout = time.Minute })
			for _, ip := range tc.sources {
				dialIdle(t, ip, p.Addr())
			}
			testkit.Eventually(t, 5*time.Second, "the idle connections accepted", func() bool {
				total, _ := p.conns.Len("")
				return total == tc.held
			})
			if ok, last := adminCalls(t, url, 10, opts); ok != 10 {
				t.Fatalf("%d of 10 admin calls succeeded (last error: %v)", ok, last)
			}
			total, fromOne := p.conns.Len(tc.sources[0])
			if total > MaxConnsDefault || fromOne > MaxConnsPerSourceDefault {
				t.Fatalf("%d connections held, %d from %s", total, fromOne, tc.sources[0])
			}
		})
	}
}

func repeat(ip string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = ip
	}
	return out
}

func manySources(sources, each int) []string {
	var out []string
	for s := range sources {
		out = append(out, repeat(fmt.Sprintf("127.0.3.%d", s+1), each)...)
	}
	return out
}

// A connection that does not finish its TLS handshake within
// HandshakeTimeout is closed.
func TestControlHandshakeTimeout(t *testing.T) {
	p, _, _ := tlsPlane(t, func(c *Config) { c.HandshakeTimeout = 100 * time.Millisecond })
	c := dialIdle(t, "127.0.0.1", p.Addr())
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silent connection outlived the handshake timeout: %v", err)
	}
}

// The admin client sends the bearer credential only over https, or plain
// http to loopback.
func TestClientRefusesPlainHTTPOffLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, u := range []string{"http://10.0.0.1:7100", "http://node1.example:7100", "http://[2001:db8::1]:7100", "HTTP://10.0.0.1:7100"} {
		_, err := Call(ctx, []string{u}, "/v1/members", testAdmin, Request{})
		if !errors.Is(err, ErrInsecureURL) || !strings.Contains(err.Error(), "https") || !strings.Contains(err.Error(), "--control-tls-ca") {
			t.Errorf("%s: %v, want ErrInsecureURL naming https and --control-tls-ca", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1", "https://10.0.0.1:1"} {
		if err := checkURL(u); err != nil {
			t.Errorf("%s refused: %v", u, err)
		}
	}
	for _, u := range []string{"ftp://10.0.0.1", "10.0.0.1:7100", ""} {
		if err := checkURL(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, _, err := SaveBackup(ctx, []string{"http://10.0.0.1:7100"}, testAdmin); !errors.Is(err, ErrInsecureURL) {
		t.Errorf("SaveBackup over plain http: %v", err)
	}
}
