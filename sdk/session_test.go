package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// TestSessionHoldsManyLocks: one session, many locks, one keepalive: the
// locks outlive several TTLs without a renewal, Close releases them all
// at once, and the locks' Lost fires with ErrReleased.
func TestSessionHoldsManyLocks(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var locks []*sdk.Lock
	for i := 0; i < 5; i++ {
		l, err := s.Acquire(ctx, fmt.Sprint("job/", i))
		if err != nil {
			t.Fatal(err)
		}
		if l.Lease != 0 || !l.Valid() {
			t.Fatalf("lock in a session: %v, valid %v", l, l.Valid())
		}
		locks = append(locks, l)
	}
	if err := locks[0].Renew(ctx); !errors.Is(err, sdk.ErrInvalidArgument) {
		t.Fatalf("renew of a lock in a session: %v, want invalid argument", err)
	}
	if _, err := s.Acquire(ctx, "job/0"); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("a second acquire of a key the session holds: %v, want held", err)
	}
	start := time.Now()
	for time.Since(start) < 3*time.Second { // three TTLs
		select {
		case <-s.Done():
			t.Fatalf("session ended while kept alive: %v", s.Err())
		case <-locks[4].Lost():
			t.Fatalf("lock lost while its session is kept alive: %v", locks[4].Err())
		case <-time.After(100 * time.Millisecond):
		}
		if !s.Deadline().After(time.Now()) {
			t.Fatal("session deadline passed while kept alive")
		}
	}
	h, err := cl.Get(ctx, "job/3")
	if err != nil || !h.Held || h.Session != s.ID || h.Token != locks[3].Token {
		t.Fatalf("get: %+v %v", h, err)
	}
	n, err := s.Close(ctx)
	if err != nil || n != 5 {
		t.Fatalf("close = %d, %v; want 5", n, err)
	}
	select {
	case <-locks[2].Lost():
		if !errors.Is(locks[2].Err(), sdk.ErrReleased) {
			t.Fatalf("lock of a closed session: %v, want released", locks[2].Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a lock of a closed session did not end")
	}
	if h, err := cl.Get(ctx, "job/3"); err != nil || h.Held {
		t.Fatalf("after close: %+v %v", h, err)
	}
}

// TestClientCloseEndsSessions: Close of a client that does not own its
// connection ends its sessions at once (Done closed; ErrLost and
// ErrClientClosed) and the locks in them, sends no keepalive after it, and
// refuses NewSession; the cluster still holds the session's lock until
// Session.Close (over the connection Close left open) releases it.
func TestClientCloseEndsSessions(t *testing.T) {
	c, lead := cluster(t, 1)
	nc := testkit.Connect(t, c.ClientURL(lead))
	cl, err := sdk.New(nc, sdk.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other := client(t, c, lead)
	ctx := t.Context()
	s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("session still open after the client's Close")
	}
	if err := s.Err(); !errors.Is(err, sdk.ErrLost) || !errors.Is(err, sdk.ErrClientClosed) {
		t.Fatalf("session after Close: %v, want lost and client closed", err)
	}
	select {
	case <-l.Lost():
		if !errors.Is(l.Err(), sdk.ErrLost) || !errors.Is(l.Err(), sdk.ErrClientClosed) {
			t.Fatalf("the session's lock after Close: %v, want lost and client closed", l.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lock of a session the client's Close ended is not lost")
	}
	if _, err := sdk.NewSession(ctx, cl); !errors.Is(err, sdk.ErrClientClosed) {
		t.Fatalf("NewSession after Close: %v, want client closed", err)
	}
	if h, err := other.Get(ctx, "db"); err != nil || !h.Held || h.Session != s.ID {
		t.Fatalf("the cluster's view after Close: %+v %v, want held by session %s", h, err, s.ID)
	}
	if n, err := s.Close(ctx); err != nil || n != 1 {
		t.Fatalf("Session.Close after the client's Close: %d %v, want 1 lock released", n, err)
	}
	if h, err := other.Get(ctx, "db"); err != nil || h.Held {
		t.Fatalf("after Session.Close: %+v %v", h, err)
	}
}

// TestSessionLostBeforeDeadline: with its keepalive cut (the client's
// connection closed), a session's Done closes before its Deadline; the
// server then expires it and its lock goes into its lock-delay: another
// client's try is held with Delay set, its wait is granted after it.
func TestSessionLostBeforeDeadline(t *testing.T) {
	c, lead := cluster(t, 3)
	holder := client(t, c, c.Follower(lead))
	other := client(t, c, lead)
	ctx := t.Context()
	s, err := sdk.NewSession(ctx, holder, sdk.WithSessionTTL(time.Second), sdk.WithSessionLockDelay(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	lost := l.Lost()
	_ = holder.Close() // the holder's process "dies": no more keepalives
	select {
	case <-lost:
		if at := time.Now(); !at.Before(l.Deadline()) {
			t.Fatalf("lost %v after the deadline", at.Sub(l.Deadline()))
		}
		if !errors.Is(l.Err(), sdk.ErrLost) {
			t.Fatalf("lock err %v, want lost", l.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lock of a session that is no longer kept alive was not lost")
	}
	testkit.Eventually(t, 10*time.Second, "the server expired the session", func() bool {
		h, err := other.Get(ctx, "db")
		return err == nil && !h.Held
	})
	_, err = other.Acquire(ctx, "db", sdk.WithLease(time.Second))
	var e *sdk.Error
	if !errors.Is(err, sdk.ErrHeld) || !errors.As(err, &e) || e.Delay <= 0 || e.Delay > 1500*time.Millisecond {
		t.Fatalf("try in the lock-delay: %v, want held with a delay", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := other.Acquire(wctx, "db", sdk.WithLease(time.Second), sdk.WithWait(5*time.Second)); err != nil {
		t.Fatalf("wait through the lock-delay: %v", err)
	}
}

// TestSessionElection: a term held in a session ends when the session
// expires (its holder's keepalive stopped); an observer sees that end
// although the expiry's watch event carries no token (it names the
// session), and the next candidate is elected.
func TestSessionElection(t *testing.T) {
	c, lead := cluster(t, 3)
	holder := client(t, c, c.Follower(lead))
	other := client(t, c, lead)
	ctx := t.Context()
	s, err := sdk.NewSession(ctx, holder, sdk.WithSessionTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.NewElection("leader", "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	// A 30 s lease: the observer re-reads the key only every 30 s, so it
	// must learn a's end from the expiry's event.
	b, err := sdk.NewElection(other, "leader", "b", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	leaders, err := b.Observe(octx)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the observer sees a", func() bool {
		select {
		case h := <-leaders:
			return h.Held && h.Owner == "a" && h.Session == s.ID
		default:
			return false
		}
	})
	_ = holder.Close() // a's process "dies": its session expires
	select {
	case <-a.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a's term did not end with its session")
	}
	select {
	case h := <-leaders:
		if h.Held {
			t.Fatalf("observer: %+v, want no leader", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the observer did not see a's term end from the session's expiry")
	}
	elected := make(chan error, 1)
	go func() { elected <- b.Campaign(ctx) }()
	select {
	case err := <-elected:
		if err != nil || b.Token() <= a.Token() {
			t.Fatalf("b's campaign: %v, token %d after a's %d", err, b.Token(), a.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b was not elected after a's session expired")
	}
	_ = b.Resign(ctx)
}
