package daemon_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// sendAcquire publishes a waiting acquire from nc on an inbox of its own
// and returns the subscription its reply arrives on.
func sendAcquire(t testing.TB, nc *nats.Conn, key, waitID string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"key":%q,"lease_ms":60000,"wait_ms":20000,"wait_id":%q}`, key, waitID)
	if err := nc.PublishRequest(protocol.SubjectAcquire, sub.Subject, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// acquireReply waits for the reply on sub.
func acquireReply(t testing.TB, sub *nats.Subscription, within time.Duration) (protocol.AcquireReply, *protocol.Error) {
	t.Helper()
	m, err := sub.NextMsg(within)
	if err != nil {
		t.Fatalf("no acquire reply: %v", err)
	}
	var r protocol.AcquireReply
	if err := protocol.ParseReply(m.Data, &r); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return r, pe
		}
		t.Fatal(err)
	}
	return r, nil
}

// waitersNext runs the scenario of a waiter that leaves: A holds the key,
// B waits on its own connection (to node bNode) which then closes, C
// waits; A releases. It returns the time from A's release to C's grant.
// When bNode is not the leader, B's request is made to go through that
// follower.
func waitersNext(t *testing.T, nodes []*daemon.Daemon, leader, bNode int) time.Duration {
	ncA := testkit.Connect(t, nodes[leader].ClientURL())
	ncB := testkit.Connect(t, nodes[bNode].ClientURL())
	ncX := testkit.Connect(t, nodes[bNode].ClientURL())
	waiters := func(n float64) func() bool {
		return func() bool { return gaugeValue(t, nodes[leader], "ticketd_waiters") == n }
	}
	var a protocol.AcquireReply
	if e := rawRequest(t, ncA, protocol.SubjectAcquire, `{"key":"k","lease_ms":60000}`, &a); e != nil {
		t.Fatal(e)
	}
	subB := queueB(t, nodes, leader, bNode, ncB, ncX, waiters)
	ncB.Close() // B's process is gone; the leader still has it queued
	testkit.Eventually(t, 5*time.Second, "B's inbox without interest", func() bool {
		_, err := ncX.Request(subB.Subject, nil, time.Second)
		return errors.Is(err, nats.ErrNoResponders)
	})
	subC := sendAcquire(t, ncA, "k", "")
	testkit.Eventually(t, 5*time.Second, "C queued behind B", waiters(2))
	start := time.Now()
	if e := rawRequest(t, ncA, protocol.SubjectRelease, fmt.Sprintf(`{"key":"k","token":%d}`, a.Token), &protocol.ReleaseReply{}); e != nil {
		t.Fatal(e)
	}
	c, e := acquireReply(t, subC, 10*time.Second)
	took := time.Since(start)
	if e != nil {
		t.Fatalf("C: %v", e)
	}
	if took > time.Second {
		t.Fatalf("C was granted %v after A's release; B's grant was not released at once", took)
	}
	// B's grant came between A's token and C's.
	if c.Token < a.Token+2 {
		t.Fatalf("C's token %d: B (token %d) was never granted", c.Token, a.Token+1)
	}
	return took
}

// queueB queues B's waiting acquire. Through a follower: the queue group
// picks any node's subscriber (nats-server has no local preference for
// clients), so an attempt the leader received itself is withdrawn and
// made again until the follower forwarded one (seen on its forward
// subject).
func queueB(t *testing.T, nodes []*daemon.Daemon, leader, bNode int, ncB, ncX *nats.Conn, waiters func(float64) func() bool) *nats.Subscription {
	t.Helper()
	var fwd *nats.Subscription
	if bNode != leader {
		var err error
		if fwd, err = ncX.SubscribeSync(protocol.ForwardSubject(uint64(leader+1), "acquire")); err != nil {
			t.Fatal(err)
		}
		defer fwd.Unsubscribe()
		if err := ncX.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for attempt := 0; attempt < 30; attempt++ {
		waitID := fmt.Sprintf("b%d", attempt)
		sub := sendAcquire(t, ncB, "k", waitID)
		testkit.Eventually(t, 5*time.Second, "B queued", waiters(1))
		if fwd == nil {
			return sub
		}
		if _, err := fwd.NextMsg(500 * time.Millisecond); err == nil {
			return sub
		}
		if e := rawRequest(t, ncB, protocol.SubjectWithdraw, fmt.Sprintf(`{"key":"k","wait_id":%q}`, waitID), &protocol.WithdrawReply{}); e != nil {
			t.Fatal(e)
		}
		testkit.Eventually(t, 5*time.Second, "B's direct attempt withdrawn", waiters(0))
		_ = sub.Unsubscribe()
	}
	t.Fatal("30 attempts never went through the follower")
	return nil
}

// TestLeftWaiterReleasedAtOnce: a waiting client whose connection died is
// still granted the key in its turn; NATS answers the grant with "no
// responders", the leader releases it with its exact token at once, and
// the next waiter is granted within a second (not after B's lease).
func TestLeftWaiterReleasedAtOnce(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	took := waitersNext(t, []*daemon.Daemon{d}, 0, 0)
	if n := counterValue(t, d, "ticketd_grants_abandoned_total", "", ""); n != 1 {
		t.Fatalf("ticketd_grants_abandoned_total = %v, want 1", n)
	}
	t.Logf("killed waiting client: next waiter granted %v after the holder's release", took)
}

// TestLeftWaiterThroughFollower: the same with B's request served by a
// follower: the follower relays the leader's grant, sees "no responders"
// and asks the leader to release it.
func TestLeftWaiterThroughFollower(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	// Requests go to any node of the queue group: every one must know the
	// leader, or a follower answers unavailable.
	leaderID := c.Node(lead).Node().ID()
	testkit.Eventually(t, 10*time.Second, "every node knows the leader", func() bool {
		for _, d := range c.Nodes() {
			if d.Node().Leader() != leaderID {
				return false
			}
		}
		return true
	})
	took := waitersNext(t, c.Nodes(), lead, c.Follower(lead))
	// The follower detected it: the leader itself saw every one of its
	// replies delivered (to the follower).
	if n := counterValue(t, c.Node(lead), "ticketd_grants_abandoned_total", "", ""); n != 0 {
		t.Fatalf("the leader released %v grants itself; want the follower to", n)
	}
	t.Logf("killed waiting client (via a follower): next waiter granted %v after the holder's release", took)
}

// TestWithdraw: a queued wait withdrawn by its requester is gone and the
// next waiter gets the key; a wait withdrawn just after its grant has that
// grant released with its exact token.
func TestWithdraw(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	ncA, _ := connect(t, d)
	ncB, _ := connect(t, d)
	withdraw := func(waitID string) protocol.WithdrawReply {
		t.Helper()
		var r protocol.WithdrawReply
		if e := rawRequest(t, ncB, protocol.SubjectWithdraw, fmt.Sprintf(`{"key":"k","wait_id":%q}`, waitID), &r); e != nil {
			t.Fatal(e)
		}
		return r
	}
	release := func(token uint64) {
		t.Helper()
		if e := rawRequest(t, ncA, protocol.SubjectRelease, fmt.Sprintf(`{"key":"k","token":%d}`, token), &protocol.ReleaseReply{}); e != nil {
			t.Fatal(e)
		}
	}
	var a protocol.AcquireReply
	if e := rawRequest(t, ncA, protocol.SubjectAcquire, `{"key":"k","lease_ms":60000}`, &a); e != nil {
		t.Fatal(e)
	}
	// (ii) B's queued wait withdrawn: C is next.
	subB := sendAcquire(t, ncB, "k", "b1")
	subC := sendAcquire(t, ncA, "k", "c1")
	testkit.Eventually(t, 5*time.Second, "B and C queued", func() bool { return gaugeValue(t, d, "ticketd_waiters") == 2 })
	if r := withdraw("b1"); !r.Withdrawn || r.ReleasedToken != 0 {
		t.Fatalf("withdraw of a queued wait: %+v", r)
	}
	if _, e := acquireReply(t, subB, 5*time.Second); e == nil || e.Code != protocol.CodeTimeout {
		t.Fatalf("B's acquire after its withdrawal: %v, want timeout", e)
	}
	release(a.Token)
	c, e := acquireReply(t, subC, 5*time.Second)
	if e != nil {
		t.Fatalf("C: %v", e)
	}
	// (iii) B waits again and is granted; then withdraws: the grant is
	// released with exactly its token and the key is free.
	subB = sendAcquire(t, ncB, "k", "b2")
	testkit.Eventually(t, 5*time.Second, "B queued", func() bool { return gaugeValue(t, d, "ticketd_waiters") == 1 })
	release(c.Token)
	b, e := acquireReply(t, subB, 5*time.Second)
	if e != nil {
		t.Fatalf("B: %v", e)
	}
	if r := withdraw("b2"); r.ReleasedToken != b.Token || r.Withdrawn {
		t.Fatalf("withdraw after the grant: %+v, want released_token %d", r, b.Token)
	}
	var h protocol.GetReply
	if e := rawRequest(t, ncA, protocol.SubjectGet, `{"key":"k"}`, &h); e != nil || h.Held {
		t.Fatalf("after the withdrawal: %+v %v, want free", h, e)
	}
	// Nothing left to withdraw.
	if r := withdraw("b2"); r != (protocol.WithdrawReply{Key: "k"}) {
		t.Fatalf("second withdrawal: %+v", r)
	}
	raw, _ := json.Marshal(protocol.WithdrawReply{Key: "k"})
	t.Logf("withdraw with nothing to withdraw answers %s", raw)
}
