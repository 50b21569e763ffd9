package sdk

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

func requestIDs(t *testing.T, f *fake) []string {
	t.Helper()
	var ids []string
	for _, r := range f.requests(protocol.SubjectAcquire) {
		ids = append(ids, decodeAcquire(t, r.data).RequestID)
	}
	return ids
}

// The retry rules of an acquire with its own request_id, against a
// scripted server: what each attempt gets, which request ids they carry,
// and what Acquire returns.
func TestAcquireRequestIDRetries(t *testing.T) {
	grant := func(token uint64) action {
		return action{body: []byte(fmt.Sprintf(`{"key":"k","token":%d,"lease_ms":10000}`, token))}
	}
	tests := []struct {
		name    string
		script  []action // attempt n gets script[n] (the last one after)
		wantErr *Error   // nil: a grant
		wantIDs string   // per attempt: a letter per distinct id
	}{
		{"lost reply, then the grant", []action{{swallow: true}, grant(5)}, nil, "aa"},
		{"indeterminate, then the grant", []action{fail(protocol.CodeIndeterminate, "leader lost"), grant(5)}, nil, "aa"},
		{"internal, then the grant", []action{fail(protocol.CodeInternal, "x"), grant(5)}, nil, "aa"},
		{"lost, not_leader, lost, grant", []action{{swallow: true}, fail(protocol.CodeNotLeader, "x"), {swallow: true}, grant(5)}, nil, "aaaa"},
		{"lost, then the ended grant: a new request", []action{{swallow: true}, fail(protocol.CodeGrantEnded, "ended"), grant(6)}, nil, "aab"},
		{"lost, then held: settled, nothing granted", []action{{swallow: true}, fail(protocol.CodeHeld, "held")}, ErrHeld, "aa"},
		{"lost until the context ends", []action{{swallow: true}}, ErrIndeterminate, ""},
		{"lost, then unavailable until the end: still indeterminate", []action{{swallow: true}, fail(protocol.CodeUnavailable, "x")}, ErrIndeterminate, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(subject string, n int, _ []byte) action {
				if subject == protocol.SubjectWithdraw { // an answer that settles nothing
					return action{body: []byte(`{"key":"k","withdrawn":false}`)}
				}
				if subject != protocol.SubjectAcquire {
					return fail(protocol.CodeInternal, "unexpected")
				}
				return tc.script[min(n, len(tc.script)-1)]
			})
			c, nc := newClient(t, s, WithRequestTimeout(100*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			l, err := c.Acquire(ctx, "k")
			f.settle(nc)
			ids := requestIDs(t, f)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("err = %v, want a grant", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v (%d attempts), want %v", err, len(ids), tc.wantErr)
			case tc.wantErr == nil && l.RequestID != ids[len(ids)-1]:
				t.Fatalf("lock's request id %q, last sent %q", l.RequestID, ids[len(ids)-1])
			}
			letters := map[string]byte{}
			got := ""
			for _, id := range ids {
				if len(id) != 32 {
					t.Fatalf("request id %q, want 32 hex characters", id)
				}
				if _, ok := letters[id]; !ok {
					letters[id] = byte('a' + len(letters))
				}
				got += string(letters[id])
			}
			if tc.wantIDs != "" && got != tc.wantIDs {
				t.Fatalf("attempts' request ids %q, want %q", got, tc.wantIDs)
			}
			if tc.wantIDs == "" && (len(letters) != 1 || len(ids) < 2) {
				t.Fatalf("attempts' request ids %q, want one id, retried", got)
			}
		})
	}
}

// An Acquire that ends with an attempt's outcome unknown asks the leader
// to settle its request (withdraw with the request_id): a definite answer
// makes it a plain "gave up" (the context's error, no code, nothing held);
// none keeps it indeterminate.
func TestAcquireSettledWhenGivingUp(t *testing.T) {
	tests := []struct {
		name     string
		withdraw action
		settled  string // "" : still indeterminate
	}{
		{"released", action{body: []byte(`{"key":"k","withdrawn":false,"released_token":7}`)}, "token 7"},
		{"ended", action{body: []byte(`{"key":"k","withdrawn":false,"ended_token":7}`)}, "token 7"},
		{"never granted", action{body: []byte(`{"key":"k","withdrawn":false,"not_granted":true}`)}, "nothing was granted"},
		{"unknown", action{body: []byte(`{"key":"k","withdrawn":false}`)}, ""},
		{"no answer", fail(protocol.CodeUnavailable, "x"), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(subject string, _ int, _ []byte) action {
				if subject == protocol.SubjectWithdraw {
					return tc.withdraw
				}
				return action{swallow: true}
			})
			c, nc := newClient(t, s, WithRequestTimeout(100*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.Acquire(ctx, "k")
			if tc.settled == "" {
				if !IsIndeterminate(err) {
					t.Fatalf("err = %v, want indeterminate", err)
				}
			} else if CodeOf(err) != "" || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.settled) {
				t.Fatalf("err = %v, want the context's error, no code, saying %q", err, tc.settled)
			}
			f.settle(nc)
			ids := requestIDs(t, f)
			w := f.requests(protocol.SubjectWithdraw)
			if len(w) == 0 || (len(w) != 1 && tc.name != "no answer") { // unavailable is retried
				t.Fatalf("%d withdrawals, want 1", len(w))
			}
			var wr protocol.WithdrawRequest
			if err := json.Unmarshal(w[0].data, &wr); err != nil || wr.RequestID != ids[0] || wr.Key != "k" {
				t.Fatalf("withdrawal %s, want the request id %q", w[0].data, ids[0])
			}
		})
	}
}

// An Acquire that sent more than one attempt of its request and ends
// refused (held, or a wait that timed out) settles the request with one
// withdraw by request_id before it returns, so that an earlier attempt
// still in the network cannot be granted afterwards; the caller gets the
// refusal whatever the settle found (a grant an earlier attempt won is
// released by it), or indeterminate if the settle fails. A single
// attempt's refusal costs nothing more: no withdraw.
func TestAcquireRefusedRetrySettles(t *testing.T) {
	held, timeout := fail(protocol.CodeHeld, "held"), fail(protocol.CodeTimeout, "wait ran out")
	tests := []struct {
		name      string
		script    []action // acquire attempt n gets script[n] (the last one after)
		withdraw  action
		want      *Error
		withdraws int // -1: at least one (a failing settle is retried within withdrawTimeout)
		// lostWithdraws: the first withdrawals get no reply. timeout: the
		// client's request timeout (100 ms when 0).
		lostWithdraws int
		timeout       time.Duration
	}{
		{"single attempt held: no settle", []action{held}, action{}, ErrHeld, 0, 0, 0},
		{"lost, then held: settled, not granted", []action{{swallow: true}, held}, action{body: []byte(`{"key":"k","withdrawn":false,"not_granted":true}`)}, ErrHeld, 1, 0, 0},
		{"lost, then held: the earlier attempt had won, released", []action{{swallow: true}, held}, action{body: []byte(`{"key":"k","withdrawn":false,"released_token":7}`)}, ErrHeld, 1, 0, 0},
		{"lost, then timeout: settled", []action{{swallow: true}, timeout}, action{body: []byte(`{"key":"k","withdrawn":false,"not_granted":true}`)}, ErrTimeout, 1, 0, 0},
		{"lost, then held, the settle fails: indeterminate", []action{{swallow: true}, held}, fail(protocol.CodeInternal, "x"), ErrIndeterminate, -1, 0, 0},
		// A withdrawal sent into a paused leader's subscription is lost
		// (NATS keeps routing there until its route is found stale): the
		// settle tries again within withdrawTimeout, even when the request
		// timeout is longer than that.
		{"lost, then held, two withdrawals lost: settled", []action{{swallow: true}, held}, action{body: []byte(`{"key":"k","withdrawn":false,"not_granted":true}`)}, ErrHeld, 3, 2, 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			f := startFake(t, s, func(subject string, n int, _ []byte) action {
				if subject == protocol.SubjectWithdraw {
					if n < tc.lostWithdraws {
						return action{swallow: true}
					}
					return tc.withdraw
				}
				return tc.script[min(n, len(tc.script)-1)]
			})
			rt := cmp.Or(tc.timeout, 100*time.Millisecond)
			c, nc := newClient(t, s, WithRequestTimeout(rt))
			ctx, cancel := context.WithTimeout(context.Background(), 2*rt+3*time.Second)
			defer cancel()
			_, err := c.Acquire(ctx, "k")
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			f.settle(nc)
			ids := requestIDs(t, f)
			w := f.requests(protocol.SubjectWithdraw)
			if len(w) != tc.withdraws && (tc.withdraws >= 0 || len(w) == 0) {
				t.Fatalf("%d withdrawals, want %d", len(w), tc.withdraws)
			}
			if len(w) > 0 {
				var wr protocol.WithdrawRequest
				if err := json.Unmarshal(w[0].data, &wr); err != nil || wr.RequestID != ids[0] || wr.Key != "k" {
					t.Fatalf("withdrawal %s, want the request id %q", w[0].data, ids[0])
				}
			}
		})
	}
}

// A repeated grant's Deadline counts from the first attempt with its
// request id (the grant applied after it), or from the lease the leader
// reports left, whichever is later; never from the repeat's own send.
func TestRepeatedGrantDeadline(t *testing.T) {
	for _, tc := range []struct {
		name        string
		remainingMS int64
	}{{"little left", 1000}, {"all left", 10000}} {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			startFake(t, s, func(_ string, n int, _ []byte) action {
				if n == 0 {
					return action{swallow: true}
				}
				return action{body: []byte(fmt.Sprintf(`{"key":"k","token":5,"lease_ms":10000,"repeated":true,"remaining_ms":%d}`, tc.remainingMS))}
			})
			c, _ := newClient(t, s, WithRequestTimeout(200*time.Millisecond))
			before := time.Now()
			l, err := c.Acquire(context.Background(), "k", WithLease(10*time.Second))
			after := time.Now()
			if err != nil || !l.Repeated || l.Token != 5 {
				t.Fatalf("acquire: %+v %v", l, err)
			}
			// The first attempt's send + lease (sent just after before;
			// the repeat was sent 200 ms later, after the first timed out).
			latest := before.Add(10*time.Second + 100*time.Millisecond)
			if rem := after.Add(time.Duration(tc.remainingMS) * time.Millisecond); rem.After(latest) {
				latest = rem
			}
			if l.Deadline().After(latest) {
				t.Fatalf("deadline %v after the latest safe one %v", l.Deadline().Sub(before), latest.Sub(before))
			}
			if l.Deadline().Before(before.Add(9 * time.Second)) {
				t.Fatalf("deadline %v, want about 10 s after the first attempt", l.Deadline().Sub(before))
			}
		})
	}
}

// WithRequestID: the caller's id is sent as is, on every attempt; an
// ended grant is the caller's to judge (ErrGrantEnded with its token), and
// a bad id is refused before anything is sent.
func TestWithRequestID(t *testing.T) {
	s := testkit.NATSServer(t)
	f := startFake(t, s, func(_ string, n int, _ []byte) action {
		if n == 0 {
			return action{swallow: true}
		}
		b, _ := json.Marshal(protocol.ErrorReply{Error: &protocol.Error{Code: protocol.CodeGrantEnded, Message: "ended", Token: 9}})
		return action{body: b}
	})
	c, nc := newClient(t, s, WithRequestTimeout(100*time.Millisecond))
	_, err := c.Acquire(context.Background(), "k", WithRequestID("job-17"))
	var e *Error
	if !errors.Is(err, ErrGrantEnded) || !errors.As(err, &e) || e.Token != 9 {
		t.Fatalf("err = %v, want grant_ended with token 9", err)
	}
	f.settle(nc)
	if ids := requestIDs(t, f); len(ids) != 2 || ids[0] != "job-17" || ids[1] != "job-17" {
		t.Fatalf("request ids %q", ids)
	}
	for _, bad := range []string{"has space", string(make([]byte, protocol.MaxRequestIDLen+1)), "é"} {
		if _, err := c.Acquire(context.Background(), "k", WithRequestID(bad)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("WithRequestID(%q): %v", bad, err)
		}
	}
	f.settle(nc)
	if n := f.count(protocol.SubjectAcquire); n != 2 {
		t.Fatalf("%d requests, want the bad ids refused locally", n)
	}
}
