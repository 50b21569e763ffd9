package raftstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// memNet carries raft messages between in-process nodes, in order per
// destination, and counts and drops what a test asks it to.
type memNet struct {
	nodes []*Node // index = id-1
	queue []chan raftpb.Message

	emptyAppends atomic.Int64 // MsgApp without entries, any sender
	dropAppendTo atomic.Uint64
	dropped      atomic.Int64
	wg           sync.WaitGroup
	stop         chan struct{}
}

type memNetSender struct {
	net *memNet
}

func (s memNetSender) Send(msgs []raftpb.Message) {
	for _, m := range msgs {
		if m.Type == raftpb.MsgApp && len(m.Entries) == 0 {
			s.net.emptyAppends.Add(1)
		}
		if m.Type == raftpb.MsgApp && len(m.Entries) > 0 && m.To == s.net.dropAppendTo.Load() {
			s.net.dropped.Add(1)
			continue
		}
		select {
		case s.net.queue[m.To-1] <- m:
		default: // a full link loses the message, as a network may
		}
	}
}

func startMemCluster(t *testing.T, size int) *memNet {
	t.Helper()
	stores := make([]*Store, size)
	for i := range stores {
		stores[i] = openTestStore(t, t.TempDir())
	}
	return startMemClusterOn(t, stores)
}

// startMemClusterOn starts one node on each store, with ids 1, 2, ...
func startMemClusterOn(t *testing.T, stores []*Store) *memNet {
	t.Helper()
	return startMemClusterObserved(t, stores, nil)
}

// startMemClusterObserved is startMemClusterOn with observers[i] observing
// the node on stores[i] (observers may be nil or shorter).
func startMemClusterObserved(t *testing.T, stores []*Store, observers [][]Observer) *memNet {
	t.Helper()
	net := &memNet{stop: make(chan struct{})}
	peers := make([]uint64, len(stores))
	for i := range peers {
		peers[i] = uint64(i + 1)
	}
	for i, st := range stores {
		var obs []Observer
		if i < len(observers) {
			obs = observers[i]
		}
		n, err := NewNode(Config{ID: uint64(i + 1), Peers: peers, Store: st, Observers: obs,
			Transport: memNetSender{net}, Logger: testkit.QuietLogger(), TickInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatalf("NewNode: %v", err)
		}
		net.nodes = append(net.nodes, n)
		net.queue = append(net.queue, make(chan raftpb.Message, 4096))
	}
	for i, n := range net.nodes {
		net.wg.Add(1)
		go func() {
			defer net.wg.Done()
			for {
				select {
				case <-net.stop:
					return
				case m := <-net.queue[i]:
					_ = n.Step(context.Background(), m)
				}
			}
		}()
		n.Start()
	}
	t.Cleanup(func() {
		close(net.stop)
		net.wg.Wait()
		for _, n := range net.nodes {
			n.Stop()
		}
	})
	return net
}

func (net *memNet) leader(t *testing.T) *Node {
	t.Helper()
	var lead *Node
	testkit.Eventually(t, 10*time.Second, "a ready leader", func() bool {
		for _, n := range net.nodes {
			if n.LeaderReady() {
				lead = n
				return true
			}
		}
		return false
	})
	return lead
}

// allApplied waits until every node has applied index.
func (net *memNet) allApplied(t *testing.T, index uint64, within time.Duration) {
	t.Helper()
	testkit.Eventually(t, within, fmt.Sprintf("every node applies %d", index), func() bool {
		for _, n := range net.nodes {
			if n.AppliedIndex() < index {
				return false
			}
		}
		return true
	})
}

// One proposal at a time (the light load where commit-only appends were
// half of all messages): the leader sends almost none of them, and the
// followers still apply everything, from the next append or a heartbeat.
func TestCommitOnlyAppendsNotSent(t *testing.T) {
	const proposals = 60
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	net.allApplied(t, lead.AppliedIndex(), 5*time.Second)
	before := net.emptyAppends.Load()
	for i := range proposals {
		if _, err := lead.Propose(ctx, core.Grant(fmt.Sprintf("k%d", i), "", 60000, 0)); err != nil {
			t.Fatalf("propose %d: %v", i, err)
		}
	}
	// Unfiltered, each proposal brings one commit-only append per follower
	// (2 per proposal); a held one may go out at a tick (50 ms), so the
	// bound leaves room for a slow machine.
	got := net.emptyAppends.Load() - before
	t.Logf("%d proposals, %d commit-only appends sent", proposals, got)
	if got > proposals/2 {
		t.Fatalf("%d proposals one at a time sent %d commit-only appends, want at most %d", proposals, got, proposals/2)
	}
	net.allApplied(t, lead.AppliedIndex(), 5*time.Second)
}

// An append lost on its way to a follower, then an idle cluster: the
// follower must still catch up, through the held empty append (raft's
// probe after a heartbeat response) that the next tick sends.
func TestLostAppendRecoversWhenIdle(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	net.allApplied(t, lead.AppliedIndex(), 5*time.Second)
	var victim uint64 = 1
	if lead.ID() == 1 {
		victim = 2
	}
	net.dropAppendTo.Store(victim)
	if _, err := lead.Propose(ctx, core.Grant("lost", "", 60000, 0)); err != nil {
		t.Fatalf("propose: %v", err)
	}
	net.dropAppendTo.Store(0)
	if net.dropped.Load() == 0 {
		t.Fatal("no append was dropped")
	}
	// No more proposals: only ticks can bring the victim its entry.
	net.allApplied(t, lead.AppliedIndex(), 5*time.Second)
}
