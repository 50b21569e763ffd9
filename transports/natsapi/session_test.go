package natsapi_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// call sends body on subject and decodes the reply into out; a "no
// responders" (a leader change under way) is retried until deadline.
func call(t *testing.T, nc *nats.Conn, subject, body string, out any) *protocol.Error {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := nc.Request(subject, []byte(body), 5*time.Second)
		if errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // a pause between retries, not a wait for a condition
			continue
		}
		if err != nil {
			t.Fatalf("%s %s: %v", subject, body, err)
		}
		if err := protocol.ParseReply(m.Data, out); err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) {
				if pe.Code.Retryable() && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				return pe
			}
			t.Fatalf("%s: %v", subject, err)
		}
		return nil
	}
}

func mustCall(t *testing.T, nc *nats.Conn, subject, body string, out any) {
	t.Helper()
	if e := call(t, nc, subject, body, out); e != nil {
		t.Fatalf("%s %s: %v", subject, body, e)
	}
}

func sessionCluster(t *testing.T) (*testcluster.Cluster, int, *nats.Conn) {
	t.Helper()
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster version raised", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := testkit.Connect(t, c.ClientURL(c.Follower(lead)))
	untilServed(t, nc)
	return c, lead, nc
}

func holder(t *testing.T, nc *nats.Conn, key string) protocol.GetReply {
	t.Helper()
	var h protocol.GetReply
	mustCall(t, nc, protocol.SubjectGet, fmt.Sprintf(`{"key":%q}`, key), &h)
	return h
}

// TestSessionRequests: open, acquire in the session, keepalive, get shows
// the session, close releases every lock in one command without a
// lock-delay, and the closed session is not_found.
func TestSessionRequests(t *testing.T) {
	_, _, nc := sessionCluster(t)
	var o protocol.SessionOpenReply
	mustCall(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":5000,"lock_delay_ms":10000}`, &o)
	if o.Session == "" || o.TTLMS != 5000 || o.LockDelayMS != 10000 {
		t.Fatalf("open reply %+v", o)
	}
	for _, k := range []string{"a", "b"} {
		var g protocol.AcquireReply
		mustCall(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"session":%q}`, k, o.Session), &g)
		if g.Token == 0 || g.LeaseMS != 0 {
			t.Fatalf("acquire in a session: %+v", g)
		}
	}
	if e := call(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":"c","session":%q,"lease_ms":1000}`, o.Session), nil); e == nil || e.Code != protocol.CodeInvalidArgument {
		t.Fatalf("session with lease_ms: %v, want invalid_argument", e)
	}
	var ka protocol.SessionKeepAliveReply
	mustCall(t, nc, protocol.SubjectSessionKeepAlive, fmt.Sprintf(`{"session":%q}`, o.Session), &ka)
	if ka.TTLMS != 5000 {
		t.Fatalf("keepalive reply %+v", ka)
	}
	if h := holder(t, nc, "a"); !h.Held || h.Session != o.Session || h.RemainingMS <= 0 || h.RemainingMS > 5000 {
		t.Fatalf("get of a session lock: %+v", h)
	}
	var cl protocol.SessionCloseReply
	mustCall(t, nc, protocol.SubjectSessionClose, fmt.Sprintf(`{"session":%q}`, o.Session), &cl)
	if cl.Released != 2 {
		t.Fatalf("close reply %+v, want 2 released", cl)
	}
	var g protocol.AcquireReply
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"a","lease_ms":1000}`, &g) // no lock-delay after a close
	for _, subj := range []string{protocol.SubjectSessionKeepAlive, protocol.SubjectSessionClose} {
		if e := call(t, nc, subj, fmt.Sprintf(`{"session":%q}`, o.Session), nil); e == nil || e.Code != protocol.CodeNotFound {
			t.Fatalf("%s of a closed session: %v, want not_found", subj, e)
		}
	}
	if e := call(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":5000,"extra":1}`, nil); e == nil || e.Code != protocol.CodeMalformed {
		t.Fatalf("open with an unknown field: %v, want malformed", e)
	}
}

// TestSessionExpiryAndLockDelay: a session that is not kept alive ends on
// the leader's timer; its lock is then in its lock-delay: a try is held
// with delay_ms, a waiter gets it only after the delay. A leased lock with
// a lock_delay_ms is delayed after its lease runs out, not after a release.
func TestSessionExpiryAndLockDelay(t *testing.T) {
	_, _, nc := sessionCluster(t)
	var o protocol.SessionOpenReply
	mustCall(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":1000,"lock_delay_ms":1500}`, &o)
	var g protocol.AcquireReply
	mustCall(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":"s","session":%q}`, o.Session), &g)
	testkit.Eventually(t, 5*time.Second, "the session's lock freed", func() bool { return !holder(t, nc, "s").Held })
	freed := time.Now()
	e := call(t, nc, protocol.SubjectAcquire, `{"key":"s","lease_ms":1000}`, nil)
	if e == nil || e.Code != protocol.CodeHeld || e.DelayMS <= 0 || e.DelayMS > 1500 {
		t.Fatalf("try in the lock-delay: %+v, want held with delay_ms", e)
	}
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"s","lease_ms":1000,"wait_ms":5000}`, &g)
	if waited := time.Since(freed); waited < 1200*time.Millisecond {
		t.Fatalf("granted %v after the expiry, inside the 1.5 s lock-delay", waited)
	}

	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"p","lease_ms":300,"lock_delay_ms":2000}`, &g)
	testkit.Eventually(t, 5*time.Second, "the lease expired", func() bool { return !holder(t, nc, "p").Held })
	if e := call(t, nc, protocol.SubjectAcquire, `{"key":"p","lease_ms":1000}`, nil); e == nil || e.Code != protocol.CodeHeld || e.DelayMS == 0 {
		t.Fatalf("try after a lease expiry with a lock-delay: %+v", e)
	}
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"r","lease_ms":5000,"lock_delay_ms":2000}`, &g)
	mustCall(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":"r","token":%d}`, g.Token), nil)
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"r","lease_ms":1000}`, &g)
}

// TestKeptAliveSessionSurvivesLeaderChange: a session kept alive every
// 300 ms (TTL 2 s) through a leader's death keeps its lock with the same
// token on the new leader, and no ExpireSession of it ever applies; once
// the keepalives stop it expires.
func TestKeptAliveSessionSurvivesLeaderChange(t *testing.T) {
	c, lead, nc := sessionCluster(t)
	var o protocol.SessionOpenReply
	mustCall(t, nc, protocol.SubjectSessionOpen, `{"ttl_ms":2000}`, &o)
	var g protocol.AcquireReply
	mustCall(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":"k","session":%q}`, o.Session), &g)
	var stop atomic.Bool
	var lost atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for !stop.Load() {
			<-tick.C
			m, err := nc.Request(protocol.SubjectSessionKeepAlive, []byte(fmt.Sprintf(`{"session":%q}`, o.Session)), time.Second)
			if err != nil {
				continue // a leader change: the next one is sent 300 ms later
			}
			var pe *protocol.Error
			if err := protocol.ParseReply(m.Data, nil); errors.As(err, &pe) && pe.Code == protocol.CodeNotFound {
				lost.Store(pe.Message)
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // keepalives flowing before the leader dies (not a wait for a condition)
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	newLead := c.Leader(10 * time.Second)
	start := time.Now()
	for time.Since(start) < 3*time.Second { // more than a TTL on the new leader
		if h := holder(t, nc, "k"); !h.Held || h.Token != g.Token {
			t.Fatalf("the kept-alive session's lock is gone after the leader change: %+v", h)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if v := lost.Load(); v != nil {
		t.Fatalf("a keepalive was answered not_found: %v", v)
	}
	id, _ := protocol.ParseSessionID(o.Session)
	var open bool
	c.Node(newLead).Node().View(func(m *core.Machine) { _, open = m.Session(id) })
	if !open {
		t.Fatal("the kept-alive session was expired")
	}
	testkit.Eventually(t, 5*time.Second, "the session expired once not kept alive", func() bool { return !holder(t, nc, "k").Held })
}

// TestNewLeaderNeverShortensLockDelay: a key in a 3 s lock-delay whose
// leader dies right away stays delayed for at least 3 s after the new
// leader took over.
func TestNewLeaderNeverShortensLockDelay(t *testing.T) {
	c, lead, nc := sessionCluster(t)
	var g protocol.AcquireReply
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"d","lease_ms":200,"lock_delay_ms":3000}`, &g)
	testkit.Eventually(t, 5*time.Second, "the lease expired into its delay", func() bool {
		var delayed bool
		c.Node(lead).Node().View(func(m *core.Machine) { _, delayed = m.Delay("d") })
		return delayed
	})
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	c.Leader(10 * time.Second)
	tookOver := time.Now()
	var body json.RawMessage
	mustCall(t, nc, protocol.SubjectAcquire, `{"key":"d","lease_ms":1000,"wait_ms":10000}`, &body)
	if waited := time.Since(tookOver); waited < 2500*time.Millisecond {
		t.Fatalf("granted %v after the new leader took over, inside the 3 s lock-delay it re-arms in full", waited)
	}
}
