package natsapi

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// A follower that cannot relay the leader's grant asks the leader to
// release it (nobody can hold it), except a repeated grant: an earlier
// attempt with its request id may have received it and hold the lock
// (the leader's own path spares it the same way, service.go acquire).
func TestFollowerKeepsRepeatedGrantItCannotRelay(t *testing.T) {
	ns := testkit.NATSServer(t)
	nc := testkit.Connect(t, ns.ClientURL())
	var releases atomic.Int64
	sub, err := nc.Subscribe(protocol.ForwardSubject(2, "release"), func(m *nats.Msg) {
		releases.Add(1)
		_ = m.Respond([]byte(`{"key":"k","released":true}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{Conn: nc, Now: time.Now}, log: testkit.QuietLogger(), ctx: context.Background()}
	s.releaseUndelivered(2, "", []byte(`{"key":"k","token":7,"lease_ms":60000,"repeated":true,"remaining_ms":50000}`))
	s.releaseUndelivered(2, "", []byte(`{"key":"k","token":8,"lease_ms":60000}`))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// releaseUndelivered waits for the leader's answer, so both are in.
	if n := releases.Load(); n != 1 {
		t.Fatalf("%d releases asked, want 1: the fresh grant's, not the repeated one's", n)
	}
}
