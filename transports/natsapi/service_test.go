package natsapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// singleNode runs a one-voter raft node with its lock service, no NATS.
func singleNode(t *testing.T) *lockservice.Service {
	t.Helper()
	log := testkit.QuietLogger()
	st, err := raftstore.Open(t.TempDir(), raftstore.StoreOptions{NoSync: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := lockservice.New(lockservice.Config{Logger: log})
	n, err := raftstore.NewNode(raftstore.Config{ID: 1, Peers: []uint64{1}, Store: st, Observers: []raftstore.Observer{srv}, Logger: log, TickInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(n)
	n.Start()
	t.Cleanup(func() { srv.Close(); n.Stop(); _ = st.Close() })
	testkit.Eventually(t, 10*time.Second, "a leader", srv.IsLeader)
	return srv
}

// TestUnwritableReplyReleasesGrant: when the granted reply cannot be
// written at all, nobody can hold the token, so the leader releases it
// with that exact token (SPEC §4.4).
func TestUnwritableReplyReleasesGrant(t *testing.T) {
	srv := singleNode(t)
	s := &Service{cfg: Config{Locks: srv, Now: time.Now}, log: testkit.QuietLogger(), ctx: context.Background()}
	var failed *protocol.Error
	req := &request{
		op:       "acquire",
		data:     []byte(`{"key":"k","lease_ms":60000,"timeout_ms":5000}`),
		reply:    "_INBOX.gone",
		received: time.Now(),
		ok:       func([]byte) error { return errors.New("nats: connection closed") },
		fail:     func(e *protocol.Error) error { failed = e; return nil },
	}
	s.acquire(req)
	if failed != nil {
		t.Fatalf("acquire failed: %v", failed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := srv.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !h.Held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grant with unwritable reply still held: %+v", h)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The token was consumed and released: the next grant gets a larger one.
	g, err := srv.Acquire(ctx, lockservice.AcquireParams{Key: "k", Lease: time.Second, Timeout: 5 * time.Second})
	if err != nil || g.Token != 2 {
		t.Fatalf("next grant %+v %v, want token 2", g, err)
	}
}
