package sdk

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestCloseStopsKeptAliveLocks: Close of a client that does not own its
// connection (New) ends its kept-alive locks at once (ErrLost and
// ErrClientClosed), and no renewal goes out after it; an auto-renewed
// acquire or a KeepAlive on the closed client is refused before anything
// is sent.
func TestCloseStopsKeptAliveLocks(t *testing.T) {
	f, c, nc := renewingFake(t)
	ctx := context.Background()
	auto, err := c.Acquire(ctx, "a", WithLease(300*time.Millisecond), WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.Acquire(ctx, "b", WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := kept.KeepAlive(ctx); err != nil {
		t.Fatal(err)
	}
	plain, err := c.Acquire(ctx, "c", WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "renewals of both", func() bool { return f.count(protocol.SubjectRenew) >= 4 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lock{auto, kept} {
		select {
		case <-l.Lost():
		default:
			t.Fatalf("lock %q still open after Close", l.Key)
		}
		if err := l.Err(); !errors.Is(err, ErrLost) || !errors.Is(err, ErrClientClosed) {
			t.Fatalf("lock %q after Close: %v, want lost and client closed", l.Key, err)
		}
	}
	if nc.IsClosed() {
		t.Fatal("Close closed a connection the client does not own")
	}
	acquires := f.count(protocol.SubjectAcquire)
	if _, err := c.Acquire(ctx, "d", WithLease(300*time.Millisecond), WithAutoRenew()); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("auto-renewed acquire after Close: %v, want client closed", err)
	}
	if err := plain.KeepAlive(ctx); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("KeepAlive after Close: %v, want client closed", err)
	}
	f.settle(nc)
	if got := f.count(protocol.SubjectAcquire); got != acquires {
		t.Fatalf("an acquire was sent after Close (%d, then %d)", acquires, got)
	}
	f.noMore(t, nc, protocol.SubjectRenew, 250*time.Millisecond, "after Close")
	c.bg.mu.Lock()
	left := len(c.bg.locks) + len(c.bg.sessions)
	c.bg.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d keepalives still recorded after Close", left)
	}
}
