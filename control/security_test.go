package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
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
	if statuses[http.StatusConflict] != FailureBurstDefault || statuses[http.StatusTooManyRequests] < 280 {
		t.Fatalf("statuses %v: want %d refusals, then too_many_attempts", statuses, FailureBurstDefault)
	}
}

// Wrong credentials are slowed per source address: after the burst every
// request from that source is refused, even one with the right
// credential, until it has waited.
func TestBruteForceSlowed(t *testing.T) {
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, FailureBurst: 5, FailureRefill: 200 * time.Millisecond})
	srv := httptest.NewServer(p.routes())
	defer srv.Close()
	start := time.Now()
	statuses := map[int]int{}
	for i := 0; i < 200; i++ {
		status, _ := post(t, "POST", srv.URL+"/v1/members", "guess-"+hex.EncodeToString([]byte{byte(i)}), "")
		statuses[status]++
	}
	elapsed := time.Since(start)
	// One more attempt per refill may slip in while the loop runs.
	if got, most := statuses[http.StatusUnauthorized], 5+int(elapsed/(200*time.Millisecond))+1; got < 5 || got > most {
		t.Fatalf("%d of 200 guesses in %v were checked (statuses %v); want 5..%d", got, elapsed, statuses, most)
	}
	status, body := post(t, "POST", srv.URL+"/v1/members", testAdmin, "")
	if status != http.StatusTooManyRequests || !strings.Contains(body, CodeTooManyAttempts) {
		t.Fatalf("the right credential from a limited source: %d %s, want 429", status, body)
	}
	testkit.Eventually(t, 5*time.Second, "the source to earn an attempt back", func() bool {
		status, _ := post(t, "POST", srv.URL+"/v1/members", testAdmin, "")
		return status == http.StatusOK
	})
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

// Idle connections beyond MaxConns are closed at once; the ones in
// service are unaffected.
func TestControlConnectionCap(t *testing.T) {
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, Listen: "127.0.0.1:0", MaxConns: 4})
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
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := Call(ctx, []string{"http://" + p.Addr()}, "/v1/members", testAdmin, Request{}); err == nil {
		t.Fatal("a fifth connection was served while four were open")
	}
	_ = idle[0].Close()
	testkit.Eventually(t, 5*time.Second, "a request served once a slot is free", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := Call(ctx, []string{"http://" + p.Addr()}, "/v1/members", testAdmin, Request{})
		return err == nil
	})
}

// A throttled source still learns whether an identity is current: the
// identity check holds no credential to guess, and a starting node must
// never take "no answer" for "not retired".
func TestIdentityCheckNotThrottled(t *testing.T) {
	_, _, _, url := newTestAPI(t)
	for i := 0; i < FailureBurstDefault+1; i++ {
		post(t, "POST", url+"/v1/members", "wrong-credential", "")
	}
	if status, _ := post(t, "POST", url+"/v1/members", testAdmin, ""); status != http.StatusTooManyRequests {
		t.Fatalf("the source is not throttled (%d)", status)
	}
	if status, body := post(t, "POST", url+"/v1/identity", "", `{"node_id":9,"incarnation":1}`); status != http.StatusConflict || !strings.Contains(body, "control_rejected") {
		t.Fatalf("identity check from a throttled source: %d %s, want the refusal itself", status, body)
	}
}
