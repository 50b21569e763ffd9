package natsapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/natsapi"
	"github.com/ticketd/ticketd/transports/protocol"
)

// untilServed waits until a lock request sent through nc reaches a node:
// the leader subscribes once ready, and its interest takes a moment to
// reach the other NATS servers of the cluster.
func untilServed(t *testing.T, nc *nats.Conn) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "a node serving the lock subjects", func() bool {
		_, err := nc.Request(protocol.SubjectPrefix+".lock.get", []byte(`{"key":"probe"}`), 5*time.Second)
		return !errors.Is(err, nats.ErrNoResponders)
	})
}

// TestLockSubjectsServedOnlyByLeader: in steady state only the leader is
// subscribed to the lock subjects, so a request sent through any node's
// NATS server is answered by the leader itself: no follower forwards
// anything, and the micro figures count every lock request on the leader.
// Status stays on every node.
func TestLockSubjectsServedOnlyByLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	for i, d := range c.Nodes() {
		if got := d.API().Serving(); got != (i == lead) {
			t.Fatalf("node %d serving=%v, leader is node %d", i+1, got, lead+1)
		}
	}
	const perNode = 20
	for i := range c.Nodes() {
		nc := testkit.Connect(t, c.ClientURL(i))
		untilServed(t, nc)
		for k := 0; k < perNode; k++ {
			key := fmt.Sprintf("n%d-%d", i, k)
			m, err := nc.Request(protocol.SubjectPrefix+".lock.acquire", []byte(`{"key":"`+key+`","lease_ms":60000}`), 5*time.Second)
			if err != nil {
				t.Fatalf("acquire %s via node %d: %v", key, i+1, err)
			}
			if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
				t.Fatalf("acquire %s via node %d: %s %s", key, i+1, code, m.Data)
			}
			var ar protocol.AcquireReply
			if err := json.Unmarshal(m.Data, &ar); err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"key":%q,"token":%d}`, key, ar.Token)
			if m, err := nc.Request(protocol.SubjectPrefix+".lock.release", []byte(body), 5*time.Second); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
				t.Fatalf("release %s via node %d: %v", key, i+1, err)
			}
		}
		if m, err := nc.Request(protocol.SubjectStatus, []byte(`{}`), 5*time.Second); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
			t.Fatalf("status via node %d: %v", i+1, err)
		}
	}
	for i, d := range c.Nodes() {
		if n := d.API().Forwarded(); n != 0 {
			t.Errorf("node %d (leader %d) forwarded %d requests, want 0", i+1, lead+1, n)
		}
	}
	// Every acquire (and the probes' gets) was counted where it was served.
	nc := testkit.Connect(t, c.ClientURL(lead))
	for _, raw := range microAll(t, nc, micro.StatsVerb, 3) {
		var st micro.Stats
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatal(err)
		}
		isLeader := st.Metadata["node_id"] == fmt.Sprint(lead+1)
		for _, e := range st.Endpoints {
			if e.Name == "acquire" && (e.NumRequests == 3*perNode) != isLeader {
				t.Errorf("node %s (leader %d) served %d acquires", st.Metadata["node_id"], lead+1, e.NumRequests)
			}
		}
	}
}

// TestLockRequestsSurviveFailover: requests keep being served when the
// leader dies (the new leader subscribes once ready; meanwhile the SDK
// retries "no responders"), and a leader cut off from its peers stops
// serving the lock subjects once it steps down.
func TestLockRequestsSurviveFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	fol := c.Follower(lead)
	nc := testkit.Connect(t, c.ClientURL(fol))
	cl, err := sdk.New(nc, sdk.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cycle := func(key string) {
		t.Helper()
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %s: %v", key, err)
		}
	}
	cycle("before")
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	// A request already on its way to the stopped leader's server when its
	// subscription went is lost with it (a route carries no "no responders"
	// back): the SDK says indeterminate, which is the right answer, and the
	// lock, if any, expires. Only the first may; every other cycle succeeds.
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("after-%d", i)
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if i == 0 && sdk.IsIndeterminate(err) {
			t.Logf("acquire %s right after the leader stopped: %v", key, err)
			continue
		}
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %s: %v", key, err)
		}
	}
	next := c.Leader(10 * c.ElectionTimeout())
	for i, d := range c.Nodes() {
		if d != nil && d.API().Serving() != (i == next) {
			t.Fatalf("node %d serving=%v, leader is node %d", i+1, d.API().Serving(), next+1)
		}
	}

	// Cut the new leader off: it steps down (CheckQuorum) and unsubscribes.
	id := uint64(next + 1)
	for _, d := range c.Nodes() {
		if d != nil {
			d.Peers().SetFilter(func(from, to uint64) bool { return from != id && to != id })
		}
	}
	testkit.Eventually(t, 20*c.ElectionTimeout(), "the isolated leader stops serving", func() bool {
		return !c.Node(next).API().Serving()
	})
	for _, d := range c.Nodes() {
		if d != nil {
			d.Peers().SetFilter(nil)
		}
	}
	// Two of three nodes run: a leader again once they agree.
	c.Leader(20 * c.ElectionTimeout())
	cycle("healed")
}

// TestHandOverWindowForwards: a node still subscribed to the lock
// subjects while not the leader (a deposed leader before its next check)
// forwards what it receives to the leader and relays the answer: the
// request is served once, by the leader, and the client cannot tell.
func TestHandOverWindowForwards(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	fol := c.Follower(lead)
	api := c.Node(fol).API()
	// Through the follower's own NATS server, whose local queue
	// subscriber NATS prefers.
	nc := testkit.Connect(t, c.ClientURL(fol))
	untilServed(t, nc)
	var tokens []uint64
	testkit.Eventually(t, 20*time.Second, "a request forwarded by the stale subscriber", func() bool {
		if err := natsapi.SubscribeLockSubjects(api); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("handover-%d", len(tokens))
		m, err := nc.Request(protocol.SubjectPrefix+".lock.acquire", []byte(`{"key":"`+key+`","lease_ms":60000}`), 5*time.Second)
		if err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
			t.Fatalf("acquire %s: %v", key, err)
		}
		var ar protocol.AcquireReply
		if err := json.Unmarshal(m.Data, &ar); err != nil || ar.Token == 0 {
			t.Fatalf("acquire %s: %s %v", key, m.Data, err)
		}
		tokens = append(tokens, ar.Token)
		return api.Forwarded() > 0
	})
	// Every grant, forwarded or not, is the leader's: distinct, increasing
	// tokens, and the leader's table holds each key.
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v not increasing", tokens)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, tok := range tokens {
		h, err := c.Node(lead).Locks().Get(ctx, fmt.Sprintf("handover-%d", i))
		if err != nil || !h.Held || h.Lock.Token != tok {
			t.Fatalf("handover-%d on the leader: %+v %v, want token %d", i, h, err, tok)
		}
	}
	// The follower's next check unsubscribes it again.
	testkit.Eventually(t, 5*time.Second, "the follower to stop serving", func() bool { return !api.Serving() })
}
