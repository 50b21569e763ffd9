package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/sdk"
)

// TestClusterFailover: locks taken through a follower survive the
// leader's death with their tokens; a new leader serves within two
// election timeouts; leases still expire by committed Expire; tokens keep
// increasing; the dead node catches up by snapshot with an identical table.
func TestClusterFailover(t *testing.T) {
	c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) {
		cfg.SnapshotEntries = 40
		cfg.CompactKeep = 10
	}))
	electionTimeout := c.ElectionTimeout()
	lead := c.Leader(10 * time.Second)
	fol := c.Follower(lead)
	_, cl := connect(t, c.Node(fol))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	held := map[string]uint64{}
	var maxToken uint64
	for i := 0; i < 5; i++ {
		key := fmt.Sprintf("keep/%d", i)
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("acquire through follower: %v", err)
		}
		if l.Token <= maxToken {
			t.Fatalf("token %d not above %d", l.Token, maxToken)
		}
		maxToken = l.Token
		held[key] = l.Token
	}
	short, err := cl.Acquire(ctx, "short", sdk.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	maxToken = short.Token
	c.Converged(10 * time.Second)

	// Kill the leader (its data stays for the restart).
	killed := lead
	if err := c.Stop(killed); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	// The client keeps going: the SDK retries while there is no leader.
	l, err := cl.Acquire(ctx, "after-failover", sdk.WithLease(time.Minute))
	if err != nil {
		t.Fatalf("acquire after failover: %v", err)
	}
	if took := time.Since(killedAt); took > 2*(2*electionTimeout)+time.Second {
		// Randomised election timeouts reach 2× the base; allow two of
		// those plus scheduling slack on a 2-core machine.
		t.Fatalf("clients resumed after %v", took)
	}
	t.Logf("clients resumed %v after the leader died", time.Since(killedAt))
	if l.Token <= maxToken {
		t.Fatalf("token %d after failover not above %d", l.Token, maxToken)
	}
	maxToken = l.Token
	for key, tok := range held {
		h, err := cl.Get(ctx, key)
		if err != nil || !h.Held || h.Token != tok {
			t.Fatalf("%s after failover: %+v %v, want token %d", key, h, err, tok)
		}
	}
	// The short lease still ends by a committed Expire on the new leader.
	newLead := c.Leader(5 * time.Second)
	testkit.Eventually(t, 10*time.Second, "short lease expired", func() bool {
		return counterValue(t, c.Node(newLead), "ticketd_expiries_total", "existed", "true") >= 1
	})
	if h, err := cl.Get(ctx, "short"); err != nil || h.Held {
		t.Fatalf("short after expiry: %+v %v", h, err)
	}

	// Push the log well past the snapshot interval while the node is down,
	// so it can only catch up from a snapshot.
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("churn/%d", i%7)
		l, err := cl.Acquire(ctx, key, sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= maxToken {
			t.Fatalf("token %d not above %d", l.Token, maxToken)
		}
		maxToken = l.Token
		if err := cl.Release(ctx, key, l.Token); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(killed); err != nil {
		t.Fatal(err)
	}
	c.Converged(20 * time.Second)
	if sent := c.Node(newLead).Peers().Stats().Peers[uint64(killed+1)].SnapshotsSent; sent == 0 {
		t.Fatalf("restarted node caught up without a snapshot; the test did not exercise snapshot catch-up")
	}
}

// TestIsolatedFollowerNeverAnswers: a follower cut off from its peers
// refuses lock requests (it never serves from its own state), and a
// leader that loses its quorum steps down.
func TestIsolatedFollowerNeverAnswers(t *testing.T) {
	c := testcluster.New(t, 3)
	electionTimeout := c.ElectionTimeout()
	lead := c.Leader(10 * time.Second)
	fol := c.Follower(lead)
	_, cl := connect(t, c.Node(lead))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Minute)); err != nil {
		t.Fatal(err)
	}
	c.Converged(5 * time.Second)

	isolate := func(i int) {
		id := uint64(i + 1)
		for _, d := range c.Nodes() {
			d.Peers().SetFilter(func(from, to uint64) bool { return from != id && to != id })
		}
	}
	heal := func() {
		for _, d := range c.Nodes() {
			d.Peers().SetFilter(nil)
		}
	}
	isolate(fol)
	srv := c.Node(fol).Locks()
	for i := 0; i < 20; i++ {
		_, err := srv.Acquire(ctx, acquireParams("iso", time.Second))
		var nl *lockservice.NotLeaderError
		if !errors.As(err, &nl) {
			t.Fatalf("isolated follower answered acquire: %v", err)
		}
		if _, err := srv.Get(ctx, "k"); !errors.As(err, &nl) {
			t.Fatalf("isolated follower answered get: %v", err)
		}
	}
	// The rest of the cluster keeps serving.
	if _, err := cl.Acquire(ctx, "k2", sdk.WithLease(time.Minute)); err != nil {
		t.Fatalf("majority stopped serving: %v", err)
	}
	heal()
	c.Converged(10 * time.Second)

	// Now cut off the leader: CheckQuorum makes it step down, and a waiter
	// queued on it gets a retryable error at once, not a silent hang.
	lead = c.Leader(5 * time.Second)
	waiterErr := make(chan error, 1)
	leaderSrv := c.Node(lead).Locks()
	go func() {
		p := acquireParams("k", time.Second)
		p.Wait, p.Timeout = 20*time.Second, 25*time.Second
		_, err := leaderSrv.Acquire(ctx, p)
		waiterErr <- err
	}()
	testkit.Eventually(t, 5*time.Second, "waiter queued on the leader", func() bool {
		return gaugeValue(t, c.Node(lead), "ticketd_waiters") == 1
	})
	isolate(lead)
	cutAt := time.Now()
	testkit.Eventually(t, 10*electionTimeout, "isolated leader steps down", func() bool {
		return !c.Node(lead).Locks().IsLeader()
	})
	t.Logf("isolated leader stepped down after %v", time.Since(cutAt))
	select {
	case err := <-waiterErr:
		// Retryable: this node certainly proposed nothing for it.
		var nl *lockservice.NotLeaderError
		if !errors.As(err, &nl) && !errors.Is(err, lockservice.ErrShuttingDown) {
			t.Fatalf("queued waiter got %v, want a retryable error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("queued waiter still hanging after its leader stepped down")
	}
	if _, err := c.Node(lead).Locks().Acquire(ctx, acquireParams("x", time.Second)); err == nil {
		t.Fatal("deposed leader granted a lock")
	}
	testkit.Eventually(t, 10*electionTimeout, "majority elects a new leader", func() bool {
		for i, d := range c.Nodes() {
			if i != lead && d.Locks().IsLeader() {
				return true
			}
		}
		return false
	})
	heal()
	c.Converged(10 * time.Second)
}
