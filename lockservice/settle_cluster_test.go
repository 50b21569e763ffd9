package lockservice_test

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/lockservice"
)

// expiries is node d's ticketd_expiries_total{existed}: the Expires it
// applied that removed a lock (true) or found none (false).
func expiries(t *testing.T, d *daemon.Daemon, existed string) float64 {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "ticketd_expiries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "existed" && l.GetValue() == existed {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// indexesAgree waits until s's indexes agree with its table (a command
// may apply between the two reads) and fails with the last difference.
func indexesAgree(t *testing.T, s *lockservice.Service, who string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	d := s.IndexesDiff()
	for d != "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // a pause between polls
		d = s.IndexesDiff()
	}
	if d != "" {
		t.Fatalf("%s: %s", who, d)
	}
}

// TestSettleAcrossLeaderChange: on a real 3-node cluster, Settles (withdraws
// by request id) release a session's mutex and semaphore slot and a lease's
// shared hold and semaphore slot beside holders that stay. The leader's
// indexes agree with its table at once; once the settled leases would have
// run out (a sentinel lease of the same length has expired), no Expire of
// them was applied (no Expire that found nothing); after the leader is
// stopped, the new leader's rebuilt indexes agree with its table, the
// session counts no lock, takes locks again and its close ends only them.
func TestSettleAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("three-node cluster skipped in -short mode")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster version raised", func() bool { return testcluster.Settled(c.Node(lead)) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctxA, ctxB := lockservice.WithIdentity(ctx, "A"), lockservice.WithIdentity(ctx, "B")
	s := c.Node(lead).Locks()
	si, err := s.OpenSession(ctxA, 30*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const lease = time.Second
	holders := []struct {
		key   string
		p     lockservice.AcquireParams
		other bool // B holds the key too, and keeps it
	}{
		{"s/mutex", lockservice.AcquireParams{Session: si.ID}, false},
		{"s/sem", lockservice.AcquireParams{Session: si.ID, Limit: 3}, true},
		{"l/shared", lockservice.AcquireParams{Lease: lease, Mode: core.ModeShared}, true},
		{"l/sem", lockservice.AcquireParams{Lease: lease, Limit: 3}, true},
	}
	for _, h := range holders {
		p := h.p
		p.Key, p.Timeout = h.key, 5*time.Second
		if h.other {
			o := p
			o.Session, o.Lease = 0, time.Hour
			if _, err := s.Acquire(ctxB, o); err != nil {
				t.Fatalf("B on %s: %v", h.key, err)
			}
		}
		p.RequestID = "r-" + h.key
		g, err := s.Acquire(ctxA, p)
		if err != nil {
			t.Fatalf("A on %s: %v", h.key, err)
		}
		if w, err := s.Withdraw(ctxA, h.key, "", p.RequestID); err != nil || w.ReleasedToken != g.Token {
			t.Fatalf("withdraw on %s: %+v %v, want token %d released", h.key, w, err, g.Token)
		}
	}
	// The settled mutex's key is free: B takes it, a holder a stale
	// session entry would end.
	if _, err := s.Acquire(ctxB, lockservice.AcquireParams{Key: "s/mutex", Lease: time.Hour, Timeout: 5 * time.Second}); err != nil {
		t.Fatalf("the settled mutex is not free: %v", err)
	}
	sentinel, err := s.Acquire(ctxB, lockservice.AcquireParams{Key: "sentinel", Lease: lease, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	indexesAgree(t, s, "the leader")
	testkit.Eventually(t, 10*time.Second, "the sentinel's expiry", func() bool {
		h, err := s.Get(ctx, "sentinel")
		return err == nil && (!h.Held || h.Lock.Token != sentinel.Token)
	})
	for i, d := range c.Nodes() {
		if n := expiries(t, d, "false"); n != 0 {
			t.Fatalf("node %d applied %v Expires that found no lock (a settled holder's timer fired)", i+1, n)
		}
	}

	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	next := c.Leader(10 * time.Second)
	s = c.Node(next).Locks()
	indexesAgree(t, s, "the new leader")
	var n int
	c.Node(next).Node().View(func(m *core.Machine) { n = m.SessionLockCount(si.ID) })
	if n != 0 {
		t.Fatalf("the session counts %d locks after its holds were settled", n)
	}
	x, err := s.Acquire(ctxA, lockservice.AcquireParams{Key: "s/again", Session: si.ID, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("the session takes no lock on the new leader: %v", err)
	}
	if ended, err := s.CloseSession(ctxA, si.ID); err != nil || ended != 1 {
		t.Fatalf("close: %d locks ended, %v; want only %s's", ended, err, x.Key)
	}
	for _, key := range []string{"s/mutex", "s/sem", "l/shared", "l/sem"} {
		if h, err := s.Get(ctx, key); err != nil || !h.Held || h.Lock.Identity != "B" {
			t.Fatalf("B's hold of %s: %+v %v", key, h, err)
		}
	}
	indexesAgree(t, s, "the new leader after the close")
}
