package sdk_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestSessionKeepAlivesWithinIdentityShare: one client holds many more
// sessions than its bound of keepalives in flight, opened together so
// that their keepalives fall due together, on a real node that admits 16
// requests of one identity at once. The client never has more than its
// bound (8) of keepalives in flight, seen on the wire by a connection
// that watches every message of the node's NATS server, the node never
// refuses one for its identity's share (resource_exhausted), and every
// session lives through three rounds of keepalives. With a bound above
// the node's share the same client is refused (the test shows it can
// fail).
func TestSessionKeepAlivesWithinIdentityShare(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process cluster skipped in -short mode")
	}
	const share, bound, sessions = 16, 8, 100
	// A 3 s TTL: a keepalive every 900 ms, 1.8 s before the session is
	// lost; 100 sessions need about 110 keepalives a second.
	const ttl = 3 * time.Second
	c := testcluster.New(t, 1, testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.MaxInflightPerIdentity = share }))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	for _, tc := range []struct {
		bound       int
		wantBounded bool
	}{{bound, true}, {sdk.MaxKeepAlivesInFlight, false}} {
		w := watchKeepAlives(t, c.ClientURL(lead))
		var exhausted atomic.Int64
		cl, err := sdk.Connect(c.ClientURL(lead), sdk.WithKeepAlivesInFlight(tc.bound), sdk.WithRequestTimeout(2*time.Second),
			sdk.WithAttemptHook(func(op string, _ int, err error) {
				if op == protocol.SessionOpKeepAlive && sdk.CodeOf(err) == protocol.CodeResourceExhausted {
					exhausted.Add(1)
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		ss := make([]*sdk.Session, sessions)
		var wg sync.WaitGroup
		opening := make(chan struct{}, bound) // within the node's share
		for i := range ss {                   // together: their keepalives fall due close together
			wg.Add(1)
			opening <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-opening }()
				s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(ttl))
				if err != nil {
					t.Error(err)
					return
				}
				ss[i] = s
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		testkit.Eventually(t, 20*time.Second, "three rounds of keepalives", func() bool { return w.counts().keepalives >= 3*sessions })
		got := w.counts()
		t.Logf("bound %d: %d keepalives, at most %d in flight, %v each on average, %d refused resource_exhausted", tc.bound, got.keepalives, got.maxOut,
			got.answerTime/time.Duration(max(got.answered, 1)), exhausted.Load())
		if tc.wantBounded {
			if got.maxOut > tc.bound || exhausted.Load() > 0 {
				t.Fatalf("bound %d: %d keepalives in flight at once, %d refused for the identity's share %d", tc.bound, got.maxOut, exhausted.Load(), share)
			}
			for _, s := range ss {
				if err := s.Err(); err != nil {
					t.Fatalf("session %s ended: %v", s.ID, err)
				}
			}
		} else if got.maxOut <= share && exhausted.Load() == 0 {
			t.Fatalf("bound %d: at most %d in flight and none refused: the sessions' keepalives did not fall due together", tc.bound, got.maxOut)
		}
		for _, s := range ss {
			_, _ = s.Close(ctx)
		}
		_ = cl.Close()
	}
}

// keepAliveWatch counts the keepalive requests that crossed one NATS
// server and are not answered yet.
type keepAliveWatch struct {
	mu          sync.Mutex
	outstanding map[string]time.Time // by reply subject (unique per request): when it came
	c           keepAliveCounts
}

type keepAliveCounts struct {
	keepalives, maxOut int
	answered           int
	answerTime         time.Duration // summed over the answered
}

// watchKeepAlives watches every message of the server at url. The server
// hands it a request before the responder can have it, and the reply
// after, so outstanding counts a request from after the client sent it
// until before the client can see the reply: never more than the client
// has in flight.
func watchKeepAlives(t *testing.T, url string) *keepAliveWatch {
	t.Helper()
	w := &keepAliveWatch{outstanding: map[string]time.Time{}}
	nc := testkit.Connect(t, url)
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case m.Subject == protocol.SubjectSessionKeepAlive:
			w.outstanding[m.Reply] = time.Now()
			w.c.keepalives++
			w.c.maxOut = max(w.c.maxOut, len(w.outstanding))
		default:
			if at, ok := w.outstanding[m.Subject]; ok {
				delete(w.outstanding, m.Subject)
				w.c.answered++
				w.c.answerTime += time.Since(at)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// Everything, however fast it comes: a dropped reply would count as
	// in flight for ever.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *keepAliveWatch) counts() keepAliveCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.c
}
