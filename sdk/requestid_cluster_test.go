package sdk_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestRequestIDAcrossLeaderKill: an acquire whose reply the client never
// used (sent raw here, as if its reply were lost) is retried with the
// same request_id after the leader that granted it is killed: the new
// leader answers with the same token, not a second grant or held. Once
// released, the same id gets ErrGrantEnded with that token; Acquire's own
// ids work end to end. A withdrawal by request id on the new leader
// releases a given-up request's grant, then reports it ended, and reports
// an unused id as never granted.
func TestRequestIDAcrossLeaderKill(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	body, _ := json.Marshal(protocol.AcquireRequest{Key: "k", LeaseMS: 30000, RequestID: "retry-1"})
	m, err := cl.Conn().RequestWithContext(ctx, protocol.SubjectAcquire, body)
	if err != nil {
		t.Fatal(err)
	}
	var first protocol.AcquireReply
	if err := protocol.ParseReply(m.Data, &first); err != nil || first.Token == 0 {
		t.Fatalf("first acquire: %s %v", m.Data, err)
	}
	// A second request whose client will give up on it.
	body, _ = json.Marshal(protocol.AcquireRequest{Key: "k2", LeaseMS: 30000, RequestID: "given-up"})
	m, err = cl.Conn().RequestWithContext(ctx, protocol.SubjectAcquire, body)
	var abandoned protocol.AcquireReply
	if err != nil || protocol.ParseReply(m.Data, &abandoned) != nil || abandoned.Token == 0 {
		t.Fatalf("second acquire: %v", err)
	}
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	newLead := c.Leader(10 * time.Second)
	l, err := cl.Acquire(ctx, "k", sdk.WithRequestID("retry-1"), sdk.WithLease(30*time.Second))
	if err != nil {
		t.Fatalf("retry on node %d: %v", newLead+1, err)
	}
	if l.Token != first.Token || !l.Repeated || l.RequestID != "retry-1" {
		t.Fatalf("retry: %v repeated=%v, want token %d repeated", l, l.Repeated, first.Token)
	}
	if first.Fence != "" && l.Fence == "" {
		t.Fatal("the repeated grant has no fence")
	}
	// The new leader settles a given-up request by its id: its grant is
	// released; an id never used was never granted.
	withdraw := func(key, id string) protocol.WithdrawReply {
		t.Helper()
		body, _ := json.Marshal(protocol.WithdrawRequest{Key: key, RequestID: id})
		m, err := cl.Conn().RequestWithContext(ctx, protocol.SubjectWithdraw, body)
		var wr protocol.WithdrawReply
		if err != nil || protocol.ParseReply(m.Data, &wr) != nil {
			t.Fatalf("withdraw %s: %v", id, err)
		}
		return wr
	}
	if wr := withdraw("k2", "given-up"); wr.ReleasedToken != abandoned.Token {
		t.Fatalf("withdraw by request id: %+v, want token %d released", wr, abandoned.Token)
	}
	if h, err := cl.Get(ctx, "k2"); err != nil || h.Held {
		t.Fatalf("k2 after the withdrawal: %+v %v", h, err)
	}
	if wr := withdraw("k2", "given-up"); wr.EndedToken != abandoned.Token {
		t.Fatalf("withdraw again: %+v, want ended token %d", wr, abandoned.Token)
	}
	if wr := withdraw("k2", "never-sent"); !wr.NotGranted {
		t.Fatalf("withdraw of an unused id: %+v, want not_granted", wr)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = cl.Acquire(ctx, "k", sdk.WithRequestID("retry-1"))
	var e *sdk.Error
	if !errors.Is(err, sdk.ErrGrantEnded) || !errors.As(err, &e) || e.Token != first.Token {
		t.Fatalf("after release: %v, want grant_ended with token %d", err, first.Token)
	}
	l2, err := cl.Acquire(ctx, "k")
	if err != nil || l2.Token <= first.Token || l2.Repeated || len(l2.RequestID) != 32 {
		t.Fatalf("a new acquire: %v %v", l2, err)
	}
}
