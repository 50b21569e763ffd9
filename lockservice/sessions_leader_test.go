package lockservice

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// This file checks keepalive rules 1 and 2 (KeepAlive's comment) across a
// leader change on real raft nodes, with the keepalive's ReadIndex held:
// three raftstore nodes joined by an in-memory network that can isolate
// one of them, each with its Service. Two tools make the interleavings
// certain instead of lucky:
//
//   - freezing a node's raft loop (an observer that blocks on a marker
//     command, so the loop neither ticks nor steps down): a frozen leader
//     still believes it leads while the others elect a new one, as a
//     paused or partitioned leader does until CheckQuorum steps it down;
//   - holdingNode, the Service's view of its node, which stretches the
//     keepalive's hold (so that the test acts inside it) and can run a
//     step between the round's answer and the acknowledgement.

// holdNet carries raft messages between in-process nodes and drops every
// message from or to the isolated node (raft id; 0 for none).
type holdNet struct {
	nodes    []*raftstore.Node
	queue    []chan raftpb.Message
	isolated atomic.Uint64
	wg       sync.WaitGroup
	stop     chan struct{}
}

type holdNetSender struct{ net *holdNet }

func (s holdNetSender) Send(msgs []raftpb.Message) {
	iso := s.net.isolated.Load()
	for _, m := range msgs {
		if iso != 0 && (m.From == iso || m.To == iso) {
			continue
		}
		select {
		case s.net.queue[m.To-1] <- m:
		default: // a full link loses the message, as a network may
		}
	}
}

// holdingNode is a Service's node: the real one, whose ReadIndexWithin
// records the hold asked for, holds for hold instead when it is set, and
// runs afterRound (if set) once a round answered without error.
type holdingNode struct {
	*raftstore.Node
	mu         sync.Mutex
	hold       time.Duration // 0: the hold asked for
	asked      []time.Duration
	afterRound func()
}

func (h *holdingNode) ReadIndexWithin(ctx context.Context, hold time.Duration) error {
	h.mu.Lock()
	h.asked = append(h.asked, hold)
	if h.hold > 0 {
		hold = h.hold
	}
	after := h.afterRound
	h.mu.Unlock()
	err := h.Node.ReadIndexWithin(ctx, hold)
	if err == nil && after != nil {
		after()
	}
	return err
}

// freezer blocks its node's raft loop in OnApplied when the marker key's
// Grant applies while armed, until released.
type freezer struct {
	armed   atomic.Bool
	frozen  chan struct{} // closed once the loop is blocked
	release chan struct{}
}

const freezeKey = "test/freeze"

func newFreezer() *freezer {
	return &freezer{frozen: make(chan struct{}), release: make(chan struct{})}
}

func (f *freezer) applied(a raftstore.Applied) {
	if a.Command.Key == freezeKey && f.armed.CompareAndSwap(true, false) {
		close(f.frozen)
		<-f.release
	}
}

// holdCluster is the three nodes, their services and their views.
type holdCluster struct {
	net      *holdNet
	services []*Service
	views    []*holdingNode
	freezers []*freezer
}

func startHoldCluster(t *testing.T) *holdCluster {
	t.Helper()
	const size = 3
	c := &holdCluster{net: &holdNet{stop: make(chan struct{})}}
	peers := []uint64{1, 2, 3}
	for i := range size {
		st, err := raftstore.Open(t.TempDir(), raftstore.StoreOptions{NoSync: true, Logger: testkit.QuietLogger(),
			Disk: raftstore.DiskOptions{BallastBytes: -1}})
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		s := New(Config{Logger: testkit.QuietLogger()})
		fz := newFreezer()
		n, err := raftstore.NewNode(raftstore.Config{ID: uint64(i + 1), Peers: peers, Store: st,
			Transport: holdNetSender{c.net}, Logger: testkit.QuietLogger(),
			TickInterval: testkit.TickMS * time.Millisecond, ElectionTicks: testkit.ElectionTicks,
			Observers: []raftstore.Observer{raftstore.ObserverFuncs{Applied: fz.applied}, s}})
		if err != nil {
			t.Fatalf("NewNode: %v", err)
		}
		view := &holdingNode{Node: n}
		s.Attach(view)
		c.net.nodes = append(c.net.nodes, n)
		c.net.queue = append(c.net.queue, make(chan raftpb.Message, 4096))
		c.services = append(c.services, s)
		c.views = append(c.views, view)
		c.freezers = append(c.freezers, fz)
	}
	for i, n := range c.net.nodes {
		c.net.wg.Add(1)
		go func() {
			defer c.net.wg.Done()
			for {
				select {
				case <-c.net.stop:
					return
				case m := <-c.net.queue[i]:
					_ = n.Step(context.Background(), m)
				}
			}
		}()
		n.Start()
	}
	t.Cleanup(func() {
		for _, fz := range c.freezers {
			select {
			case <-fz.release:
			default:
				close(fz.release)
			}
		}
		close(c.net.stop)
		c.net.wg.Wait()
		for i, n := range c.net.nodes {
			n.Stop()
			c.services[i].Close()
		}
	})
	return c
}

// leader waits for a node other than not (-1: any) to be the ready
// leader with its service ready (every timer re-armed).
func (c *holdCluster) leader(t *testing.T, not int) int {
	t.Helper()
	lead := -1
	testkit.Eventually(t, 10*time.Second, "a ready leader", func() bool {
		for i, s := range c.services {
			if i != not && c.net.nodes[i].LeaderReady() && s.IsLeader() {
				lead = i
				return true
			}
		}
		return false
	})
	return lead
}

// freeze blocks node i's raft loop: it arms i's freezer and has the
// marker Grant proposed on i (it leads), which blocks the loop when it
// applies. The proposal's caller waits until release; its result is not
// needed.
func (c *holdCluster) freeze(t *testing.T, i int) {
	t.Helper()
	fz := c.freezers[i]
	fz.armed.Store(true)
	proposed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.net.nodes[i].Propose(ctx, core.Grant(freezeKey, "freezer", 60_000, 0))
		proposed <- err
	}()
	select {
	case <-fz.frozen:
	case err := <-proposed:
		// Only a leadership lost before the marker applied gets here (the
		// loop answers the proposal after the observers): the run was not
		// the one this test sets up.
		t.Fatalf("node %d's marker proposal ended (%v) before it froze the loop (leader now %d)", i+1, err, c.net.nodes[i].Leader())
	case <-time.After(10 * time.Second):
		t.Fatalf("node %d's loop never reached the marker", i+1)
	}
}

// deadlineOf is session id's deadline on node i's timers.
func (c *holdCluster) deadlineOf(t *testing.T, i int, id uint64) time.Time {
	t.Helper()
	s := c.services[i]
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	st, ok := s.lead.sess.byID[id]
	if !ok {
		t.Fatalf("node %d has no timer for session %d", i+1, id)
	}
	return st.deadline
}

// sessionLeader starts the cluster at the sessions' cluster version and
// opens a session of identity A with ttl on its leader.
func sessionLeader(t *testing.T, ttl time.Duration) (c *holdCluster, lead int, id uint64) {
	t.Helper()
	c = startHoldCluster(t)
	lead = c.leader(t, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.net.nodes[lead].Propose(ctx, core.SetClusterVersion(core.MaxClusterVersion)); err != nil {
		t.Fatalf("raise the cluster version: %v", err)
	}
	si, err := c.services[lead].OpenSession(WithIdentity(ctx, "A"), ttl, 0)
	if err != nil {
		t.Fatalf("open session: %v", err)
	}
	return c, lead, si.ID
}

// checkHeld fails unless the service asked its node for a held read:
// the keepalive took the held path this test is about.
func (h *holdingNode) checkHeld(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hold := range h.asked {
		if hold == keepAliveReadHold {
			return
		}
	}
	t.Fatalf("no read held %v (asked: %v): KeepAlive no longer holds its ReadIndex", keepAliveReadHold, h.asked)
}

// Rule 1 with the hold: a leader that was deposed without knowing it (its
// loop frozen while the others elected and re-armed a new leader) gets a
// keepalive, sent after the new leader started timing, that joins its
// held read batch; the hold ends and the round is issued while the old
// leader still believes it leads. The old leader must not acknowledge the
// keepalive: the client would count its session until send + TTL, and
// the new leader's timer runs out before that. The round cannot be
// confirmed (no quorum answers it), so the keepalive fails with a
// not-leader error once the old leader steps down.
func TestKeepAliveHeldOnDeposedLeaderIsNotAcknowledged(t *testing.T) {
	const ttl = 20 * time.Second // no timer runs out during the test
	c, old, id := sessionLeader(t, ttl)
	view := c.views[old]
	view.mu.Lock()
	view.hold = 50 * time.Millisecond // ends while the old leader is frozen
	view.mu.Unlock()

	c.freeze(t, old)
	c.net.isolated.Store(uint64(old + 1))
	lead := c.leader(t, old)
	newDeadline := c.deadlineOf(t, lead, id)
	if !c.services[old].IsLeader() {
		t.Fatal("the frozen leader's service already knows it lost")
	}

	rounds0, readers0 := c.net.nodes[old].ReadIndexRounds()
	sent := time.Now()
	ctx, cancel := context.WithTimeout(WithIdentity(context.Background(), "A"), 15*time.Second)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := c.services[old].KeepAlive(ctx, id)
		result <- err
	}()
	acknowledged := func() {
		t.Helper()
		t.Fatalf("the deposed leader acknowledged a keepalive sent at %v: the client counts its session until %v, node %d expires it at %v",
			sent.Format(time.StampMicro), sent.Add(ttl).Format(time.StampMicro), lead+1, newDeadline.Format(time.StampMicro))
	}
	// The keepalive joins the old leader's held batch; the hold ends while
	// the old leader is still frozen, so its round is issued by a node that
	// believes it leads. (The frozen loop never takes it: it may fail by
	// its timeout before the release below.) A keepalive answered before
	// its round was issued skipped the round.
	var err error
	answered := false
	issued := func() bool {
		rounds, readers := c.net.nodes[old].ReadIndexRounds()
		return readers > readers0 && rounds > rounds0
	}
	testkit.Eventually(t, 5*time.Second, "the keepalive's held round issued on the old leader", func() bool {
		if issued() {
			return true
		}
		select {
		case err = <-result:
			answered = true
			return true
		default:
			return false
		}
	})
	switch {
	case answered && err == nil:
		acknowledged()
	case answered && !issued():
		t.Fatalf("keepalive on the frozen old leader answered (%v) before its round was issued", err)
	}
	close(c.freezers[old].release) // the old leader runs on, isolated, until CheckQuorum steps it down
	if !answered {
		if err = <-result; err == nil {
			acknowledged()
		}
	}
	if nl := (*NotLeaderError)(nil); !errors.As(err, &nl) {
		t.Fatalf("keepalive on the deposed leader: %v, want a not-leader error", err)
	}
	view.checkHeld(t)
}

// Rules 1 and 2 with the hold: a keepalive whose held round was confirmed
// while its leader still led, and that the leader acknowledges after it
// was deposed (frozen, then a new leader elected and re-armed, all between
// the round and the acknowledgement), is covered by the new leader: its
// timer runs out no earlier than send + TTL.
func TestKeepAliveHeldAcknowledgedByDeposedLeaderIsCovered(t *testing.T) {
	const ttl = 20 * time.Second
	c, old, id := sessionLeader(t, ttl)
	view := c.views[old]
	var (
		newLead     = -1
		newDeadline time.Time
	)
	view.mu.Lock()
	view.hold = 100 * time.Millisecond
	view.afterRound = func() {
		// Between the confirmed round and the acknowledgement: the old
		// leader's loop stops, the others elect a leader that re-arms
		// the session.
		c.freeze(t, old)
		c.net.isolated.Store(uint64(old + 1))
		newLead = c.leader(t, old)
		newDeadline = c.deadlineOf(t, newLead, id)
	}
	view.mu.Unlock()

	ctx, cancel := context.WithTimeout(WithIdentity(context.Background(), "A"), 15*time.Second)
	defer cancel()
	sent := time.Now()
	got, err := c.services[old].KeepAlive(ctx, id)
	if err != nil {
		t.Fatalf("keepalive: %v (the old leader's service was still ready: it must acknowledge)", err)
	}
	if got != ttl {
		t.Fatalf("keepalive acknowledged with TTL %v, want %v", got, ttl)
	}
	view.checkHeld(t)
	if newLead < 0 {
		t.Fatal("the leader change between the round and the acknowledgement did not happen")
	}
	if promised := sent.Add(ttl); newDeadline.Before(promised) {
		t.Fatalf("node %d expires the session at %v, before %v, the end the acknowledged keepalive promised",
			newLead+1, newDeadline.Format(time.StampMicro), promised.Format(time.StampMicro))
	}
	close(c.freezers[old].release)
	// The old leader learns it lost once it runs again (CheckQuorum,
	// isolated): its service stops acknowledging anything.
	testkit.Eventually(t, 5*time.Second, "the old leader's service stepped down", func() bool {
		return !c.services[old].IsLeader()
	})
	_, err = c.services[old].KeepAlive(ctx, id)
	if err == nil {
		t.Fatal("the deposed leader acknowledged a keepalive after it stepped down")
	}
}
