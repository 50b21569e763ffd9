package control

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// TestCallFindsTheLeader: Call skips nodes it cannot dial, follows
// not_leader and unavailable answers and unreadable error bodies to the
// next URL, and sends the body and the bearer credential.
func TestCallFindsTheLeader(t *testing.T) {
	deadURL := "http://" + testkit.FreeAddr(t)
	answer := func(status int, body string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	follower := answer(421, `{"error":{"code":"not_leader","message":"ask the leader","leader":3}}`)
	busy := answer(503, `{"error":{"code":"unavailable","message":"later"}}`)
	proxy := answer(502, `<html>bad gateway</html>`)
	var got atomic.Value
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Method + " " + r.URL.Path + " " + r.Header.Get("Authorization") + " " + string(b))
		_, _ = io.WriteString(w, `{"result":"members","members":[{"node_id":1,"incarnation":1,"address":"a:1","role":"voter"}]}`)
	}))
	defer leader.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := Call(ctx, []string{deadURL, follower.URL, busy.URL, proxy.URL, leader.URL + "/"}, "/v1/members", "secret", Request{NodeID: 7})
	if err != nil || rep.Result != "members" || len(rep.Members) != 1 || rep.Members[0].Role != "voter" {
		t.Fatalf("got %+v %v", rep, err)
	}
	if want := `POST /v1/members Bearer secret {"node_id":7}`; got.Load() != want {
		t.Fatalf("leader saw %q, want %q", got.Load(), want)
	}
}

// TestCallRefusals: a refusal comes back at once as *Error; with nobody
// leading, Call ends with the context.
func TestCallRefusals(t *testing.T) {
	var calls atomic.Int32
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(409)
		_, _ = io.WriteString(w, `{"error":{"code":"control_rejected","message":"no","reason":"credential_reused"}}`)
	}))
	defer rejecting.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Call(ctx, []string{rejecting.URL, rejecting.URL}, "/v1/join", "", Request{Credential: "c"})
	var ce *Error
	if !errors.As(err, &ce) || *ce != (Error{Code: CodeRejected, Message: "no", Reason: "credential_reused"}) || calls.Load() != 1 {
		t.Fatalf("got %v after %d calls", err, calls.Load())
	}
	if err.Error() != "control_rejected (credential_reused): no" {
		t.Fatalf("error text %q", err.Error())
	}

	follower := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(421)
		_, _ = io.WriteString(w, `{"error":{"code":"not_leader","message":"ask the leader"}}`)
	}))
	defer follower.Close()
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Call(short, []string{follower.URL}, "/v1/members", "", Request{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no leader: %v", err)
	}
}

// TestCallIndeterminate: a request that reached a node which never
// answered may have taken effect, so it is not retried elsewhere.
func TestCallIndeterminate(t *testing.T) {
	var calls atomic.Int32
	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer hangup.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Call(ctx, []string{hangup.URL, hangup.URL}, "/v1/join-credentials", "", Request{})
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != CodeIndeterminate || !strings.HasPrefix(ce.Message, hangup.URL) || calls.Load() != 1 {
		t.Fatalf("got %v after %d calls", err, calls.Load())
	}
}
