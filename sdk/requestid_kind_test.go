package sdk

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Lock.Limit and Lock.Shared are the kind the reply names (a repeat by a
// leader that did not check the retry's kind is of the request's kind,
// not the retry's), and the options' only from a leader that names
// neither (older than the reply's limit and mode, or a mutex).
func TestLockKindFromReply(t *testing.T) {
	tests := []struct {
		name       string
		replyLimit uint32
		replyMode  string
		opts       []AcquireOption
		wantLimit  int
		wantShared bool
	}{
		{name: "semaphore named, mutex asked", replyLimit: 3, opts: nil, wantLimit: 3},
		{name: "semaphore named, other limit asked", replyLimit: 3, opts: []AcquireOption{WithLimit(2)}, wantLimit: 3},
		{name: "shared named, semaphore asked", replyLimit: 1, replyMode: protocol.ModeShared, opts: []AcquireOption{WithLimit(3)}, wantLimit: 1, wantShared: true},
		{name: "shared named, shared asked", replyLimit: 1, replyMode: protocol.ModeShared, opts: []AcquireOption{WithShared()}, wantLimit: 1, wantShared: true},
		{name: "semaphore named and asked", replyLimit: 3, opts: []AcquireOption{WithLimit(3)}, wantLimit: 3},
		{name: "none named, mutex asked", opts: nil, wantLimit: 1},
		{name: "none named (older leader), semaphore asked", opts: []AcquireOption{WithLimit(3)}, wantLimit: 3},
		{name: "none named (older leader), shared asked", opts: []AcquireOption{WithShared()}, wantLimit: 1, wantShared: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := testkit.NATSServer(t)
			startFake(t, s, func(subject string, n int, data []byte) action {
				if subject != protocol.SubjectAcquire {
					return standard(subject, n, data)
				}
				var r protocol.AcquireRequest
				_ = json.Unmarshal(data, &r)
				b, _ := json.Marshal(protocol.AcquireReply{Key: r.Key, Token: 7, Owner: r.Owner, LeaseMS: r.LeaseMS,
					Repeated: true, RemainingMS: r.LeaseMS, Limit: tc.replyLimit, Mode: tc.replyMode})
				return action{body: b}
			})
			c, _ := newClient(t, s)
			l, err := c.Acquire(context.Background(), "k", append(tc.opts, WithRequestID("r1"))...)
			if err != nil {
				t.Fatal(err)
			}
			if l.Limit != tc.wantLimit || l.Shared != tc.wantShared || l.Token != 7 {
				t.Fatalf("lock limit %d shared %v token %d, want limit %d shared %v", l.Limit, l.Shared, l.Token, tc.wantLimit, tc.wantShared)
			}
		})
	}
}
