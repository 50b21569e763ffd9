package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// permTimeout is the request timeout of the permission tests: a refusal
// must come well before it, not after it.
const permTimeout = 5 * time.Second

// permServer is a NATS server with users: "ticketd" may do anything (the
// fake node connects as it); "reader" may publish only status and get;
// "alice" may publish every ticketd subject but subscribe only under the
// inbox prefix _INBOX_alice, as examples/secure's users.
func permServer(t *testing.T) *server.Server {
	t.Helper()
	perm := func(pub, sub []string) *server.Permissions {
		return &server.Permissions{Publish: &server.SubjectPermission{Allow: pub}, Subscribe: &server.SubjectPermission{Allow: sub}}
	}
	return testkit.NATSServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "ticketd", Password: "ticketd"},
			{Username: "reader", Password: "reader", Permissions: perm([]string{protocol.SubjectStatus, protocol.SubjectGet}, []string{"_INBOX.>"})},
			{Username: "alice", Password: "alice", Permissions: perm([]string{"ticketd.v1.>"}, []string{"_INBOX_alice.>"})},
		}
	})
}

// userURL is s's client URL with user's credentials.
func userURL(s *server.Server, user string) string {
	return strings.Replace(s.ClientURL(), "nats://", "nats://"+user+":"+user+"@", 1)
}

// permClient is a client of user, with a long request timeout and retry
// budget so that only an immediate refusal passes the tests.
func permClient(t *testing.T, s *server.Server, user string, opts ...nats.Option) *Client {
	t.Helper()
	nc := testkit.Connect(t, userURL(s, user), opts...)
	c, err := New(nc, WithRequestTimeout(permTimeout), WithRetryBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refusedAtOnce fails t unless err is permission_denied, not
// indeterminate, names want, and came well before the request timeout.
func refusedAtOnce(t *testing.T, what string, err error, took time.Duration, want ...string) {
	t.Helper()
	if !errors.Is(err, ErrPermissionDenied) || IsIndeterminate(err) {
		t.Fatalf("%s: got %v (code %q), want permission_denied", what, err, CodeOf(err))
	}
	if took > permTimeout/2 {
		t.Fatalf("%s: refused after %v; a refusal must not wait for the reply timeout (%v)", what, took, permTimeout)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not name %q", what, err, w)
		}
	}
}

// TestPublishRefusedIsPermissionDenied: a user the NATS server does not
// let publish on a lock subject gets permission_denied at once for every
// operation, waiting acquires included, and nothing reaches ticketd.
func TestPublishRefusedIsPermissionDenied(t *testing.T) {
	s := permServer(t)
	f := startFakeAt(t, userURL(s, "ticketd"), standard)
	c := permClient(t, s, "reader")
	ctx, cancel := context.WithTimeout(t.Context(), 4*permTimeout)
	defer cancel()

	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatalf("get is allowed: %v", err)
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"acquire", func() error { _, err := c.Acquire(ctx, "k"); return err }},
		{"waiting acquire", func() error { _, err := c.Acquire(ctx, "k", WithWait(time.Minute)); return err }},
		{"release", func() error { return c.Release(ctx, "k", 7) }},
		{"renew", func() error { _, err := c.Renew(ctx, "k", 7, time.Second); return err }},
		{"list", func() error { _, err := c.List(ctx, "", "", 0); return err }},
	}
	for _, op := range ops {
		start := time.Now()
		err := op.do()
		refusedAtOnce(t, op.name, err, time.Since(start), "publish to ticketd.v1.lock.", "nothing was sent")
	}
	f.settle(c.Conn())
	for _, subj := range []string{protocol.SubjectAcquire, protocol.SubjectRelease, protocol.SubjectRenew, protocol.SubjectList, protocol.SubjectWithdraw} {
		if n := f.count(subj); n != 0 {
			t.Errorf("%s: the node received %d requests the NATS server refused", subj, n)
		}
	}
}

// TestInboxRefusedIsPermissionDenied: a user who may not subscribe under
// the default inbox prefix gets, at once, permission_denied naming the
// prefix and --nats-inbox-prefix, and nothing is sent: its acquire
// cannot have taken a lock whose reply could never reach it. With the
// prefix its permissions name, everything works.
func TestInboxRefusedIsPermissionDenied(t *testing.T) {
	s := permServer(t)
	f := startFakeAt(t, userURL(s, "ticketd"), standard)
	c := permClient(t, s, "alice")
	ctx, cancel := context.WithTimeout(t.Context(), 4*permTimeout)
	defer cancel()

	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"get", func() error { _, err := c.Get(ctx, "k"); return err }},
		{"acquire", func() error { _, err := c.Acquire(ctx, "k"); return err }},
		{"waiting acquire", func() error { _, err := c.Acquire(ctx, "k", WithWait(time.Minute)); return err }},
		{"status", func() error { _, err := c.Status(ctx); return err }},
	} {
		start := time.Now()
		err := op.do()
		refusedAtOnce(t, op.name, err, time.Since(start), `"_INBOX"`, "--nats-inbox-prefix", "reply inbox _INBOX.")
	}
	f.settle(c.Conn())
	if n := f.count(protocol.SubjectAcquire); n != 0 {
		t.Fatalf("%d acquires were sent although their replies could not come back", n)
	}

	ok := permClient(t, s, "alice", nats.CustomInboxPrefix("_INBOX_alice"))
	l, err := ok.Acquire(ctx, "k", WithWait(time.Second))
	if err != nil {
		t.Fatalf("with the inbox prefix alice may use: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWatchRefusedIsPermissionDenied: a watch on a subject the user may
// not subscribe to fails at once instead of delivering nothing.
func TestWatchRefusedIsPermissionDenied(t *testing.T) {
	s := permServer(t)
	c := permClient(t, s, "alice", nats.CustomInboxPrefix("_INBOX_alice"))
	start := time.Now()
	_, err := c.Watch(t.Context(), "orders/42")
	refusedAtOnce(t, "watch", err, time.Since(start), protocol.WatchSubject("orders/42"))
}

// TestErrorHandlerStillCalled: New wraps the connection's error handler;
// the application's handler still sees every error.
func TestErrorHandlerStillCalled(t *testing.T) {
	s := permServer(t)
	startFakeAt(t, userURL(s, "ticketd"), standard)
	var seen atomic.Int32
	c := permClient(t, s, "reader", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			seen.Add(1)
		}
	}))
	if _, err := c.Acquire(t.Context(), "k"); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("got %v", err)
	}
	testkit.Eventually(t, 5*time.Second, "the application's handler called", func() bool { return seen.Load() > 0 })
}

// TestParseViolation reads the server's texts (nats-server client.go) as
// nats.go hands them over.
func TestParseViolation(t *testing.T) {
	for _, tc := range []struct {
		text, what, subject string
	}{
		{`Permissions Violation for Publish to "ticketd.v1.lock.acquire"`, "publish", "ticketd.v1.lock.acquire"},
		{`Permissions Violation for Subscription to "_INBOX.abc.*"`, "subscribe", "_INBOX.abc.*"},
		{`Permissions Violation for Subscription to "a.b" using queue "q"`, "subscribe", "a.b"},
		{`Permissions Violation for Publish with Reply of "_R_.x"`, "reply", "_R_.x"},
	} {
		v := parseViolation(fmt.Errorf("%w: %s", nats.ErrPermissionViolation, tc.text))
		if v == nil || v.what != tc.what || v.subject != tc.subject {
			t.Errorf("%s: got %+v", tc.text, v)
		}
	}
	if parseViolation(errors.New(`Permissions Violation for Publish to "x"`)) != nil {
		t.Error("an error that is not nats.ErrPermissionViolation was read as one")
	}
	mux := &watched{inbox: "_INBOX.abc.*"}
	if !mux.concerns(&violation{what: "reply", subject: "_INBOX.abc.x1"}) || mux.concerns(&violation{what: "reply", subject: "_INBOX.abc.x.y"}) {
		t.Error("reply violations matched against the wildcard inbox wrongly")
	}
}

// TestNoRespondersNamesMissingLeader: "no responders" on a lock subject
// while a node answers status is unavailable with the reason the node
// gives: no leader; with no node at all, it says that.
func TestNoRespondersNamesMissingLeader(t *testing.T) {
	s := testkit.NATSServer(t)
	c, _ := newClient(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err := c.Acquire(ctx, "k")
	cancel()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "not even to status") {
		t.Fatalf("no node at all: got %v", err)
	}

	// A node that serves status only: a follower that knows no leader.
	node := testkit.Connect(t, s.ClientURL())
	var leader atomic.Uint64
	sub, err := node.QueueSubscribe(protocol.SubjectStatus, protocol.QueueGroup, func(m *nats.Msg) {
		b, _ := json.Marshal(protocol.StatusReply{ID: 3, Leader: leader.Load(), State: "StatePreCandidate"})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := node.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = c.Acquire(ctx, "k")
	cancel()
	var e *Error
	if !errors.As(err, &e) || e.Code != protocol.CodeUnavailable || !strings.HasPrefix(e.Message, "no leader: node 3 knows of no leader") {
		t.Fatalf("no leader: got %v", err)
	}
	leader.Store(2)
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = c.Get(ctx, "k")
	cancel()
	if !errors.As(err, &e) || e.Code != protocol.CodeUnavailable || !strings.Contains(e.Message, "node 3 names leader 2") {
		t.Fatalf("leader known, not serving: got %v", err)
	}
}
