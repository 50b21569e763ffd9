package faults

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/transports/protocol"
)

// TestPausedLeaderLeavesTheQueueGroup: a leader that is paused (SIGSTOP)
// cannot unsubscribe from the leader-only lock subjects, and the other
// nodes' NATS servers keep its queue subscription until they find the
// route to it stale. Until then a request published on a node that is
// not the new leader goes to the new leader or to the paused one at
// random, and half of them are lost. With nats-server's route ping
// defaults (30 s, 2 outstanding) that lasted 60–90 s after every leader
// pause; the daemon's route pings (daemon.RoutePingInterval) cut it to a
// few seconds. The test asks a node that is neither the paused leader nor
// the new one, with raw NATS requests, until 20 in a row are answered.
func TestPausedLeaderLeavesTheQueueGroup(t *testing.T) {
	c := mustStartProcesses(t, t.TempDir(), 3)
	t.Cleanup(c.close)
	if !waitLeader(c, 30*time.Second) {
		t.Fatal("no leader")
	}
	old := c.leader()
	if err := c.pause(old); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.resume(old) })
	paused := time.Now()
	if !waitLeader(c, 10*time.Second) {
		t.Fatal("no leader while the old one is paused")
	}
	third := 3 - old - c.leader()
	nc, err := nats.Connect(c.clientURLs()[third], nats.NoReconnect(), quietNATS())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body, err := json.Marshal(protocol.GetRequest{Key: "route/probe"})
	if err != nil {
		t.Fatal(err)
	}
	const want, within = 20, 20 * time.Second
	answered, lost := 0, 0
	for deadline := paused.Add(within); answered < want; {
		if time.Now().After(deadline) {
			t.Fatalf("%v after pausing leader %d, requests published on node %d still vanish: %d lost, only %d in a row answered (want %d): the paused leader's queue subscription is still routed to",
				within, old+1, third+1, lost, answered, want)
		}
		_, err := nc.Request(protocol.SubjectPrefix+".lock.get", body, 250*time.Millisecond)
		switch {
		case err == nil:
			answered++
		case errors.Is(err, nats.ErrTimeout):
			answered, lost = 0, lost+1
		default: // no responders while the new leader subscribes, say
			answered = 0
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("answered %d in a row %v after the pause (%d lost before)", want, time.Since(paused).Round(time.Millisecond), lost)
}
