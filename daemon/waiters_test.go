package daemon_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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
// When bNode is not the leader, B's request and grant cross a NATS route.
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
	subB := queueB(t, ncB, waiters)
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

// queueB queues B's waiting acquire on ncB and waits until the leader
// counts it.
func queueB(t *testing.T, ncB *nats.Conn, waiters func(float64) func() bool) *nats.Subscription {
	t.Helper()
	sub := sendAcquire(t, ncB, "k", "b")
	testkit.Eventually(t, 5*time.Second, "B queued", waiters(1))
	return sub
}

// TestLeftWaiterReleasedAtOnce: a waiting client whose connection died is
// still granted the key in its turn; NATS answers the grant with "no
// responders", the leader releases it with its exact token at once, and
// the next waiter is granted within a second (not after B's lease).
func TestLeftWaiterReleasedAtOnce(t *testing.T) {
	// B's wait must still be queued when its turn comes (with the sweep,
	// it ends within seconds of B leaving: TestWaitFloodIsolated).
	d := startNode(t, t.TempDir(), daemon.Options{KeepLeftWaits: true})
	defer d.Close()
	took := waitersNext(t, []*daemon.Daemon{d}, 0, 0)
	if n := counterValue(t, d, "ticketd_grants_abandoned_total", "", ""); n != 1 {
		t.Fatalf("ticketd_grants_abandoned_total = %v, want 1", n)
	}
	t.Logf("killed waiting client: next waiter granted %v after the holder's release", took)
}

// TestLeftWaiterOnAnotherServer: the same with B connected to a
// follower's NATS server, so its request and the grant cross a NATS route
// (only the leader serves lock requests): the leader's server learns that
// B's inbox lost its interest over the route, answers the grant "no
// responders", and the leader releases it at once.
func TestLeftWaiterOnAnotherServer(t *testing.T) {
	c := testcluster.New(t, 3, testcluster.WithOptions(func(_ int, o *daemon.Options) { o.KeepLeftWaits = true }))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	took := waitersNext(t, c.Nodes(), lead, c.Follower(lead))
	if n := counterValue(t, c.Node(lead), "ticketd_grants_abandoned_total", "", ""); n != 1 {
		t.Fatalf("ticketd_grants_abandoned_total on the leader = %v, want 1", n)
	}
	t.Logf("killed waiting client (on another server): next waiter granted %v after the holder's release", took)
}

// TestForged503ReleasesNothing: a client that received a grant as a
// waiter sees that grant's reply subject on the node's delivery inbox. It
// must not be able to forge NATS's "no responders" answer for another
// waiter's grant (the next one delivered) and so have the leader release a
// lock its holder did receive.
func TestForged503ReleasesNothing(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	nc := testkit.Connect(t, d.ClientURL())
	attacker := testkit.Connect(t, d.ClientURL())
	victim := testkit.Connect(t, d.ClientURL())
	hold := func(key string) protocol.AcquireReply {
		var r protocol.AcquireReply
		if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":60000}`, key), &r); e != nil {
			t.Fatal(e)
		}
		return r
	}
	release := func(r protocol.AcquireReply) {
		if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, r.Key, r.Token), &protocol.ReleaseReply{}); e != nil {
			t.Fatal(e)
		}
	}
	waiters := func(n float64) func() bool {
		return func() bool { return gaugeValue(t, d, "ticketd_waiters") == n }
	}
	m, v := hold("m"), hold("v")
	subM := sendAcquire(t, attacker, "m", "wm")
	subV := sendAcquire(t, victim, "v", "wv")
	testkit.Eventually(t, 5*time.Second, "both queued", waiters(2))
	release(m)
	mm, err := subM.NextMsg(5 * time.Second)
	if err != nil || mm.Reply == "" {
		t.Fatalf("the attacker's grant: %v (reply subject %q)", err, mm.Reply)
	}
	release(v)
	gotV, e := acquireReply(t, subV, 5*time.Second)
	if e != nil {
		t.Fatal(e)
	}
	// Forge 503s next to the attacker's own delivery subject: the
	// sequence numbers after its own, and a few other guesses.
	prefix, last := mm.Reply[:strings.LastIndexByte(mm.Reply, '.')+1], mm.Reply[strings.LastIndexByte(mm.Reply, '.')+1:]
	guesses := []string{"0", "1", "2", "3", last + "0", last + "1"}
	if n, err := strconv.ParseUint(last, 10, 64); err == nil {
		for i := uint64(1); i <= 5; i++ {
			guesses = append(guesses, strconv.FormatUint(n+i, 10))
		}
	}
	for _, g := range guesses {
		forged := nats.NewMsg(prefix + g)
		forged.Header.Set("Status", "503")
		if err := attacker.PublishMsg(forged); err != nil {
			t.Fatal(err)
		}
	}
	if err := attacker.Flush(); err != nil {
		t.Fatal(err)
	}
	// The node handles its inbox in order: a get after the forgeries sees
	// whatever they caused.
	var h protocol.GetReply
	testkit.Eventually(t, 2*time.Second, "forgeries handled", func() bool {
		return rawRequest(t, nc, protocol.SubjectGet, `{"key":"v"}`, &h) == nil
	})
	if !h.Held || h.Token != gotV.Token || counterValue(t, d, "ticketd_grants_abandoned_total", "", "") != 0 {
		t.Fatalf("after forged 503s the victim's lock is %+v (its token %d), abandoned %v", h, gotV.Token,
			counterValue(t, d, "ticketd_grants_abandoned_total", "", ""))
	}
}
