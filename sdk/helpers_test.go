package sdk

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// action is what the fake does with one request.
type action struct {
	swallow bool
	body    []byte
	header  nats.Header
}

// seen is one request the fake received.
type seen struct {
	subject string
	reply   string
	data    []byte
}

// fake is a scripted ticketd responder: it serves the client subjects in
// the ticketd queue group and answers with script(subject, n, data),
// where n counts requests on that subject from 0.
type fake struct {
	t      *testing.T
	nc     *nats.Conn
	script func(subject string, n int, data []byte) action

	mu   sync.Mutex
	reqs []seen
	subs []*nats.Subscription
}

func startFake(t *testing.T, s *server.Server, script func(subject string, n int, data []byte) action) *fake {
	t.Helper()
	return startFakeAt(t, s.ClientURL(), script)
}

// startFakeAt is startFake on a server URL that may carry credentials.
func startFakeAt(t *testing.T, url string, script func(subject string, n int, data []byte) action) *fake {
	t.Helper()
	f := &fake{t: t, nc: testkit.Connect(t, url), script: script}
	for _, subj := range []string{protocol.SubjectAcquire, protocol.SubjectRelease, protocol.SubjectGet, protocol.SubjectStatus,
		protocol.SubjectRenew, protocol.SubjectList, protocol.SubjectWithdraw} {
		sub, err := f.nc.QueueSubscribe(subj, protocol.QueueGroup, f.handle)
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
		f.subs = append(f.subs, sub)
	}
	// The subscriptions are registered on the server once Flush returns.
	if err := f.nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return f
}

func (f *fake) handle(m *nats.Msg) {
	f.mu.Lock()
	n := 0
	for _, r := range f.reqs {
		if r.subject == m.Subject {
			n++
		}
	}
	f.reqs = append(f.reqs, seen{subject: m.Subject, reply: m.Reply, data: append([]byte(nil), m.Data...)})
	f.mu.Unlock()
	a := f.script(m.Subject, n, m.Data)
	if a.swallow {
		return
	}
	if err := m.RespondMsg(&nats.Msg{Data: a.body, Header: a.header}); err != nil {
		f.t.Errorf("respond: %v", err)
	}
}

// requests returns the requests seen on subject.
func (f *fake) requests(subject string) []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seen
	for _, r := range f.reqs {
		if r.subject == subject {
			out = append(out, r)
		}
	}
	return out
}

func (f *fake) count(subject string) int { return len(f.requests(subject)) }

// renewingFake is a fake that grants as standard and renews every lock
// with a 300 ms lease, and a client of it.
func renewingFake(t *testing.T) (*fake, *Client, *nats.Conn) {
	t.Helper()
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(subject string, n int, data []byte) action {
		if subject == protocol.SubjectRenew {
			return renewed(data, 300)
		}
		return standard(subject, n, data)
	})
	c, nc := newClient(t, s)
	return f, c, nc
}

// noMore fails t if a request on subject reaches f within window (say two
// renew intervals) from now; client is the connection that would send it.
func (f *fake) noMore(t *testing.T, client *nats.Conn, subject string, window time.Duration, when string) {
	t.Helper()
	f.settle(client)
	n := f.count(subject)
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		f.settle(client)
		if got := f.count(subject); got != n {
			t.Fatalf("%s sent %s (%d, then %d)", subject, when, n, got)
		}
		_ = sleepCtx(context.Background(), 10*time.Millisecond)
	}
}

// settle makes sure every message the client published has been handled
// by the fake: it flushes both connections (so the server has routed
// everything, in order) and then waits until nothing is pending in the
// fake's subscriptions and handlers have run.
func (f *fake) settle(client *nats.Conn) {
	f.t.Helper()
	if err := client.Flush(); err != nil {
		f.t.Fatalf("flush client: %v", err)
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatalf("flush fake: %v", err)
	}
	testkit.Eventually(f.t, 5*time.Second, "fake idle", func() bool {
		for _, s := range f.subs {
			if n, _, _ := s.Pending(); n > 0 {
				return false
			}
			d, _ := s.Delivered()
			f.mu.Lock()
			got := 0
			for _, r := range f.reqs {
				if r.subject == s.Subject {
					got++
				}
			}
			f.mu.Unlock()
			if int64(got) != d {
				return false
			}
		}
		return true
	})
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// grant answers an acquire with token.
func grant(data []byte, token uint64) action {
	var r protocol.AcquireRequest
	_ = json.Unmarshal(data, &r)
	b, _ := json.Marshal(protocol.AcquireReply{Key: r.Key, Token: token, Owner: r.Owner, LeaseMS: r.LeaseMS, Index: token + 100})
	return action{body: b}
}

// fail answers with a protocol error, body and headers as the server sets them.
func fail(code protocol.Code, msg string) action {
	b, _ := json.Marshal(protocol.ErrorReply{Error: &protocol.Error{Code: code, Message: msg}})
	h := nats.Header{}
	h.Set(HeaderServiceError, msg)
	h.Set(HeaderServiceErrorCode, string(code))
	return action{body: b, header: h}
}

func released(data []byte) action {
	var r protocol.ReleaseRequest
	_ = json.Unmarshal(data, &r)
	b, _ := json.Marshal(protocol.ReleaseReply{Key: r.Key, Released: true})
	return action{body: b}
}

// standard answers everything successfully.
func standard(subject string, n int, data []byte) action {
	switch subject {
	case protocol.SubjectAcquire:
		return grant(data, uint64(n)+1)
	case protocol.SubjectRelease:
		return released(data)
	case protocol.SubjectGet:
		var r protocol.GetRequest
		_ = json.Unmarshal(data, &r)
		b, _ := json.Marshal(protocol.GetReply{Key: r.Key})
		return action{body: b}
	default:
		b, _ := json.Marshal(protocol.StatusReply{ID: 1, Leader: 1, State: "leader"})
		return action{body: b}
	}
}

// attempts records what the client's attempt hook saw.
type attempts struct {
	mu   sync.Mutex
	errs []error
}

func (a *attempts) hook(_ string, _ int, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

func (a *attempts) snapshot() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// newClient makes a client on its own connection with fast retries.
func newClient(t *testing.T, s *server.Server, opts ...Option) (*Client, *nats.Conn) {
	t.Helper()
	nc := testkit.Connect(t, s.ClientURL())
	base := []Option{WithRequestTimeout(2 * time.Second), WithRetryBackoff(time.Millisecond, 10*time.Millisecond)}
	c, err := New(nc, append(base, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, nc
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
