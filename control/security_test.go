package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// Anonymous joins with made-up credentials are refused against the
// applied state: nothing is proposed, so nothing is appended to the log.
// The 300 requests appended 300 fsynced, replicated entries.
func TestAnonymousJoinProposesNothing(t *testing.T) {
	_, n, _, url := newTestAPI(t)
	began := time.Now()
	statuses := map[int]int{}
	for i := 0; i < 300; i++ {
		var raw [32]byte
		_, _ = rand.Read(raw[:])
		status, _ := post(t, "POST", url+"/v1/join", "", `{"credential":"`+hex.EncodeToString(raw[:])+`","address":"127.0.0.1:7002"}`)
		statuses[status]++
	}
	n.mu.Lock()
	proposed := len(n.proposed)
	n.mu.Unlock()
	if proposed != 0 {
		t.Fatalf("300 anonymous joins proposed %d commands", proposed)
	}
	// The burst, then one attempt earned back per FailureRefillDefault
	// while the loop runs.
	if got, most := statuses[http.StatusConflict], FailureBurstDefault+int(time.Since(began)/FailureRefillDefault); got < FailureBurstDefault || got > most || statuses[http.StatusTooManyRequests] < 280 {
		t.Fatalf("statuses %v: want %d..%d refusals, then too_many_attempts", statuses, FailureBurstDefault, most)
	}
}

// Wrong credentials are slowed per source address: after the burst each
// request from that source waits FailureDelay, and each failure is
// answered too_many_attempts (TestFailureLimiterBounded shows attempts
// earned back). The right credential is accepted all along.
func TestBruteForceSlowed(t *testing.T) {
	const delay = 5 * time.Millisecond
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, FailureBurst: 5, FailureRefill: time.Hour, FailureDelay: delay})
	srv := httptest.NewServer(p.routes())
	defer srv.Close()
	start := time.Now()
	statuses := map[int]int{}
	for i := 0; i < 100; i++ {
		status, _ := post(t, "POST", srv.URL+"/v1/members", "guess-"+hex.EncodeToString([]byte{byte(i)}), "")
		statuses[status]++
	}
	elapsed := time.Since(start)
	if statuses[http.StatusUnauthorized] != 5 || statuses[http.StatusTooManyRequests] != 95 {
		t.Fatalf("statuses %v: want 5 ordinary refusals, then too_many_attempts", statuses)
	}
	if elapsed < 90*delay {
		t.Fatalf("100 guesses in %v: the throttled ones were not paced (%v each)", elapsed, delay)
	}
	status, body := post(t, "POST", srv.URL+"/v1/members", testAdmin, "")
	if status != http.StatusOK {
		t.Fatalf("the right credential from a limited source: %d %s, want 200", status, body)
	}
	status, body = post(t, "POST", srv.URL+"/v1/members", "guess-again", "")
	if status != http.StatusTooManyRequests || !strings.Contains(body, CodeTooManyAttempts) {
		t.Fatalf("a wrong credential from a limited source: %d %s, want 429", status, body)
	}
}

// The limiter remembers a bounded number of sources.
func TestFailureLimiterBounded(t *testing.T) {
	now := time.Unix(0, 0)
	l := newFailureLimiter(2, time.Second, func() time.Time { return now })
	for i := 0; i < maxTrackedSources+100; i++ {
		l.failed(net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).String())
	}
	if len(l.sources) > maxTrackedSources {
		t.Fatalf("%d sources tracked, the bound is %d", len(l.sources), maxTrackedSources)
	}
	l.failed("10.9.9.9")
	l.failed("10.9.9.9")
	if ok, wait := l.allowed("10.9.9.9"); ok || wait != time.Second {
		t.Fatalf("after 2 failures: allowed=%v wait=%v", ok, wait)
	}
	now = now.Add(time.Second)
	if ok, _ := l.allowed("10.9.9.9"); !ok {
		t.Fatal("no attempt earned back after a refill")
	}
}

func TestControlListenNeedsTLSOffLoopback(t *testing.T) {
	p := New(Config{ID: 1, Node: newFakeNode(), Leadership: &fakeLeadership{}, Listen: "0.0.0.0:0"})
	if err := p.Start(); !errors.Is(err, ErrInsecureListen) {
		p.Close()
		t.Fatalf("Start on 0.0.0.0 without TLS = %v, want ErrInsecureListen", err)
	}
	for addr, want := range map[string]bool{"127.0.0.1:7100": true, "localhost:1": true, "[::1]:1": true, ":7100": false, "10.0.0.1:7100": false} {
		if IsLoopback(addr) != want {
			t.Errorf("IsLoopback(%q) = %v", addr, !want)
		}
	}
}

// Over mutual TLS the API answers a client with a certificate from the
// CA, and nobody else: not plain HTTP, not TLS without a certificate.
func TestControlMutualTLS(t *testing.T) {
	files := testkit.TLS(t)
	server, err := ServerTLS(files.Cert, files.Key, files.CA)
	if err != nil {
		t.Fatal(err)
	}
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, Listen: "127.0.0.1:0", TLS: server})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	https := []string{"https://" + p.Addr()}
	client, err := ClientTLS(files.CA, files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Call(ctx, https, "/v1/members", testAdmin, Request{}, WithTLS(client)); err != nil {
		t.Fatalf("mutual TLS call: %v", err)
	}
	noCert, _ := ClientTLS(files.CA, "", "")
	if _, err := Call(ctx, https, "/v1/members", testAdmin, Request{}, WithTLS(noCert)); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	// The server answers plain HTTP with a bare 400, which Call retries
	// until its context ends.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := Call(short, []string{"http://" + p.Addr()}, "/v1/members", testAdmin, Request{}); err == nil {
		t.Fatal("plain HTTP was served")
	}
}

// At most MaxConns connections are open: a fifth evicts the oldest idle
// one and is served.
func TestControlConnectionCap(t *testing.T) {
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, Listen: "127.0.0.1:0", MaxConns: 4, Logger: testkit.QuietLogger()})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var idle []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	testkit.Eventually(t, 5*time.Second, "four connections open", func() bool { total, _ := p.conns.Len(""); return total == 4 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Call(ctx, []string{"http://" + p.Addr()}, "/v1/members", testAdmin, Request{}); err != nil {
		t.Fatalf("a fifth connection was not served: %v", err)
	}
	_ = idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the oldest idle connection was kept: %v", err)
	}
	if total, _ := p.conns.Len(""); total > 4 {
		t.Fatalf("%d connections open, the cap is 4", total)
	}
}

// A throttled source still learns whether an identity is current: the
// identity check holds no credential to guess, and a starting node must
// never take "no answer" for "not retired".
func TestIdentityCheckNotThrottled(t *testing.T) {
	_, _, _, url := newTestAPI(t)
	for i := 0; i < FailureBurstDefault+1; i++ {
		post(t, "POST", url+"/v1/members", "wrong-credential", "")
	}
	if status, _ := post(t, "POST", url+"/v1/members", "wrong-credential", ""); status != http.StatusTooManyRequests {
		t.Fatalf("the source is not throttled (%d)", status)
	}
	if status, body := post(t, "POST", url+"/v1/identity", "", `{"node_id":9,"incarnation":1}`); status != http.StatusConflict || !strings.Contains(body, "control_rejected") {
		t.Fatalf("identity check from a throttled source: %d %s, want the refusal itself", status, body)
	}
}
