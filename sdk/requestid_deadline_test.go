package sdk

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// A repeated grant for a caller's own request id (WithRequestID, the CLI's
// --request-id) may have been made for an earlier process, long before
// this call's first attempt: its Deadline must come from the lease the
// leader reports left, never from this call's first send. (The grant made
// 9 s before this run, lease 10 s: 1 s is left, not 10.)
func TestRepeatedGrantDeadlineOfCallersID(t *testing.T) {
	s := testkit.NATSServer(t)
	startFake(t, s, func(string, int, []byte) action {
		return action{body: []byte(`{"key":"k","token":5,"lease_ms":10000,"repeated":true,"remaining_ms":1000}`)}
	})
	c, _ := newClient(t, s, WithRequestTimeout(time.Second))
	before := time.Now()
	l, err := c.Acquire(context.Background(), "k", WithLease(10*time.Second), WithRequestID("nightly-2026-12-04"))
	after := time.Now()
	if err != nil || !l.Repeated || l.Token != 5 {
		t.Fatalf("acquire: %+v %v", l, err)
	}
	if latest := after.Add(time.Second); l.Deadline().After(latest) {
		t.Fatalf("deadline %v after the first send, but the leader said 1 s was left (latest safe: %v)", l.Deadline().Sub(before), latest.Sub(before))
	}
	if l.Deadline().Before(before.Add(900 * time.Millisecond)) {
		t.Fatalf("deadline %v after the first send, want about 1 s", l.Deadline().Sub(before))
	}
}
