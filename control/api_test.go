package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/raftstore"
)

const (
	testAdmin = "admin-credential-for-tests"
	testBoot  = "bootstrap-credential-for-tests"
)

// newTestAPI serves the control API of a plane on node 1 over a fake node.
func newTestAPI(t *testing.T) (*Plane, *fakeNode, *fakeLeadership, string) {
	t.Helper()
	n := newFakeNode()
	l := &fakeLeadership{}
	l.leader.Store(true)
	p := New(Config{
		ID:                  1,
		Node:                n,
		Leadership:          l,
		Credential:          testAdmin,
		BootstrapCredential: testBoot,
		DataDir:             t.TempDir(),
		PeerListen:          "127.0.0.1:0",
		PeerAddr:            "127.0.0.1:7001",
		// A throttled source still waits, just not a second per request.
		FailureDelay: time.Millisecond,
	})
	srv := httptest.NewServer(p.routes())
	t.Cleanup(srv.Close)
	return p, n, l, srv.URL
}

func post(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAPIWire pins the HTTP status and JSON body of the refusals every
// endpoint shares.
func TestAPIWire(t *testing.T) {
	_, n, l, url := newTestAPI(t)
	tests := []struct {
		name, method, path, auth, body string
		leader                         bool
		status                         int
		want                           string // exact body, or a prefix ending in "..."
	}{
		{"no credential", "POST", "/v1/members", "", "", true, 401,
			`{"error":{"code":"unauthorized","message":"a valid control credential is required"}}` + "\n"},
		{"wrong credential", "POST", "/v1/members", "nope", "", true, 401,
			`{"error":{"code":"unauthorized","message":"a valid control credential is required"}}` + "\n"},
		{"unknown field", "POST", "/v1/members", testAdmin, `{"bogus":1}`, true, 400,
			`{"error":{"code":"invalid_argument","message":"bad JSON: json: unknown field \"bogus\""}}` + "\n"},
		{"oversize body", "POST", "/v1/join", "", `{"credential":"` + strings.Repeat("x", MaxBody) + `"}`, true, 400,
			`{"error":{"code":"invalid_argument","message":"unreadable or oversize body"}}` + "\n"},
		{"not the leader", "POST", "/v1/members", testAdmin, "", false, 421,
			`{"error":{"code":"not_leader","message":"ask the leader","leader":3}}` + "\n"},
		{"join without credential", "POST", "/v1/join", "", `{"address":"127.0.0.1:7002"}`, true, 401,
			`{"error":{"code":"unauthorized","message":"a join credential is required"}}` + "\n"},
		{"identity refused", "POST", "/v1/identity", "", `{"node_id":9,"incarnation":1}`, true, 409,
			`{"error":{"code":"control_rejected","message":"...`},
		{"members", "POST", "/v1/members", testAdmin, "", true, 200, `{"result":"members"}` + "\n"},
		{"GET is not routed", "GET", "/v1/members", testAdmin, "", true, 405, "..."},
	}
	n.leader = 3
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l.leader.Store(tc.leader)
			status, body := post(t, tc.method, url+tc.path, tc.auth, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d (body %s)", status, tc.status, body)
			}
			if prefix, ok := strings.CutSuffix(tc.want, "..."); ok {
				if !strings.HasPrefix(body, prefix) {
					t.Fatalf("body %q, want it to start with %q", body, prefix)
				}
			} else if body != tc.want {
				t.Fatalf("body %q, want %q", body, tc.want)
			}
		})
	}
}

// TestAPIProposeErrors: how a failed proposal reaches the caller.
func TestAPIProposeErrors(t *testing.T) {
	_, n, _, url := newTestAPI(t)
	n.leader = 2
	tests := []struct {
		err    error
		status int
		want   string
	}{
		{raftstore.ErrNotLeader, 421, `{"error":{"code":"not_leader","message":"raftstore: not the leader","leader":2}}` + "\n"},
		{raftstore.ErrIndeterminate, 409, `{"error":{"code":"indeterminate","message":"raftstore: outcome unknown"}}` + "\n"},
		{fmt.Errorf("propose: %w", context.DeadlineExceeded), 503, `{"error":{"code":"unavailable","message":"propose: context deadline exceeded"}}` + "\n"},
	}
	for _, tc := range tests {
		n.mu.Lock()
		n.proposeErr = tc.err
		n.mu.Unlock()
		status, body := post(t, "POST", url+"/v1/join-credentials", testAdmin, "")
		if status != tc.status || body != tc.want {
			t.Errorf("%v: got %d %s, want %d %s", tc.err, status, body, tc.status, tc.want)
		}
	}
}

// TestAPIFormCluster drives bootstrap, a join and the refusals of reuse
// through Call against the handlers and a real state machine.
func TestAPIFormCluster(t *testing.T) {
	p, n, _, url := newTestAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	urls := []string{url}
	rejected := func(err error, reason string) bool {
		var ce *Error
		return errors.As(err, &ce) && ce.Code == CodeRejected && ce.Reason == reason
	}

	if _, err := Call(ctx, urls, "/v1/bootstrap", testAdmin, Request{Credential: "wrong"}); err == nil || !strings.Contains(err.Error(), CodeUnauthorized) {
		t.Fatalf("wrong bootstrap credential: %v", err)
	}
	rep, err := Call(ctx, urls, "/v1/bootstrap", testAdmin, Request{Credential: testBoot})
	if err != nil || rep.Result != "bootstrap_recorded" || rep.NodeID != 1 || rep.Incarnation != 1 {
		t.Fatalf("bootstrap: %+v %v", rep, err)
	}
	// The configured peer port is 0, so the bound address is recorded.
	if len(rep.Members) != 1 || rep.Members[0] != (Member{NodeID: 1, Incarnation: 1, Address: "127.0.0.1:7001", Role: "voter"}) {
		t.Fatalf("bootstrap members %+v", rep.Members)
	}
	if id, ok, err := ReadIdentity(p.cfg.DataDir); err != nil || !ok || id.NodeID != 1 || id.Incarnation != 1 {
		t.Fatalf("identity after bootstrap: %+v %v %v", id, ok, err)
	}
	if _, err := Call(ctx, urls, "/v1/bootstrap", testAdmin, Request{Credential: testBoot}); !rejected(err, "already_bootstrapped") {
		t.Fatalf("second bootstrap: %v", err)
	}

	mint, err := Call(ctx, urls, "/v1/join-credentials", testAdmin, Request{})
	if err != nil || len(mint.Credential) != 64 {
		t.Fatalf("mint: %+v %v", mint, err)
	}
	// The log sees the credential's hash only.
	n.mu.Lock()
	last := n.proposed[len(n.proposed)-1]
	n.mu.Unlock()
	if strings.Contains(fmt.Sprintf("%+v", last), mint.Credential) || last.Control.CredentialHash != hashCredential(mint.Credential) {
		t.Fatalf("minted command %+v does not carry just the hash", last)
	}
	joined, err := Call(ctx, urls, "/v1/join", "", Request{Credential: mint.Credential, Address: "127.0.0.1:7002"})
	if err != nil || joined.Result != "admission_accepted" || joined.NodeID != 2 || len(joined.Members) != 2 {
		t.Fatalf("join: %+v %v", joined, err)
	}
	if _, err := Call(ctx, urls, "/v1/join", "", Request{Credential: mint.Credential, Address: "127.0.0.1:7003"}); !rejected(err, "credential_reused") {
		t.Fatalf("reused join credential: %v", err)
	}
	if _, err := Call(ctx, urls, "/v1/identity", "", Request{NodeID: 2, Incarnation: joined.Incarnation}); err != nil {
		t.Fatalf("current identity: %v", err)
	}
	// Node 2 never replicated: completing a replacement with it waits.
	_, err = Call(ctx, urls, "/v1/replacements/complete", testAdmin, Request{OldNodeID: 1, NodeID: 2, Incarnation: joined.Incarnation})
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeNotCaughtUp {
		t.Fatalf("complete with a learner that never replicated: %v", err)
	}
	if got := p.Members(); len(got) != 2 || got[1].Role != "learner" {
		t.Fatalf("members %+v", got)
	}
}

// TestBootstrapRefusals: bootstrap runs only on a fresh node 1 with a peer
// listener and its bootstrap credential.
func TestBootstrapRefusals(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config, *fakeNode)
		code  string
		match string
	}{
		{"no bootstrap credential", func(c *Config, _ *fakeNode) { c.BootstrapCredential = "" }, CodeInvalid, "not started with a bootstrap credential"},
		{"not node 1", func(c *Config, _ *fakeNode) { c.ID = 2 }, CodeInvalid, "node 1 with a peer listener"},
		{"no peer listener", func(c *Config, _ *fakeNode) { c.PeerAddr = "" }, CodeInvalid, "node 1 with a peer listener"},
		{"static members", func(_ *Config, n *fakeNode) { n.cs.Voters = []uint64{1, 2, 3} }, CodeInvalid, "membership is [1 2 3]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFakeNode()
			l := &fakeLeadership{}
			l.leader.Store(true)
			cfg := Config{ID: 1, Node: n, Leadership: l, Credential: testAdmin, BootstrapCredential: testBoot, DataDir: t.TempDir(), PeerAddr: "127.0.0.1:7001"}
			tc.edit(&cfg, n)
			srv := httptest.NewServer(New(cfg).routes())
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := Call(ctx, []string{srv.URL}, "/v1/bootstrap", testAdmin, Request{Credential: testBoot})
			var ce *Error
			if !errors.As(err, &ce) || ce.Code != tc.code || !strings.Contains(ce.Message, tc.match) {
				t.Fatalf("got %v, want %s mentioning %q", err, tc.code, tc.match)
			}
			if len(n.proposed) != 0 {
				t.Fatalf("proposed %v", n.proposed)
			}
		})
	}
}

func TestAdvertisedPeer(t *testing.T) {
	for _, tc := range []struct{ listen, bound, want string }{
		{"10.0.0.1:7000", "10.0.0.1:7000", "10.0.0.1:7000"},
		{"127.0.0.1:0", "127.0.0.1:41234", "127.0.0.1:41234"},
		{"", "127.0.0.1:41234", "127.0.0.1:41234"},
		{"not-an-address", "127.0.0.1:41234", "127.0.0.1:41234"},
	} {
		p := New(Config{PeerListen: tc.listen, PeerAddr: tc.bound})
		if got := p.advertisedPeer(); got != tc.want {
			t.Errorf("advertisedPeer(%q, %q) = %q, want %q", tc.listen, tc.bound, got, tc.want)
		}
	}
}
