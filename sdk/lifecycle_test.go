package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// renewed answers a renew with the lease leaseMS (or the requested one,
// if longer).
func renewed(data []byte, leaseMS int64) action {
	var r protocol.RenewRequest
	_ = json.Unmarshal(data, &r)
	b, _ := json.Marshal(protocol.RenewReply{Key: r.Key, Token: r.Token, LeaseMS: max(leaseMS, r.LeaseMS), Index: 500})
	return action{body: b}
}

// TestRenewMovesDeadline: a confirmed renewal moves the deadline to the
// renew's send time plus the replied lease; a lost or refused one leaves
// it where it was; a bad reply is indeterminate.
func TestRenewMovesDeadline(t *testing.T) {
	s := testkit.NATSServer(t)
	var mode atomic.Value
	mode.Store("ok")
	f := startFake(t, s, func(subject string, n int, data []byte) action {
		if subject != protocol.SubjectRenew {
			return standard(subject, n, data)
		}
		switch mode.Load() {
		case "swallow":
			return action{swallow: true}
		case "gone":
			return fail(protocol.CodeNotFound, "no lock")
		case "otherToken":
			return action{body: mustJSON(t, protocol.RenewReply{Key: "k", Token: 99, LeaseMS: 5000})}
		}
		return renewed(data, 5000)
	})
	c, _ := newClient(t, s, WithRequestTimeout(200*time.Millisecond))
	ctx := context.Background()
	l, err := c.Acquire(ctx, "k", WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := l.Deadline()
	before := time.Now()
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	after := time.Now()
	if d := l.Deadline(); d.Before(before.Add(5*time.Second)) || d.After(after.Add(5*time.Second)) || !d.After(first) {
		t.Fatalf("deadline after renew %v, want send time + 5s within [%v, %v]", d, before.Add(5*time.Second), after.Add(5*time.Second))
	}
	var rr protocol.RenewRequest
	if err := json.Unmarshal(f.requests(protocol.SubjectRenew)[0].data, &rr); err != nil || rr.Key != "k" || rr.Token != l.Token || rr.LeaseMS != 0 {
		t.Fatalf("renew request %+v %v", rr, err)
	}
	cases := []struct {
		mode string
		want *Error
	}{
		{"swallow", ErrIndeterminate},
		{"otherToken", ErrIndeterminate},
		{"gone", ErrNotFound},
	}
	for _, tc := range cases {
		kept := l.Deadline()
		mode.Store(tc.mode)
		if err := l.Renew(ctx); !errors.Is(err, tc.want) {
			t.Fatalf("%s: err %v, want %v", tc.mode, err, tc.want)
		}
		if !l.Deadline().Equal(kept) {
			t.Fatalf("%s moved the deadline", tc.mode)
		}
	}
	if _, err := c.Renew(ctx, "k", 0, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("token 0: %v", err)
	}
	if _, err := c.Renew(ctx, "k", 1, time.Millisecond); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("tiny lease: %v", err)
	}
}

// TestKeepAliveLostBeforeDeadline: a keepalive renews while the server
// answers; when renewals stop getting through (swallowed, or the server
// says the lock is gone), Lost closes and Context ends before the local
// deadline, never after, and the deadline never moves past the last
// confirmed renewal.
func TestKeepAliveLostBeforeDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     func(data []byte) action
		wantCode []*Error // the last renewal error is one of these
		early    bool     // ends at once rather than at deadline - margin
	}{
		{"swallowed", func([]byte) action { return action{swallow: true} }, []*Error{ErrIndeterminate}, false},
		// Unavailable is retried until the keepalive gives up at deadline -
		// margin; an attempt in flight then is cut short: indeterminate.
		{"unavailable", func([]byte) action { return fail(protocol.CodeUnavailable, "no leader") }, []*Error{ErrUnavailable, ErrIndeterminate}, false},
		{"not_found", func([]byte) action { return fail(protocol.CodeNotFound, "gone") }, []*Error{ErrNotFound}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			var failing atomic.Bool
			f := startFake(t, s, func(subject string, n int, data []byte) action {
				if subject == protocol.SubjectRenew {
					if failing.Load() {
						return tc.fail(data)
					}
					return renewed(data, 600)
				}
				return standard(subject, n, data)
			})
			c, _ := newClient(t, s, WithRequestTimeout(time.Second))
			const lease, margin = 600 * time.Millisecond, 100 * time.Millisecond
			l, err := c.Acquire(context.Background(), "k", WithLease(lease), WithAutoRenew(WithSafetyMargin(margin)))
			if err != nil {
				t.Fatal(err)
			}
			// Three renewals go through: the lock outlives its first lease.
			testkit.Eventually(t, 5*time.Second, "three renewals", func() bool { return f.count(protocol.SubjectRenew) >= 3 })
			if err := l.Err(); err != nil {
				t.Fatalf("lock ended while renewals succeed: %v", err)
			}
			failing.Store(true)
			start := time.Now()
			select {
			case <-l.Lost():
			case <-time.After(5 * time.Second):
				t.Fatal("Lost never closed")
			}
			lostAt := time.Now()
			dl := l.Deadline()
			if !lostAt.Before(dl) {
				t.Fatalf("Lost closed %v after the deadline", lostAt.Sub(dl))
			}
			t.Logf("lost %v before the local deadline (margin %v), %v after renewals began failing", dl.Sub(lostAt), margin, lostAt.Sub(start))
			if tc.early && lostAt.Sub(start) > lease/2 {
				t.Fatalf("a refused renewal ended the lock only after %v", lostAt.Sub(start))
			}
			err = l.Err()
			if !errors.Is(err, ErrLost) || !slices.ContainsFunc(tc.wantCode, func(e *Error) bool { return errors.Is(err, e) }) {
				t.Fatalf("Err = %v, want ErrLost wrapping one of %v", err, tc.wantCode)
			}
			if err := context.Cause(l.Context()); !errors.Is(err, ErrLost) {
				t.Fatalf("Context cause %v", err)
			}
			// A lost lock stays lost and is not renewed again.
			if err := l.Renew(context.Background()); !errors.Is(err, ErrLost) {
				t.Fatalf("Renew after lost: %v", err)
			}
		})
	}
}

// TestReleaseStopsKeepAlive: Release ends the lock (ErrReleased) and no
// renewal is sent after it.
func TestReleaseStopsKeepAlive(t *testing.T) {
	f, c, nc := renewingFake(t)
	l, err := c.Acquire(context.Background(), "k", WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.KeepAlive(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.KeepAlive(context.Background()); err == nil {
		t.Fatal("a second KeepAlive was accepted")
	}
	testkit.Eventually(t, 5*time.Second, "two renewals", func() bool { return f.count(protocol.SubjectRenew) >= 2 })
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); !errors.Is(err, ErrReleased) {
		t.Fatalf("Err after Release = %v", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost open after Release")
	}
	f.noMore(t, nc, protocol.SubjectRenew, 250*time.Millisecond, "after Release")
}

// TestLockWithoutKeepAliveEndsBeforeDeadline: Context of a lock nobody
// renews ends a margin before its deadline.
func TestLockWithoutKeepAliveEndsBeforeDeadline(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, standard)
	c, _ := newClient(t, s)
	l, err := c.Acquire(context.Background(), "k", WithLease(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	if now := time.Now(); !now.Before(l.Deadline()) {
		t.Fatalf("Context ended %v after the deadline", now.Sub(l.Deadline()))
	}
	if !errors.Is(context.Cause(l.Context()), ErrLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
}

// TestKeepAliveOptionsChecked: a margin beyond 3/4 of the lease is refused
// before anything is sent.
func TestKeepAliveOptionsChecked(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, standard)
	c, nc := newClient(t, s)
	_, err := c.Acquire(context.Background(), "k", WithLease(time.Second), WithAutoRenew(WithSafetyMargin(800*time.Millisecond)))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("err = %v", err)
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 0 {
		t.Fatalf("%d acquires sent", n)
	}
}

// waitingFake answers acquires that wait by holding them (recording their
// reply inboxes) and answers withdraw with onWithdraw.
type waitingFake struct {
	mu       sync.Mutex
	inboxes  map[string]string // wait_id -> reply inbox
	withdraw func(req protocol.WithdrawRequest, inbox string) action
}

func (w *waitingFake) script(nc func() *nats.Conn) func(string, int, []byte) action {
	return func(subject string, n int, data []byte) action {
		switch subject {
		case protocol.SubjectAcquire:
			var r protocol.AcquireRequest
			_ = json.Unmarshal(data, &r)
			if r.WaitMS == 0 {
				return grant(data, 1)
			}
			return action{swallow: true} // queued
		case protocol.SubjectWithdraw:
			var r protocol.WithdrawRequest
			_ = json.Unmarshal(data, &r)
			w.mu.Lock()
			inbox := w.inboxes[r.WaitID]
			w.mu.Unlock()
			return w.withdraw(r, inbox)
		}
		return standard(subject, n, data)
	}
}

// TestAbandonedWaitIsWithdrawn: when the caller's context ends while an
// acquire waits, the SDK withdraws the wait by its wait_id; depending on
// what the withdrawal finds, the error is a definite context error
// (withdrawn, or its grant released, or a grant that raced the withdrawal
// released by the SDK with its exact token) or indeterminate.
func TestAbandonedWaitIsWithdrawn(t *testing.T) {
	withdrawReply := func(r protocol.WithdrawRequest, wr protocol.WithdrawReply) action {
		wr.Key = r.Key
		b, _ := json.Marshal(wr)
		return action{body: b}
	}
	var fnc *nats.Conn
	cases := []struct {
		name         string
		withdraw     func(r protocol.WithdrawRequest, inbox string) action
		definite     bool
		wantReleased uint64
	}{
		{"withdrawn", func(r protocol.WithdrawRequest, _ string) action {
			return withdrawReply(r, protocol.WithdrawReply{Withdrawn: true})
		}, true, 0},
		{"grant released by the server", func(r protocol.WithdrawRequest, _ string) action {
			return withdrawReply(r, protocol.WithdrawReply{ReleasedToken: 41})
		}, true, 0},
		{"grant raced the withdrawal", func(r protocol.WithdrawRequest, inbox string) action {
			// The grant reaches the waiter's inbox before the withdraw reply.
			b, _ := json.Marshal(protocol.AcquireReply{Key: r.Key, Token: 42, LeaseMS: 60000, Index: 7})
			_ = fnc.Publish(inbox, b)
			_ = fnc.Flush()
			return withdrawReply(r, protocol.WithdrawReply{})
		}, true, 42},
		{"not found, nothing raced", func(r protocol.WithdrawRequest, _ string) action {
			return withdrawReply(r, protocol.WithdrawReply{})
		}, false, 0},
		{"withdraw unanswered", func(protocol.WithdrawRequest, string) action {
			return fail(protocol.CodeInternal, "broken")
		}, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			wf := &waitingFake{inboxes: map[string]string{}, withdraw: tc.withdraw}
			f := startFake(t, s, wf.script(func() *nats.Conn { return fnc }))
			fnc = f.nc
			c, nc := newClient(t, s)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := c.Acquire(ctx, "k", WithWait(time.Minute), WithLease(time.Minute))
				done <- err
			}()
			testkit.Eventually(t, 5*time.Second, "the acquire queued", func() bool { return f.count(protocol.SubjectAcquire) == 1 })
			req := decodeAcquire(t, f.requests(protocol.SubjectAcquire)[0].data)
			if req.WaitID == "" {
				t.Fatal("a waiting acquire without wait_id")
			}
			wf.mu.Lock()
			wf.inboxes[req.WaitID] = f.requests(protocol.SubjectAcquire)[0].reply
			wf.mu.Unlock()
			cancel()
			err := <-done
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v does not match context.Canceled", err)
			}
			if IsIndeterminate(err) == tc.definite {
				t.Fatalf("err %v: indeterminate %v, want %v", err, IsIndeterminate(err), !tc.definite)
			}
			ws := f.requests(protocol.SubjectWithdraw)
			// A withdrawal that failed is sent again within withdrawTimeout
			// (it carries the request id: withdraw.go), and once more as
			// the acquire gives up (settleRequest, lock.go).
			if len(ws) != 1 && (tc.name != "withdraw unanswered" || len(ws) < 2) {
				t.Fatalf("%d withdraw requests", len(ws))
			}
			var wr protocol.WithdrawRequest
			if err := json.Unmarshal(ws[0].data, &wr); err != nil || wr.WaitID != req.WaitID || wr.Key != "k" || wr.RequestID != req.RequestID || wr.RequestID == "" {
				t.Fatalf("withdraw %+v, want wait_id %q and request_id %q", wr, req.WaitID, req.RequestID)
			}
			f.settle(nc)
			var releases []uint64
			for _, r := range f.requests(protocol.SubjectRelease) {
				var rr protocol.ReleaseRequest
				_ = json.Unmarshal(r.data, &rr)
				releases = append(releases, rr.Token)
			}
			if want := fmt.Sprint(tc.wantReleased); (tc.wantReleased == 0 && len(releases) != 0) || (tc.wantReleased != 0 && fmt.Sprint(releases) != "["+want+"]") {
				t.Fatalf("released %v, want token %d", releases, tc.wantReleased)
			}
		})
	}
}

// TestListRefusesBrokenPages: a page that breaks the protocol's promises
// (order, prefix, limit, progress) is ErrMalformed, so ListAll cannot
// loop on it.
func TestListRefusesBrokenPages(t *testing.T) {
	page := func(more bool, keys ...string) protocol.ListReply {
		lr := protocol.ListReply{More: more, Index: 9}
		for _, k := range keys {
			lr.Locks = append(lr.Locks, protocol.GetReply{Key: k, Held: true, Token: 1, LeaseMS: 1000})
		}
		return lr
	}
	for _, tc := range []struct {
		name  string
		reply protocol.ListReply
		ok    bool
	}{
		{"fine", page(true, "a/1", "a/2"), true},
		{"empty but more", page(true), false},
		{"out of order", page(false, "a/2", "a/1"), false},
		{"repeated", page(false, "a/1", "a/1"), false},
		{"outside the prefix", page(false, "b/1"), false},
		{"over the limit", page(false, "a/1", "a/2", "a/3"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			startFake(t, s, func(subject string, n int, data []byte) action {
				return action{body: mustJSON(t, tc.reply)}
			})
			c, _ := newClient(t, s)
			_, err := c.List(context.Background(), "a/", "", 2)
			if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, ErrMalformed)) {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestCheckPageCursor: a page read after a cursor inside a key may start
// with that key's later holders, and only those; next_after_token must be
// the last lock's token of a page with more.
func TestCheckPageCursor(t *testing.T) {
	lock := func(k string, tok uint64) protocol.GetReply {
		return protocol.GetReply{Key: k, Held: true, Token: tok, LeaseMS: 1000}
	}
	for _, tc := range []struct {
		name string
		req  protocol.ListRequest
		lr   protocol.ListReply
		ok   bool
	}{
		{"rest of the key", protocol.ListRequest{After: "a/1", AfterToken: 4}, protocol.ListReply{Locks: []protocol.GetReply{lock("a/1", 5), lock("a/1", 7), lock("a/2", 1)}}, true},
		{"a holder at the cursor", protocol.ListRequest{After: "a/1", AfterToken: 4}, protocol.ListReply{Locks: []protocol.GetReply{lock("a/1", 4)}}, false},
		{"the key without a token", protocol.ListRequest{After: "a/1"}, protocol.ListReply{Locks: []protocol.GetReply{lock("a/1", 5)}}, false},
		{"holders out of token order", protocol.ListRequest{}, protocol.ListReply{Locks: []protocol.GetReply{lock("a/1", 5), lock("a/1", 3)}}, false},
		{"next token of the last lock", protocol.ListRequest{Limit: 2}, protocol.ListReply{More: true, NextAfterToken: 3, Locks: []protocol.GetReply{lock("a/1", 1), lock("a/1", 3)}}, true},
		{"next token of another lock", protocol.ListRequest{Limit: 2}, protocol.ListReply{More: true, NextAfterToken: 1, Locks: []protocol.GetReply{lock("a/1", 1), lock("a/1", 3)}}, false},
		{"next token without more", protocol.ListRequest{Limit: 2}, protocol.ListReply{NextAfterToken: 3, Locks: []protocol.GetReply{lock("a/1", 1), lock("a/1", 3)}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkPage(&tc.lr, tc.req); (err == nil) != tc.ok {
				t.Fatalf("checkPage = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
