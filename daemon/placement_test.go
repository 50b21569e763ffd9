package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// plainLoad takes and releases locks through plain NATS requests (no SDK,
// so nothing retries) on one connection until stop, counting cycles and
// every failure: an error reply of any code, NATS "no responders", a
// timeout.
type plainLoad struct {
	cycles atomic.Int64
	mu     sync.Mutex
	fails  []string
}

func (l *plainLoad) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fails = append(l.fails, fmt.Sprintf(format, args...))
}

func (l *plainLoad) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.fails...)
}

func (l *plainLoad) run(nc *nats.Conn, workers int, stop <-chan struct{}) (wait func()) {
	request := func(subject string, body, reply any) bool {
		b, _ := json.Marshal(body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, err := nc.RequestWithContext(ctx, subject, b)
		if err != nil {
			l.fail("%s: %v", subject, err)
			return false
		}
		if err := protocol.ParseReply(m.Data, reply); err != nil {
			l.fail("%s: %v", subject, err)
			return false
		}
		return true
	}
	return testkit.Workers(workers, stop, func(w, i int) {
		key := fmt.Sprintf("placement/%d/%d", w, i) // a key a failed release left held blocks nobody
		var ar protocol.AcquireReply
		if !request(protocol.SubjectAcquire, protocol.AcquireRequest{Key: key, Owner: "load", LeaseMS: 10000}, &ar) {
			return
		}
		var rr protocol.ReleaseReply
		if request(protocol.SubjectRelease, protocol.ReleaseRequest{Key: key, Token: ar.Token}, &rr) {
			l.cycles.Add(1)
		}
	})
}

// clientOnFollower waits until c's leader has settled and connects a
// plain NATS client to a follower's server.
func clientOnFollower(t *testing.T, c *testcluster.Cluster) (lead, follower int, nc *nats.Conn) {
	t.Helper()
	lead = c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	follower = c.Follower(lead)
	nc, err := nats.Connect(c.ClientURL(follower))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return lead, follower, nc
}

// TestLeadershipFollowsClients: a client connected to a follower's NATS
// server makes every request cross a route to the leader and back; once
// it has done so for a few seconds, leadership moves to that follower.
// The move loses nothing: the client, which does not retry, sees no error
// reply, no "no responders" and no timeout. With leader-placement off,
// the same load leaves leadership where it is.
func TestLeadershipFollowsClients(t *testing.T) {
	for _, tc := range []struct {
		name      string
		placement string
	}{{"follow-clients", daemon.PlacementFollowClients}, {"off", daemon.PlacementOff}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testcluster.New(t, 3, testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.LeaderPlacement = tc.placement }))
			lead, follower, nc := clientOnFollower(t, c)

			var load plainLoad
			stop := make(chan struct{})
			wait := load.run(nc, 16, stop) // well above PlacementMinRequests a window on a loaded machine
			stopped := false
			stopLoad := func() {
				if !stopped {
					stopped = true
					close(stop)
					wait()
				}
			}
			t.Cleanup(stopLoad)

			// Settle, plus enough windows, plus slack for a loaded machine:
			// a window counts only with PlacementMinRequests requests in
			// it, which 16 clients through a route may miss for many
			// seconds while the whole suite shares the 2 cores.
			within := daemon.PlacementSettle + (daemon.PlacementWindows+1)*daemon.PlacementWindow + 40*time.Second
			if tc.placement == daemon.PlacementOff {
				time.Sleep(daemon.PlacementSettle + (daemon.PlacementWindows+2)*daemon.PlacementWindow) // a duration to observe, not a condition to wait for
				stopLoad()
				if now := c.Leader(time.Second); now != lead {
					t.Fatalf("leadership moved from node %d to %d with leader-placement off", lead+1, now+1)
				}
				if n := counterValue(t, c.Node(lead), "ticketd_leader_placement_transfers_total", "", ""); n != 0 {
					t.Fatalf("%v placement transfers with leader-placement off", n)
				}
				return
			}
			testkit.Eventually(t, within, "leadership on the client's node", func() bool {
				return c.Node(follower).Node().Status().Lead == c.Node(follower).Node().ID() && testcluster.Settled(c.Node(follower))
			})
			before := load.cycles.Load()
			testkit.Eventually(t, 10*time.Second, "cycles after the move", func() bool { return load.cycles.Load() >= before+100 })
			stopLoad()
			if n := counterValue(t, c.Node(lead), "ticketd_leader_placement_transfers_total", "", ""); n != 1 {
				t.Fatalf("old leader started %v placement transfers, want 1", n)
			}
			if f := load.failures(); len(f) != 0 {
				t.Fatalf("the client saw %d failures around the move, first %q", len(f), f[0])
			}
			t.Logf("leadership moved from node %d to node %d; client: %d cycles, no failure", lead+1, follower+1, load.cycles.Load())
		})
	}
}

// TestHandOversLoseNoRequest: leadership moves around the cluster again
// and again while a client that does not retry takes and releases locks
// through a third node's server; no request goes unanswered or fails.
// A request NATS hands to the old leader's server as the hand-over
// happens, or that meets raft dropping proposals during it, is forwarded
// to the new leader (the deposed leader stays in the queue group for
// natsapi.DeposedSubsGrace, until the new leader's subscription is known
// everywhere).
func TestHandOversLoseNoRequest(t *testing.T) {
	// An election timeout of 1 s: the moves, not a loaded machine's
	// elections, are what this test looks at.
	c := testcluster.New(t, 3, testcluster.WithTicks(20, 50),
		testcluster.WithConfig(func(_ int, cfg *daemon.Config) { cfg.LeaderPlacement = daemon.PlacementOff }))
	lead, _, nc := clientOnFollower(t, c)
	var load plainLoad
	stop := make(chan struct{})
	wait := load.run(nc, 8, stop)
	defer func() {
		close(stop)
		wait()
	}()

	const moves = 12
	for i := range moves {
		before := load.cycles.Load()
		testkit.Eventually(t, 10*time.Second, "cycles before the move", func() bool { return load.cycles.Load() >= before+50 })
		target := (lead + 1 + i%2) % 3
		// Just after a move the new leader may not count the old one
		// as replicating yet: ErrNoTransfer, try again.
		var err error
		testkit.Eventually(t, 10*time.Second, "a move started", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = c.Node(lead).Node().TransferLeadership(ctx, c.Node(target).Node().ID())
			return !errors.Is(err, raftstore.ErrNoTransfer)
		})
		if err != nil {
			t.Fatalf("move %d, node %d to node %d: %v", i, lead+1, target+1, err)
		}
		lead = target
		testkit.Eventually(t, 10*time.Second, "new leader settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	}
	if f := load.failures(); len(f) != 0 {
		for _, x := range f[:min(len(f), 3)] {
			t.Log(x)
		}
		t.Fatalf("%d moves: the client saw %d failures, first %q", moves, len(f), f[0])
	}
	t.Logf("%d moves; client: %d cycles, no failure", moves, load.cycles.Load())
}
