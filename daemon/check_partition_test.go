package daemon_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
)

// TestDeposedLeaderNeverConfirmsSupersededToken: lock check on a leader cut
// off from its peers (raft traffic only; its NATS still answers) never says
// current=true for a token the majority superseded meanwhile, although
// that leader's own table still holds the token until it catches up: the
// check confirms leadership with a ReadIndex first. Node 1's election
// timeout is 10 times the others', so once it leads and is cut off, the
// others elect a new leader long before its CheckQuorum makes it step
// down: a window of two leaders that the check must not answer from.
func TestDeposedLeaderNeverConfirmsSupersededToken(t *testing.T) {
	const slow = 10
	c := testcluster.New(t, 3, testcluster.WithConfig(func(i int, cfg *daemon.Config) {
		if i == 0 {
			cfg.ElectionTicks *= slow
		}
	}))
	electionTimeout := c.ElectionTimeout()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const old = 0
	testkit.Eventually(t, 10*slow*electionTimeout, "node 1 leads", func() bool {
		lead := c.Leader(10 * time.Second)
		if lead == old {
			return true
		}
		tctx, tcancel := context.WithTimeout(ctx, electionTimeout)
		defer tcancel()
		_ = c.Node(lead).Node().TransferLeadership(tctx, old+1)
		return c.Node(old).Locks().IsLeader()
	})
	testkit.Eventually(t, 5*time.Second, "node 1 ready", c.Node(old).Locks().IsLeader)
	oldSrv := c.Node(old).Locks()
	g1, err := oldSrv.Acquire(ctx, acquireParams("k", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c.Converged(5 * time.Second)

	id := uint64(old + 1)
	for _, d := range c.Nodes() {
		d.Peers().SetFilter(func(from, to uint64) bool { return from != id && to != id })
	}
	// Ask the old leader again and again, before and after the new grant.
	var superseded atomic.Bool
	var wrong atomic.Int64
	var answered, answeredAfter atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; n < 1_000_000; n++ { // each call takes up to 100 ms
			select {
			case <-stop:
				return
			default:
			}
			after := superseded.Load()
			cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
			got, err := oldSrv.Check(cctx, "k", g1.Token)
			ccancel()
			if err != nil {
				continue
			}
			answered.Add(1)
			if after {
				answeredAfter.Add(1)
				if got.Current {
					wrong.Add(1)
				}
			}
		}
	}()
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()

	var lead int
	testkit.Eventually(t, 10*electionTimeout, "the majority elects a new leader", func() bool {
		for i, d := range c.Nodes() {
			if i != old && d.Locks().IsLeader() {
				lead = i
				return true
			}
		}
		return false
	})
	newSrv := c.Node(lead).Locks()
	if err := newSrv.Release(ctx, "k", g1.Token); err != nil {
		t.Fatal(err)
	}
	g2, err := newSrv.Acquire(ctx, acquireParams("k", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	superseded.Store(true)
	if got, err := newSrv.Check(ctx, "k", g1.Token); err != nil || got.Current || got.Token != g2.Token {
		t.Fatalf("new leader's check of the superseded token: %+v, %v", got, err)
	}
	// Keep asking until the old leader steps down (CheckQuorum): until
	// then it still believes it leads and its table still says token 1.
	if !oldSrv.IsLeader() {
		t.Fatal("node 1 stepped down before the new grant: the test saw no window of two leaders")
	}
	testkit.Eventually(t, 2*slow*electionTimeout, "the isolated leader steps down", func() bool { return !oldSrv.IsLeader() })
	halt()
	for _, d := range c.Nodes() {
		d.Peers().SetFilter(nil)
	}
	if n := wrong.Load(); n > 0 {
		t.Fatalf("the deposed leader said current=true %d times for token %d after token %d superseded it", n, g1.Token, g2.Token)
	}
	t.Logf("the old leader answered %d checks, %d after the new grant (all current=false)", answered.Load(), answeredAfter.Load())
}
