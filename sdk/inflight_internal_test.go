package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// heldReplies answers the requests of one subject hold after each
// arrived (never, when answer is nil), and counts those that arrived and
// are not answered yet: a lower bound of what the client has in flight
// (counted after the client sent, uncounted before it can see the reply).
type heldReplies struct {
	hold   time.Duration
	answer func(data []byte) []byte

	mu                  sync.Mutex
	arrived             int
	outstanding, maxOut int
	stopped             bool
	pendingTimers       []*time.Timer
}

func (h *heldReplies) handle(m *nats.Msg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.arrived++
	h.outstanding++
	h.maxOut = max(h.maxOut, h.outstanding)
	if h.answer == nil || h.stopped {
		return
	}
	body := h.answer(m.Data)
	h.pendingTimers = append(h.pendingTimers, time.AfterFunc(h.hold, func() {
		h.mu.Lock()
		h.outstanding--
		h.mu.Unlock()
		_ = m.Respond(body)
	}))
}

func (h *heldReplies) counts() (arrived, maxOut int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.arrived, h.maxOut
}

// stop answers nothing more (at cleanup, before the server goes).
func (h *heldReplies) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	for _, t := range h.pendingTimers {
		t.Stop()
	}
}

// sessionResponder serves session open and close at once on its own
// connection, and keepalives (or renewals, and acquires at once) as ka
// says.
func sessionResponder(t *testing.T, url string, ka *heldReplies) {
	t.Helper()
	nc := testkit.Connect(t, url)
	var mu sync.Mutex
	next := uint64(0)
	serve := func(subject string, f func(m *nats.Msg)) {
		if _, err := nc.QueueSubscribe(subject, protocol.QueueGroup, f); err != nil {
			t.Fatal(err)
		}
	}
	serve(protocol.SubjectSessionOpen, func(m *nats.Msg) {
		var r protocol.SessionOpenRequest
		_ = json.Unmarshal(m.Data, &r)
		mu.Lock()
		next++
		id := next
		mu.Unlock()
		_ = m.Respond(mustJSON(t, protocol.SessionOpenReply{Session: protocol.FormatSessionID(id), TTLMS: r.TTLMS}))
	})
	serve(protocol.SubjectSessionClose, func(m *nats.Msg) {
		var r protocol.SessionRequest
		_ = json.Unmarshal(m.Data, &r)
		_ = m.Respond(mustJSON(t, protocol.SessionCloseReply{Session: r.Session}))
	})
	serve(protocol.SubjectAcquire, func(m *nats.Msg) { _ = m.Respond(grant(m.Data, 7).body) })
	serve(protocol.SubjectRelease, func(m *nats.Msg) { _ = m.Respond(released(m.Data).body) })
	serve(protocol.SubjectSessionKeepAlive, ka.handle)
	serve(protocol.SubjectRenew, ka.handle)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ka.stop)
}

// keepAliveAnswer is a keepalive's reply with the TTL ttl.
func keepAliveAnswer(ttl time.Duration) func([]byte) []byte {
	return func(data []byte) []byte {
		var r protocol.SessionRequest
		_ = json.Unmarshal(data, &r)
		b, _ := json.Marshal(protocol.SessionKeepAliveReply{Session: r.Session, TTLMS: ttl.Milliseconds()})
		return b
	}
}

// TestKeepAlivesInFlightOption: the bound is validated.
func TestKeepAlivesInFlightOption(t *testing.T) {
	s := testkit.NATSServer(t)
	nc := testkit.Connect(t, s.ClientURL())
	for _, tc := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, false}, {1, true}, {DefaultKeepAlivesInFlight, true}, {MaxKeepAlivesInFlight, true}, {MaxKeepAlivesInFlight + 1, false}} {
		c, err := New(nc, WithKeepAlivesInFlight(tc.n))
		if (err == nil) != tc.ok {
			t.Fatalf("WithKeepAlivesInFlight(%d): %v, want ok %v", tc.n, err, tc.ok)
		}
		if err == nil && cap(c.keepAliveSlots.slots) != tc.n {
			t.Fatalf("WithKeepAlivesInFlight(%d): %d slots", tc.n, cap(c.keepAliveSlots.slots))
		}
	}
	c, err := New(nc)
	if err != nil || cap(c.keepAliveSlots.slots) != DefaultKeepAlivesInFlight || cap(c.renewSlots.slots) != DefaultKeepAlivesInFlight {
		t.Fatalf("default: %v", err)
	}
}

// TestKeepAlivesInFlightBounded: a client with many more sessions (or
// auto-renewed locks) than its bound, all falling due together, never has
// more than the bound in flight, reaches it, and keeps every session and
// lock alive.
func TestKeepAlivesInFlightBounded(t *testing.T) {
	const bound, n = 4, 40
	// A 2 s TTL: a keepalive every 600 ms, lost 1.2 s after it is due; 40
	// answered 10 ms after they arrive, 4 at a time, take 100 ms.
	const ttl = 2 * time.Second
	for _, kind := range []string{"sessions", "auto-renew"} {
		t.Run(kind, func(t *testing.T) {
			s := testkit.NATSServer(t)
			answer := keepAliveAnswer(ttl)
			if kind == "auto-renew" {
				answer = func(data []byte) []byte { return renewed(data, ttl.Milliseconds()).body }
			}
			ka := &heldReplies{hold: 10 * time.Millisecond, answer: answer}
			sessionResponder(t, s.ClientURL(), ka)
			c, _ := newClient(t, s, WithKeepAlivesInFlight(bound))
			ctx := t.Context()
			var ended []<-chan struct{}
			var errOf []func() error
			for i := range n { // opened within a few ms: all due together
				if kind == "sessions" {
					ss, err := NewSession(ctx, c, WithSessionTTL(ttl))
					if err != nil {
						t.Fatal(err)
					}
					ended, errOf = append(ended, ss.Done()), append(errOf, ss.Err)
					continue
				}
				l, err := c.Acquire(ctx, fmt.Sprint("k", i), WithLease(ttl), WithAutoRenew())
				if err != nil {
					t.Fatal(err)
				}
				ended, errOf = append(ended, l.Lost()), append(errOf, l.Err)
			}
			testkit.Eventually(t, 15*time.Second, "three rounds of keepalives", func() bool {
				arrived, _ := ka.counts()
				return arrived >= 3*n
			})
			for i, done := range ended {
				select {
				case <-done:
					t.Fatalf("%s %d ended: %v", kind, i, errOf[i]())
				default:
				}
			}
			if _, maxOut := ka.counts(); maxOut > bound || maxOut < bound {
				t.Fatalf("at most %d in flight at once, want exactly the bound %d", maxOut, bound)
			}
		})
	}
}

// TestKeepAliveWaitingForSlotEndsAtLost: a keepalive (or renewal) that
// finds every slot taken until its loss deadline ends its session (or
// lock) with ErrLost before Deadline, naming the wait, and sends nothing.
func TestKeepAliveWaitingForSlotEndsAtLost(t *testing.T) {
	for _, kind := range []string{"session", "renewal"} {
		t.Run(kind, func(t *testing.T) {
			s := testkit.NATSServer(t)
			ka := &heldReplies{hold: time.Millisecond, answer: keepAliveAnswer(time.Second)}
			sessionResponder(t, s.ClientURL(), ka)
			c, _ := newClient(t, s, WithKeepAlivesInFlight(1))
			ctx := t.Context()
			slots := c.keepAliveSlots
			if kind == "renewal" {
				slots = c.renewSlots
			}
			if !slots.take(ctx, 0) {
				t.Fatal("the only slot is not free")
			}
			defer slots.give()
			var done <-chan struct{}
			var errOf func() error
			var deadline func() time.Time
			if kind == "session" {
				ss, err := NewSession(ctx, c, WithSessionTTL(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				done, errOf, deadline = ss.Done(), ss.Err, ss.Deadline
			} else {
				l, err := c.Acquire(ctx, "k", WithLease(time.Second), WithAutoRenew())
				if err != nil {
					t.Fatal(err)
				}
				done, errOf, deadline = l.Lost(), l.Err, l.Deadline
			}
			select {
			case <-done:
				if at := time.Now(); !at.Before(deadline()) {
					t.Fatalf("ended %v after its deadline", at.Sub(deadline()))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("not ended while its keepalive waited for a slot past its loss deadline")
			}
			if err := errOf(); !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "in flight to finish") {
				t.Fatalf("err %v, want lost while waiting for a slot", err)
			}
			if arrived, _ := ka.counts(); arrived != 0 {
				t.Fatalf("%d keepalives or renewals sent without a slot", arrived)
			}
		})
	}
}

// TestKeepAliveWaitingForSlotStops: a keepalive waiting for a slot stops
// at once when its session is closed, or its lock's KeepAlive context is
// cancelled or the lock released: the goroutine is gone long before the
// loss deadline would have ended it.
func TestKeepAliveWaitingForSlotStops(t *testing.T) {
	// A 3 s TTL: due after 900 ms, lost after 2.7 s.
	const ttl = 3 * time.Second
	for _, how := range []string{"session close", "keepalive ctx cancel", "lock release"} {
		t.Run(how, func(t *testing.T) {
			s := testkit.NATSServer(t)
			ka := &heldReplies{hold: time.Millisecond, answer: keepAliveAnswer(ttl)}
			sessionResponder(t, s.ClientURL(), ka)
			c, _ := newClient(t, s, WithKeepAlivesInFlight(1))
			ctx := t.Context()
			slots := c.keepAliveSlots
			if how != "session close" {
				slots = c.renewSlots
			}
			if !slots.take(ctx, 0) {
				t.Fatal("the only slot is not free")
			}
			defer slots.give()
			// Warm up what lives as long as the client (the NATS reply
			// subscription), so that the goroutines can be counted.
			if _, err := c.Acquire(ctx, "warm", WithLease(ttl)); err != nil {
				t.Fatal(err)
			}
			before := runtime.NumGoroutine()
			start := time.Now()
			var stop func() error
			switch how {
			case "session close":
				ss, err := NewSession(ctx, c, WithSessionTTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				stop = func() error { _, err := ss.Close(ctx); return err }
			default:
				l, err := c.Acquire(ctx, "k", WithLease(ttl))
				if err != nil {
					t.Fatal(err)
				}
				kctx, cancel := context.WithCancel(ctx)
				if err := l.KeepAlive(kctx); err != nil {
					t.Fatal(err)
				}
				stop = func() error { cancel(); return nil }
				if how == "lock release" {
					stop = func() error { return l.Release(ctx) }
				}
			}
			testkit.Eventually(t, 5*time.Second, "the keepalive waits for a slot", func() bool { return slots.waiting.Load() == 1 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 5*time.Second, "the waiting keepalive gone", func() bool {
				return slots.waiting.Load() == 0 && runtime.NumGoroutine() <= before
			})
			if took := time.Since(start); took >= ttl*9/10 {
				t.Fatalf("the waiting keepalive stopped after %v: at its loss deadline, not at once", took)
			}
			if arrived, _ := ka.counts(); arrived != 0 {
				t.Fatalf("%d keepalives or renewals sent without a slot", arrived)
			}
		})
	}
}

// TestInflightSlotsTake: a free slot is taken at once even with no
// patience; a full set makes take wait for a give, in order, or give up
// at its patience or its context.
func TestInflightSlotsTake(t *testing.T) {
	s := newInflightSlots(1)
	ctx := t.Context()
	if !s.take(ctx, 0) {
		t.Fatal("free slot not taken")
	}
	start := time.Now()
	if s.take(ctx, 20*time.Millisecond) {
		t.Fatal("a second slot of one")
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("gave up after %v, before its patience", took)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if s.take(cctx, time.Minute) {
		t.Fatal("taken with a cancelled context and no slot free")
	}
	got := make(chan int, 2)
	for i := range 2 {
		go func() {
			if s.take(ctx, time.Minute) {
				got <- i
			}
		}()
		testkit.Eventually(t, 5*time.Second, "waiting", func() bool { return s.waiting.Load() == int64(i+1) })
	}
	for want := range 2 {
		s.give()
		select {
		case i := <-got:
			if i != want {
				t.Fatalf("waiter %d served before waiter %d", i, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a given slot was not taken by a waiter")
		}
	}
	s.give()
}
