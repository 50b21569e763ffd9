package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

var allSentinels = []*Error{
	ErrHeld, ErrNotFound, ErrInvalidArgument, ErrIndeterminate, ErrTimeout, ErrDenied, ErrResourceExhausted,
	ErrUnavailable, ErrNotLeader, ErrShuttingDown, ErrMalformed, ErrTooLarge, ErrInternal, ErrControlRefused,
	ErrGrantEnded, ErrUnsupported,
}

func decodeAcquire(t *testing.T, data []byte) protocol.AcquireRequest {
	t.Helper()
	r, err := protocol.DecodeAcquire(data)
	if err != nil {
		t.Fatalf("the SDK sent an acquire the server would reject: %v (%s)", err, data)
	}
	return r
}

func TestAcquireGrantDeadline(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, standard)
	c, _ := newClient(t, s)
	ctx := context.Background()

	const lease = 3 * time.Second
	before := time.Now()
	l, err := c.Acquire(ctx, "orders/42", WithLease(lease), WithOwner("worker-1"))
	after := time.Now()
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Key != "orders/42" || l.Token != 1 || l.Owner != "worker-1" || l.Lease != lease || l.Index != 101 {
		t.Fatalf("lock = %+v", l)
	}
	// Deadline = sent + lease, and sent lies between before and after.
	if d := l.Deadline(); d.Before(before.Add(lease)) || d.After(after.Add(lease)) {
		t.Fatalf("deadline %v not within [%v, %v]", d, before.Add(lease), after.Add(lease))
	}
	if d := l.Deadline(); d.After(time.Now().Add(lease)) {
		t.Fatalf("deadline %v is later than now+lease", d)
	}
	// A monotonic reading makes the deadline immune to wall-clock steps.
	if !strings.Contains(l.Deadline().String(), "m=") {
		t.Fatalf("deadline %v has no monotonic reading", l.Deadline())
	}
	if !l.Valid() || l.Remaining() <= 0 || l.Remaining() > lease {
		t.Fatalf("valid=%v remaining=%v", l.Valid(), l.Remaining())
	}

	r := decodeAcquire(t, f.requests(protocol.SubjectAcquire)[0].data)
	if r.Key != "orders/42" || r.Owner != "worker-1" || r.LeaseMS != 3000 || r.WaitMS != 0 {
		t.Fatalf("request = %+v", r)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var rr protocol.ReleaseRequest
	if err := json.Unmarshal(f.requests(protocol.SubjectRelease)[0].data, &rr); err != nil || rr.Key != "orders/42" || rr.Token != 1 {
		t.Fatalf("release request %+v %v", rr, err)
	}
}

func TestLeaseFromReplyNeverLonger(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, func(subject string, n int, data []byte) action {
		var r protocol.AcquireRequest
		_ = json.Unmarshal(data, &r)
		return action{body: mustJSON(t, protocol.AcquireReply{Key: r.Key, Token: 9, LeaseMS: 1000})}
	})
	c, _ := newClient(t, s)
	before := time.Now()
	l, err := c.Acquire(context.Background(), "k", WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.Lease != time.Second || l.Deadline().After(time.Now().Add(time.Second)) || l.Deadline().Before(before.Add(time.Second)) {
		t.Fatalf("lease %v deadline %v", l.Lease, l.Deadline())
	}
}

func TestErrorCodesMapToSentinels(t *testing.T) {
	s := testkit.NATSServer(t)
	var code atomic.Value
	f := startFake(t, s, func(subject string, n int, data []byte) action {
		return fail(code.Load().(protocol.Code), "scripted")
	})
	c, nc := newClient(t, s)
	cases := []struct {
		code protocol.Code
		want *Error
	}{
		{protocol.CodeHeld, ErrHeld},
		{protocol.CodeNotFound, ErrNotFound},
		{protocol.CodeInvalidArgument, ErrInvalidArgument},
		{protocol.CodeIndeterminate, ErrIndeterminate},
		{protocol.CodeTimeout, ErrTimeout},
		{protocol.CodeDenied, ErrDenied},
		{protocol.CodeMalformed, ErrMalformed},
		{protocol.CodeTooLarge, ErrTooLarge},
		{protocol.CodeInternal, ErrInternal},
		{protocol.CodeControlRefused, ErrControlRefused},
		{protocol.CodeResourceExhausted, ErrResourceExhausted},
		{protocol.CodeUnsupported, ErrUnsupported},
		{protocol.CodeGrantEnded, ErrGrantEnded},
	}
	ops := map[string]func(ctx context.Context) error{
		protocol.SubjectAcquire: func(ctx context.Context) error { _, err := c.Acquire(ctx, "k"); return err },
		protocol.SubjectRelease: func(ctx context.Context) error { return c.Release(ctx, "k", 7) },
		protocol.SubjectGet:     func(ctx context.Context) error { _, err := c.Get(ctx, "k"); return err },
	}
	for _, tc := range cases {
		for subj, op := range ops {
			t.Run(string(tc.code)+"/"+subj, func(t *testing.T) {
				code.Store(tc.code)
				before := f.count(subj)
				ctx := context.Background()
				// An acquire carries a request_id: an unknown outcome is
				// retried with it until the context ends (below), and
				// unsupported / grant_ended for its own id are handled.
				unknown := tc.code == protocol.CodeIndeterminate || tc.code == protocol.CodeInternal
				handled := tc.code == protocol.CodeUnsupported || tc.code == protocol.CodeGrantEnded
				retried := subj == protocol.SubjectAcquire && (unknown || handled)
				if retried {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
				}
				err := op(ctx)
				if !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				for _, other := range allSentinels {
					if other != tc.want && errors.Is(err, other) {
						t.Fatalf("err %v also matches %v", err, other)
					}
				}
				if got := CodeOf(err); got != tc.code {
					t.Fatalf("CodeOf = %q", got)
				}
				var e *Error
				if !errors.As(err, &e) || e.Message != "scripted" || e.Key != "k" || e.Op == "" {
					t.Fatalf("error = %#v", err)
				}
				if IsIndeterminate(err) != (tc.code == protocol.CodeIndeterminate) {
					t.Fatalf("IsIndeterminate(%v) wrong", err)
				}
				f.settle(nc)
				n := f.count(subj) - before
				switch {
				case retried && n < 2:
					t.Fatalf("%d requests, want the acquire retried", n)
				case !retried && n != 1:
					t.Fatalf("%d requests for a definite code, want exactly 1 (no retry)", n)
				}
			})
		}
	}
}

func TestUnknownCodeMatchesOnlyItself(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return fail("quota_exceeded", "from the future") })
	c, nc := newClient(t, s)
	_, err := c.Acquire(context.Background(), "k")
	if CodeOf(err) != "quota_exceeded" {
		t.Fatalf("err = %v", err)
	}
	for _, sentinel := range allSentinels {
		if errors.Is(err, sentinel) {
			t.Fatalf("unknown code matches %v", sentinel)
		}
	}
	if !errors.Is(err, &Error{Code: "quota_exceeded"}) || !errors.Is(err, err) {
		t.Fatal("unknown code does not match itself")
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("unknown code retried: %d requests", n)
	}
}

func TestErrorFromHeaderOnly(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, func(string, int, []byte) action {
		h := nats.Header{}
		h.Set(HeaderServiceError, "key is held")
		h.Set(HeaderServiceErrorCode, string(protocol.CodeHeld))
		return action{body: []byte("key is held"), header: h}
	})
	c, _ := newClient(t, s)
	_, err := c.Acquire(context.Background(), "k")
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("err = %v", err)
	}
}

func TestRetryableCodesRetried(t *testing.T) {
	for _, code := range []protocol.Code{protocol.CodeNotLeader, protocol.CodeUnavailable, protocol.CodeShuttingDown} {
		t.Run(string(code), func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(subject string, n int, data []byte) action {
				if n < 2 {
					return fail(code, "not now")
				}
				return standard(subject, n, data)
			})
			c, _ := newClient(t, s)
			ctx := context.Background()
			l, err := c.Acquire(ctx, "k", WithOwner("o"))
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			reqs := f.requests(protocol.SubjectAcquire)
			if len(reqs) != 3 || l.Token != 3 {
				t.Fatalf("%d requests, token %d", len(reqs), l.Token)
			}
			if reqs[0].reply == reqs[1].reply || reqs[1].reply == reqs[2].reply {
				t.Fatal("a retry reused the reply inbox: not a fresh request")
			}
			if err := c.Release(ctx, "k", l.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if _, err := c.Get(ctx, "k"); err != nil {
				t.Fatalf("Get: %v", err)
			}
			if f.count(protocol.SubjectRelease) != 3 || f.count(protocol.SubjectGet) != 3 {
				t.Fatalf("release/get not retried: %d %d", f.count(protocol.SubjectRelease), f.count(protocol.SubjectGet))
			}
		})
	}
}

func TestRetryableCodeUntilContextDeadline(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return fail(protocol.CodeNotLeader, "no") })
	// The backoff outlasts the context, so the deadline certainly falls
	// in a pause between attempts, not on a request in flight (which
	// would rightly be indeterminate).
	c, _ := newClient(t, s, WithRetryBackoff(time.Hour, time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(ctx, "k")
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("%d requests", n)
	}
	if !errors.Is(err, ErrNotLeader) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if IsIndeterminate(err) || CodeOf(err) != protocol.CodeNotLeader {
		t.Fatalf("err = %v code %q", err, CodeOf(err))
	}
}

func TestNoRespondersRetriedUntilResponderAppears(t *testing.T) {
	s := testkit.NATSServer(t)
	var a attempts
	c, _ := newClient(t, s, withAttemptHook(a.hook))

	type result struct {
		l   *Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.Acquire(context.Background(), "k")
		done <- result{l, err}
	}()
	// Start the responder only once the SDK has seen "no responders".
	testkit.Eventually(t, 5*time.Second, "a no-responders attempt", func() bool {
		for _, err := range a.snapshot() {
			if errors.Is(err, nats.ErrNoResponders) {
				return true
			}
		}
		return false
	})
	f := startFake(t, s, standard)
	res := <-done
	if res.err != nil {
		t.Fatalf("Acquire: %v", res.err)
	}
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("fake saw %d acquires, want 1", n)
	}
	errs := a.snapshot()
	if len(errs) < 2 || errs[len(errs)-1] != nil {
		t.Fatalf("attempts = %v", errs)
	}
	for _, err := range errs[:len(errs)-1] {
		if !errors.Is(err, nats.ErrNoResponders) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("attempt error %v", err)
		}
	}
}

func TestNoRespondersRetryBudget(t *testing.T) {
	s := testkit.NATSServer(t)
	c, _ := newClient(t, s, WithRetryBudget(100*time.Millisecond))
	_, err := c.Get(context.Background(), "k")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
	_, err = c.Acquire(context.Background(), "k")
	if !errors.Is(err, ErrUnavailable) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
}

// An acquire whose reply is lost is sent again with the same request_id
// until its context ends, and only then is it indeterminate.
func TestAcquireSwallowedRetriedWithItsRequestID(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return action{swallow: true} })
	c, nc := newClient(t, s, WithRequestTimeout(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Acquire(ctx, "k", WithOwner("w"))
	if !errors.Is(err, ErrIndeterminate) || !IsIndeterminate(err) || CodeOf(err) != protocol.CodeIndeterminate {
		t.Fatalf("err = %v", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cause not wrapped: %v", err)
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrTimeout) {
		t.Fatalf("indeterminate also matches a definite sentinel: %v", err)
	}
	f.settle(nc)
	reqs := f.requests(protocol.SubjectAcquire)
	if len(reqs) < 2 {
		t.Fatalf("swallowed acquire sent %d times, want it retried", len(reqs))
	}
	ids := map[string]bool{}
	for _, r := range reqs {
		var ar protocol.AcquireRequest
		if err := json.Unmarshal(r.data, &ar); err != nil {
			t.Fatal(err)
		}
		ids[ar.RequestID] = true
	}
	if len(ids) != 1 || ids[""] {
		t.Fatalf("request ids %v, want one, the same on every attempt", ids)
	}
}

// A cluster below version 3 refuses request_id (unsupported): Acquire's
// own id is dropped and the acquire sent again without it; a caller's
// WithRequestID is not dropped behind its back: unsupported is returned.
func TestAcquireUnsupportedFallsBack(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(_ string, _ int, data []byte) action {
		var ar protocol.AcquireRequest
		_ = json.Unmarshal(data, &ar)
		if ar.RequestID != "" {
			return fail(protocol.CodeUnsupported, "cluster version 2")
		}
		return action{body: []byte(`{"key":"k","token":4,"lease_ms":10000}`)}
	})
	c, nc := newClient(t, s)
	l, err := c.Acquire(context.Background(), "k")
	if err != nil || l.Token != 4 || l.RequestID != "" {
		t.Fatalf("acquire: %+v %v", l, err)
	}
	if _, err := c.Acquire(context.Background(), "k", WithRequestID("mine")); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("WithRequestID on an old cluster: %v, want unsupported", err)
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
}

func TestAcquireContextDeadlineInFlightIsIndeterminate(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return action{swallow: true} })
	c, nc := newClient(t, s, WithRequestTimeout(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(ctx, "k")
	if !IsIndeterminate(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

func TestAcquireCanceledInFlightIsIndeterminate(t *testing.T) {
	s := testkit.NATSServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := startFake(t, s, func(string, int, []byte) action {
		cancel() // the caller gives up while the request is at the server
		return action{swallow: true}
	})
	c, nc := newClient(t, s, WithRequestTimeout(time.Minute))
	_, err := c.Acquire(ctx, "k")
	if !IsIndeterminate(err) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

func TestAcquireUnreadableReplyIsIndeterminate(t *testing.T) {
	bodies := map[string][]byte{
		"garbage":   []byte("not json"),
		"array":     []byte("[1,2]"),
		"null":      []byte("null"),
		"no token":  []byte(`{"key":"k","lease_ms":10000}`),
		"wrong key": []byte(`{"key":"other","token":5,"lease_ms":10000}`),
		"bad type":  []byte(`{"key":"k","token":"5"}`),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(string, int, []byte) action { return action{body: body} })
			c, nc := newClient(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := c.Acquire(ctx, "k")
			if !IsIndeterminate(err) {
				t.Fatalf("err = %v", err)
			}
			_, err = c.Get(context.Background(), "k")
			if name == "garbage" || name == "array" {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("get err = %v", err)
				}
			}
			f.settle(nc)
			// Unreadable as a reply at all: retried with the request_id
			// (the server would answer a repeat with the first outcome).
			if n := f.count(protocol.SubjectAcquire); (n < 2) != (name != "garbage" && name != "array") {
				t.Fatalf("%d requests", n)
			}
		})
	}
}

func TestReleaseSwallowedIsIndeterminate(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return action{swallow: true} })
	c, nc := newClient(t, s, WithRequestTimeout(200*time.Millisecond))
	err := c.Release(context.Background(), "k", 3)
	if !IsIndeterminate(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectRelease); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

func TestReleaseNotReleasedIsNotFound(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, func(string, int, []byte) action {
		return action{body: []byte(`{"key":"k","released":false}`)}
	})
	c, _ := newClient(t, s)
	if err := c.Release(context.Background(), "k", 3); !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
}

func TestGetSwallowedIsRetried(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(subject string, n int, data []byte) action {
		if n == 0 {
			return action{swallow: true}
		}
		return action{body: mustJSON(t, protocol.GetReply{Key: "k", Held: true, Token: 4, Owner: "w", LeaseMS: 10000, RemainingMS: 7500, GrantedAtMS: 1700000000000})}
	})
	c, _ := newClient(t, s, WithRequestTimeout(200*time.Millisecond))
	h, err := c.Get(context.Background(), "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	want := Holder{Key: "k", Held: true, Token: 4, Owner: "w", Lease: 10 * time.Second, Remaining: 7500 * time.Millisecond, GrantedAt: time.UnixMilli(1700000000000)}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("holder = %+v, want %+v", h, want)
	}
	if n := f.count(protocol.SubjectGet); n != 2 {
		t.Fatalf("%d get requests, want 2", n)
	}
}

func TestGetSwallowedUntilDeadlineIsDefinite(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(string, int, []byte) action { return action{swallow: true} })
	c, _ := newClient(t, s, WithRequestTimeout(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "k")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
	if n := f.count(protocol.SubjectGet); n < 2 {
		t.Fatalf("get retried %d times", n)
	}
}

func TestContextDoneBeforeSend(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, standard)
	c, nc := newClient(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Acquire(ctx, "k")
	if !errors.Is(err, context.Canceled) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
	if err := c.Release(ctx, "k", 1); !errors.Is(err, context.Canceled) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
	if _, err := c.Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	f.settle(nc)
	if n := len(f.reqs); n != 0 {
		t.Fatalf("%d requests sent on a done context", n)
	}
}

func TestContextCanceledDuringBackoff(t *testing.T) {
	s := testkit.NATSServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var attemptsSeen atomic.Int32
	// The hook runs after an attempt and before the backoff pause: cancel
	// there, so the SDK is certainly pausing (not in flight) when it sees
	// the cancellation. The pause is long, so only ctx can end it.
	nc := testkit.Connect(t, s.ClientURL())
	c, err := New(nc, WithRetryBackoff(time.Hour, time.Hour), WithRetryBudget(0),
		withAttemptHook(func(string, int, error) {
			attemptsSeen.Add(1)
			cancel()
		}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, "k")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, nats.ErrNoResponders) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
	if n := attemptsSeen.Load(); n != 1 {
		t.Fatalf("%d attempts", n)
	}
}

// TestTimeoutMSWithinSDKWait checks that wait_ms <= timeout_ms and that
// the SDK really waits at least timeout_ms for the reply (so a grant the
// server does not release always reaches a listening requester).
func TestTimeoutMSWithinSDKWait(t *testing.T) {
	cases := []struct {
		name     string
		rt       time.Duration
		wait     time.Duration
		ctx      time.Duration
		wantWait int64
	}{
		{"try once", 300 * time.Millisecond, 0, 0, 0},
		{"wait", 300 * time.Millisecond, 200 * time.Millisecond, 0, 200},
		{"ctx shortens wait", time.Minute, 2 * time.Second, 600 * time.Millisecond, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(string, int, []byte) action { return action{swallow: true} })
			c, _ := newClient(t, s, WithRequestTimeout(tc.rt))
			// The swallowed acquire is retried with its request_id until
			// the context ends; the first attempt is the one checked.
			ctxTimeout := tc.ctx
			if ctxTimeout == 0 {
				ctxTimeout = time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), ctxTimeout)
			defer cancel()
			start := time.Now()
			_, err := c.Acquire(ctx, "k", WithWait(tc.wait))
			elapsed := time.Since(start)
			if !IsIndeterminate(err) {
				t.Fatalf("err = %v", err)
			}
			r := decodeAcquire(t, f.requests(protocol.SubjectAcquire)[0].data)
			if tc.wantWait >= 0 && r.WaitMS != tc.wantWait {
				t.Fatalf("wait_ms = %d, want %d", r.WaitMS, tc.wantWait)
			}
			if r.TimeoutMS <= 0 || r.TimeoutMS < r.WaitMS {
				t.Fatalf("timeout_ms %d < wait_ms %d", r.TimeoutMS, r.WaitMS)
			}
			if elapsed < time.Duration(r.TimeoutMS)*time.Millisecond {
				t.Fatalf("SDK gave up after %v, before the declared timeout_ms %d", elapsed, r.TimeoutMS)
			}
			limit := tc.wait + tc.rt
			if tc.ctx > 0 {
				limit = min(limit, tc.ctx)
			}
			if time.Duration(r.TimeoutMS)*time.Millisecond > limit {
				t.Fatalf("timeout_ms %d exceeds the SDK's reply wait %v", r.TimeoutMS, limit)
			}
			if tc.ctx > 0 && (r.WaitMS <= 0 || r.WaitMS >= tc.ctx.Milliseconds()) {
				t.Fatalf("wait_ms %d not shortened to fit the %v context", r.WaitMS, tc.ctx)
			}
		})
	}
}

func TestAcquireTimesInvariants(t *testing.T) {
	for _, rt := range []time.Duration{MinRequestTimeout, 15 * time.Millisecond, 100 * time.Millisecond, 5 * time.Second, 10 * time.Minute} {
		c := &Client{cfg: config{requestTimeout: rt}}
		for _, want := range []time.Duration{0, time.Millisecond, 1500 * time.Microsecond, time.Second, protocol.MaxWait} {
			for _, ctxLeft := range []time.Duration{0, 500 * time.Microsecond, 2 * time.Millisecond, 300 * time.Millisecond, time.Hour} {
				now := time.Now()
				ctx := context.Background()
				if ctxLeft > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithDeadline(ctx, now.Add(ctxLeft))
					defer cancel()
				}
				wait, timeout, replyWait, ok := c.acquireTimes(ctx, now, want)
				if !ok {
					if ctxLeft == 0 || ctxLeft > 5*time.Millisecond {
						t.Fatalf("rt=%v want=%v ctx=%v: no attempt", rt, want, ctxLeft)
					}
					continue
				}
				r := protocol.AcquireRequest{Key: "k", LeaseMS: 1000, WaitMS: wait.Milliseconds(), TimeoutMS: timeout.Milliseconds()}
				if _, _, _, err := r.Validate(); err != nil {
					t.Fatalf("rt=%v want=%v ctx=%v: %v", rt, want, ctxLeft, err)
				}
				switch {
				case timeout%time.Millisecond != 0 || wait%time.Millisecond != 0:
					t.Fatalf("not whole ms: %v %v", wait, timeout)
				case wait > want || wait > timeout || timeout < time.Millisecond || timeout >= replyWait:
					t.Fatalf("rt=%v want=%v ctx=%v: wait %v timeout %v replyWait %v", rt, want, ctxLeft, wait, timeout, replyWait)
				case ctxLeft > 0 && replyWait > ctxLeft:
					t.Fatalf("reply wait %v beyond ctx %v", replyWait, ctxLeft)
				case ctxLeft == 0 && want.Truncate(time.Millisecond) != wait && want+rt <= protocol.MaxTimeout:
					t.Fatalf("rt=%v: wait %v shortened without a ctx deadline", rt, wait)
				}
			}
		}
	}
}

func TestClientSideValidation(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, standard)
	c, nc := newClient(t, s)
	ctx := context.Background()
	long := strings.Repeat("x", core.MaxKeyLen+1)
	checks := map[string]error{}
	_, checks["empty key"] = c.Acquire(ctx, "")
	_, checks["long key"] = c.Acquire(ctx, long)
	_, checks["bad utf8"] = c.Acquire(ctx, "\xff")
	_, checks["long owner"] = c.Acquire(ctx, "k", WithOwner(strings.Repeat("o", core.MaxOwnerLen+1)))
	_, checks["short lease"] = c.Acquire(ctx, "k", WithLease(core.MinLease-time.Millisecond))
	_, checks["huge lease"] = c.Acquire(ctx, "k", WithLease(core.MaxLease+time.Millisecond))
	_, checks["negative lease"] = c.Acquire(ctx, "k", WithLease(-time.Second))
	_, checks["negative wait"] = c.Acquire(ctx, "k", WithWait(-time.Second))
	_, checks["huge wait"] = c.Acquire(ctx, "k", WithWait(protocol.MaxWait+time.Millisecond))
	checks["release token 0"] = c.Release(ctx, "k", 0)
	checks["release empty key"] = c.Release(ctx, "", 1)
	_, checks["get empty key"] = c.Get(ctx, "")
	for name, err := range checks {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	f.settle(nc)
	if len(f.reqs) != 0 {
		t.Fatalf("invalid requests were sent: %d", len(f.reqs))
	}
}

func TestConnectOwnsConnection(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, standard)
	c, err := Connect(s.ClientURL(), WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(context.Background())
	if err != nil || st.Leader != 1 || st.State != "leader" {
		t.Fatalf("status %+v %v", st, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !c.Conn().IsClosed() {
		t.Fatal("Close did not close the owned connection")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// A closed connection is a definite failure, nothing was sent.
	_, err = c.Acquire(context.Background(), "k")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, nats.ErrConnectionClosed) || IsIndeterminate(err) {
		t.Fatalf("err = %v", err)
	}
}

func TestNewDoesNotOwnConnection(t *testing.T) {
	s := testkit.NATSServer(t)
	c, nc := newClient(t, s)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if nc.IsClosed() {
		t.Fatal("Close closed a connection the client does not own")
	}
	if _, err := New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	for _, o := range []Option{WithRequestTimeout(0), WithRequestTimeout(time.Millisecond), WithRetryBackoff(0, 1), WithRetryBackoff(2, 1), WithRetryBudget(-1), WithClock(nil)} {
		if _, err := New(nc, o); err == nil {
			t.Fatal("New accepted a bad option")
		}
	}
}

// TestNotConnectedRetriedUntilReconnected: while the client is
// reconnecting the SDK publishes nothing (no request is buffered to
// surprise us later) and retries once the connection is back.
func TestNotConnectedRetriedUntilReconnected(t *testing.T) {
	s := testkit.NATSServer(t)
	port := s.Addr().(*net.TCPAddr).Port
	url := s.ClientURL()
	var a attempts
	nc, err := nats.Connect(url, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := New(nc, WithRetryBackoff(time.Millisecond, 10*time.Millisecond), withAttemptHook(a.hook))
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	testkit.Eventually(t, 5*time.Second, "client reconnecting", func() bool { return nc.Status() == nats.RECONNECTING })

	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), "k")
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "a not-connected attempt", func() bool { return len(a.snapshot()) > 0 })
	for _, err := range a.snapshot() {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("attempt error %v", err)
		}
	}
	s2 := testkit.NATSServer(t, func(o *server.Options) { o.Port = port })
	f := startFake(t, s2, standard)
	if err := <-done; err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := f.count(protocol.SubjectAcquire); n != 1 {
		t.Fatalf("%d acquires reached the server, want 1", n)
	}
}

func TestLockClock(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, standard)
	clk := &fakeClock{now: time.Unix(1000, 0)}
	c, _ := newClient(t, s, WithClock(clk))
	l, err := c.Acquire(context.Background(), "k", WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !l.Deadline().Equal(time.Unix(1001, 0)) || l.Remaining() != time.Second || !l.Valid() {
		t.Fatalf("deadline %v remaining %v", l.Deadline(), l.Remaining())
	}
	clk.Advance(999 * time.Millisecond)
	if !l.Valid() || l.Remaining() != time.Millisecond {
		t.Fatalf("remaining %v", l.Remaining())
	}
	clk.Advance(time.Millisecond)
	if l.Valid() || l.Remaining() != 0 {
		t.Fatalf("lock still valid at its deadline: remaining %v", l.Remaining())
	}
}

func TestBackoffBounds(t *testing.T) {
	c := &Client{cfg: config{backoffMin: 10 * time.Millisecond, backoffMax: 100 * time.Millisecond}}
	for n := 0; n < 70; n++ {
		for i := 0; i < 50; i++ {
			d := c.backoff(n)
			hi := min(100*time.Millisecond, 10*time.Millisecond<<min(n, 10))
			if d < 10*time.Millisecond || d > hi {
				t.Fatalf("backoff(%d) = %v outside [10ms, %v]", n, d, hi)
			}
		}
	}
}

func TestErrorString(t *testing.T) {
	e := &Error{Code: protocol.CodeHeld, Message: "held by token 3", Op: "acquire", Key: "orders/42"}
	if got, want := e.Error(), `ticketd: acquire "orders/42": held: held by token 3`; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if CodeOf(errors.New("x")) != "" || CodeOf(protocol.Errorf(protocol.CodeDenied, "no")) != protocol.CodeDenied {
		t.Fatal("CodeOf")
	}
}
