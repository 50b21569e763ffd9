package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// cluster starts n in-process nodes and waits for a settled leader (one
// that raised the cluster version, which renew needs).
func cluster(t *testing.T, n int) (*testcluster.Cluster, int) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process cluster skipped in -short mode")
	}
	c := testcluster.New(t, n)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	return c, lead
}

// client connects to every node's NATS, first to the ones in order.
func client(t *testing.T, c *testcluster.Cluster, order ...int) *sdk.Client {
	t.Helper()
	var urls []string
	for _, i := range order {
		urls = append(urls, c.ClientURL(i))
	}
	for i := 0; i < c.Size(); i++ {
		if !slices.Contains(order, i) {
			urls = append(urls, c.ClientURL(i))
		}
	}
	cl, err := sdk.Connect(strings.Join(urls, ","), sdk.WithRequestTimeout(2*time.Second),
		sdk.WithRetryBackoff(5*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// TestKeepAliveAcrossLeaderKill is a job holding a lock with a keepalive
// while the raft leader is killed: the keepalive either keeps the lock
// (same token on the new leader, deadline moved past the kill) or ends it
// before its local deadline, never after. Each step of the job checks the
// lock's context before writing with its token.
func TestKeepAliveAcrossLeaderKill(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	const lease = 2 * time.Second
	l, err := cl.Acquire(ctx, "job", sdk.WithLease(lease), sdk.WithOwner("worker"), sdk.WithAutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	var steps, late atomic.Int64
	jobDone := make(chan struct{})
	go func() { // the job: a step every 20 ms while the lock is ours
		defer close(jobDone)
		for l.Context().Err() == nil && steps.Load() < 200 {
			if !l.Valid() {
				late.Add(1) // a step after the deadline: what Lost exists to prevent
			}
			steps.Add(1)
			_ = sleep(l.Context(), 20*time.Millisecond)
		}
	}()
	testkit.Eventually(t, 10*time.Second, "a first renewal", func() bool { return l.Deadline().Sub(time.Now()) > lease-lease/3 })
	killed := time.Now()
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	newLead := c.Leader(10 * time.Second)
	t.Logf("node %d killed; node %d leads after %v", lead+1, newLead+1, time.Since(killed))
	<-jobDone
	if n := late.Load(); n > 0 {
		t.Fatalf("%d job steps ran after the local deadline", n)
	}
	select {
	case <-l.Lost():
		lostAt := time.Now()
		if !lostAt.Before(l.Deadline()) {
			t.Fatalf("Lost fired %v after the local deadline", lostAt.Sub(l.Deadline()))
		}
		t.Logf("lock lost %v before its deadline: %v", l.Deadline().Sub(lostAt), l.Err())
	default:
		if !l.Deadline().After(killed.Add(lease)) {
			t.Fatalf("not renewed since the kill: deadline %v, kill %v", l.Deadline(), killed)
		}
		h, err := cl.Get(ctx, "job")
		if err != nil || !h.Held || h.Token != l.Token {
			t.Fatalf("after the leader change: %+v %v, want held with token %d", h, err, l.Token)
		}
		t.Logf("lock kept across the leader change: %d steps, deadline in %v", steps.Load(), time.Until(l.Deadline()))
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, sdk.ErrNotFound) {
		t.Fatal(err)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// TestRenewLatency renews one lock 200 times through a follower of a
// three-node cluster and logs the p50 and p99 the SDK sees.
func TestRenewLatency(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	l, err := cl.Acquire(ctx, "renew/latency", sdk.WithLease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	prev := l.Deadline()
	for i := 0; i < 200; i++ {
		start := time.Now()
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		took = append(took, time.Since(start))
		if !l.Deadline().After(prev) || l.Deadline().After(time.Now().Add(10*time.Second)) {
			t.Fatalf("deadline %v after renewal %d (previous %v)", l.Deadline(), i, prev)
		}
		prev = l.Deadline()
	}
	slices.Sort(took)
	t.Logf("renew latency through a follower, 3 nodes, 200 renewals: p50 %v p99 %v max %v", took[len(took)/2], took[len(took)*99/100], took[len(took)-1])
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKeepAliveClusterGone: every node dies under a kept-alive lock; Lost
// fires before the local deadline, and the context's cause says why.
func TestKeepAliveClusterGone(t *testing.T) {
	c, _ := cluster(t, 3)
	cl := client(t, c)
	const lease = time.Second
	l, err := cl.Acquire(t.Context(), "gone", sdk.WithLease(lease), sdk.WithAutoRenew(sdk.WithSafetyMargin(200*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost never fired")
	}
	lostAt := time.Now()
	if !lostAt.Before(l.Deadline()) {
		t.Fatalf("Lost fired %v after the deadline", lostAt.Sub(l.Deadline()))
	}
	if !errors.Is(context.Cause(l.Context()), sdk.ErrLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	t.Logf("cluster gone: Lost %v before the local deadline: %v", l.Deadline().Sub(lostAt), l.Err())
}

// TestListAllPages: ListAll yields exactly the held keys under a prefix,
// in byte order, across pages of every size.
func TestListAllPages(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	var want []string
	for _, k := range []string{"p/x/1", "p/x/10", "p/x/2", "p/x/a", "p/x/\u00e9", "p/y/1", "p/x", "q/x/1"} {
		if _, err := cl.Acquire(ctx, k, sdk.WithLease(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(k, "p/x/") {
			want = append(want, k)
		}
	}
	slices.Sort(want)
	for _, size := range []int{0, 1, 2, 3, 5, 1000} {
		var got []string
		for h, err := range cl.ListAll(ctx, "p/x/", size) {
			if err != nil {
				t.Fatalf("page size %d: %v", size, err)
			}
			if !h.Held || h.Token == 0 || h.Lease != time.Minute {
				t.Fatalf("page size %d: %+v", size, h)
			}
			got = append(got, h.Key)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d: %q, want %q", size, got, want)
		}
	}
	p, err := cl.List(ctx, "p/x/", "p/x/2", 2)
	if err != nil || len(p.Locks) != 2 || p.Locks[0].Key != "p/x/a" || p.More || p.Index == 0 {
		t.Fatalf("page after p/x/2: %+v %v", p, err)
	}
	if _, err := cl.List(ctx, "", "", 1001); !errors.Is(err, sdk.ErrInvalidArgument) {
		t.Fatalf("limit 1001: %v", err)
	}
}

// TestCancelledWaitTakesNothing: B waits behind A and gives up (its
// context is cancelled); the SDK withdraws B's wait, so the error is
// definite (not indeterminate), and when A releases, C, waiting behind B,
// is granted at once rather than after B's lease.
func TestCancelledWaitTakesNothing(t *testing.T) {
	c, lead := cluster(t, 3)
	clA := client(t, c, lead)
	clB := client(t, c, c.Follower(lead))
	clC := client(t, c, c.Follower(lead))
	ctx := t.Context()
	a, err := clA.Acquire(ctx, "queue", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancelB := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() {
		_, err := clB.Acquire(bctx, "queue", sdk.WithLease(time.Minute), sdk.WithWait(time.Minute))
		bDone <- err
	}()
	type result struct {
		l   *sdk.Lock
		err error
		at  time.Time
	}
	cDone := make(chan result, 1)
	// C queues behind B: wait until B's request is surely in the queue.
	testkit.Eventually(t, 5*time.Second, "B queued", func() bool {
		return waiters(t, c, lead) >= 1
	})
	go func() {
		l, err := clC.Acquire(ctx, "queue", sdk.WithLease(time.Minute), sdk.WithWait(time.Minute))
		cDone <- result{l, err, time.Now()}
	}()
	testkit.Eventually(t, 5*time.Second, "C queued", func() bool {
		return waiters(t, c, lead) >= 2
	})
	cancelB()
	err = <-bDone
	if !errors.Is(err, context.Canceled) || sdk.IsIndeterminate(err) {
		t.Fatalf("B: %v, want a definite context.Canceled", err)
	}
	released := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-cDone
	if r.err != nil {
		t.Fatalf("C: %v", r.err)
	}
	took := r.at.Sub(released)
	t.Logf("B withdrawn (%v); C granted token %d %v after A released", err, r.l.Token, took)
	if took > time.Second {
		t.Fatalf("C waited %v after A released, want under a second", took)
	}
}

// waiters reads the ticketd_waiters gauge of node i (the leader's queues).
func waiters(t *testing.T, c *testcluster.Cluster, i int) float64 {
	t.Helper()
	mfs, err := c.Node(i).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ticketd_waiters" && len(mf.Metric) > 0 {
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	return 0
}

// TestWatchAndObserve: Watch delivers a key's grant, renew and release
// once each (three nodes publish every event), in index order, and none
// of another key; an Election's Observe follows the leader through a
// resignation.
func TestWatchAndObserve(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, key := range []string{"watch/plain", "watch/with space"} { // a plain and a hashed subject
		events, err := cl.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Acquire(ctx, key+"/other"); err != nil {
			t.Fatal(err)
		}
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var got []string
		var last uint64
		for len(got) < 3 {
			select {
			case ev := <-events:
				if ev.Key != key || ev.Token != l.Token || ev.Index <= last {
					t.Fatalf("%q: event %+v after index %d", key, ev, last)
				}
				last = ev.Index
				got = append(got, ev.Type)
			case <-time.After(10 * time.Second):
				t.Fatalf("%q: events so far %v", key, got)
			}
		}
		if fmt.Sprint(got) != "[grant renew release]" {
			t.Fatalf("%q: events %v", key, got)
		}
	}

	a, err := sdk.NewElection(cl, "elect", "a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sdk.NewElection(client(t, c, lead), "elect", "b", time.Second)
	leaders, err := b.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func() sdk.Holder {
		select {
		case h := <-leaders:
			return h
		case <-time.After(10 * time.Second):
			t.Fatal("no leader change observed")
		}
		return sdk.Holder{}
	}
	if h := next(); h.Held {
		t.Fatalf("first observation %+v, want no leader", h)
	}
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if h := next(); !h.Held || h.Owner != "a" || h.Token != a.Token() {
		t.Fatalf("observed %+v, want a with token %d", h, a.Token())
	}
	bDone := make(chan error, 1)
	go func() { bDone <- b.Campaign(ctx) }()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("b's term %d not above a's %d", b.Token(), a.Token())
	}
	for h := next(); !h.Held || h.Owner != "b"; h = next() {
		if h.Held && h.Owner != "a" {
			t.Fatalf("observed %+v", h)
		}
	}
	if l, err := a.Leader(ctx); err != nil || l.Owner != "b" || l.Token != b.Token() {
		t.Fatalf("Leader %+v %v", l, err)
	}
	select {
	case <-a.Lost():
	default:
		t.Fatal("a's Lost open after Resign")
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNoLeaderAfterQuorumLoss: with two of three nodes gone, the last one
// knows no leader and nobody serves the lock subjects; an acquire then
// fails as unavailable saying "no leader", not "no ticketd node answered".
func TestNoLeaderAfterQuorumLoss(t *testing.T) {
	c, lead := cluster(t, 3)
	left := c.Follower(lead)
	for i := 0; i < c.Size(); i++ {
		if i != left {
			if err := c.Stop(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.Eventually(t, 20*c.ElectionTimeout(), "the last node knows no leader", func() bool {
		return c.Node(left).Node().Status().Lead == 0
	})
	cl := client(t, c, left)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := cl.Acquire(ctx, "orders/42")
	var e *sdk.Error
	if !errors.As(err, &e) || e.Code != "unavailable" || !strings.HasPrefix(e.Message, "no leader: ") {
		t.Fatalf("got %v, want unavailable: no leader", err)
	}
}
