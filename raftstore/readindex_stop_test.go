package raftstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// heldReaders starts callers goroutines that each call ReadIndexWithin
// with hold on n, waits until all of them joined the pending batch, and
// returns the channel their results come on, with how long each waited.
func heldReaders(t *testing.T, ctx context.Context, n *Node, callers int, hold time.Duration) <-chan heldResult {
	t.Helper()
	_, readers0 := n.ReadIndexRounds()
	out := make(chan heldResult, callers)
	for range callers {
		go func() {
			start := time.Now()
			err := n.ReadIndexWithin(ctx, hold)
			out <- heldResult{err: err, took: time.Since(start)}
		}()
	}
	testkit.Eventually(t, 5*time.Second, "every held caller joined", func() bool {
		_, readers := n.ReadIndexRounds()
		return readers == readers0+uint64(callers)
	})
	return out
}

type heldResult struct {
	err  error
	took time.Duration
}

// A leader that stops leading while callers hold a minute answers them
// ErrNotLeader as soon as it knows, not when the hold ends: their round
// can no longer be confirmed, so there is nothing to wait for. (Before
// the loss woke the read loop, they waited out the whole minute.)
func TestReadIndexWithinHeldCallersFailWhenLeadershipIsLost(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	rounds0, _ := lead.ReadIndexRounds()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const callers = 10
	results := heldReaders(t, ctx, lead, callers, time.Minute)
	for _, n := range net.nodes {
		if n != lead {
			n.Stop() // no heartbeat is answered any more: CheckQuorum steps the leader down
		}
	}
	for range callers {
		r := <-results
		if !errors.Is(r.err, ErrNotLeader) {
			t.Fatalf("held read on a leader that lost its quorum: %v after %v, want ErrNotLeader", r.err, r.took)
		}
	}
	if lead.IsLeader() {
		t.Fatal("the leader still leads without a quorum")
	}
	// One round at most (it found the node no longer leading), none to
	// raft.
	if rounds, _ := lead.ReadIndexRounds(); rounds != rounds0 {
		t.Fatalf("%d rounds went to raft after leadership was lost", rounds-rounds0)
	}
}

// Stop during a hold answers the held callers ErrStopped at once, leaves
// no hold timer armed (nor arms one for a caller after Stop), and the
// node's goroutines end.
func TestReadIndexWithinStopDuringHold(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	// Goroutines after the store opened and before the node exists: what
	// must be left once it stopped.
	baseline := runtime.NumGoroutine()
	n := startSingle(t, st, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const callers = 10
	results := heldReaders(t, ctx, n, callers, time.Minute)
	n.Stop()
	for range callers {
		r := <-results
		if !errors.Is(r.err, ErrStopped) {
			t.Fatalf("held read when the node stopped: %v after %v, want ErrStopped", r.err, r.took)
		}
	}
	// A timer still armed would fire a minute from now and keep the node
	// reachable until then; Stop reports whether it was still armed.
	timerArmed := func() bool {
		n.reads.mu.Lock()
		defer n.reads.mu.Unlock()
		return n.reads.pending.timer != nil && n.reads.pending.timer.Stop()
	}
	if timerArmed() {
		t.Fatal("the held batch's timer is still armed after Stop")
	}
	if err := n.ReadIndexWithin(ctx, time.Minute); !errors.Is(err, ErrStopped) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("held read after Stop: %v, want ErrStopped or ErrNotLeader", err)
	}
	if timerArmed() {
		t.Fatal("a held read after Stop armed a timer")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // a pause between polls
	}
	if g := runtime.NumGoroutine(); g > baseline {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Stop, %d before the node started:\n%s", g, baseline, buf[:runtime.Stack(buf, true)])
	}
}

// A round whose node stops leading between its leadership check and the
// moment raft takes the ReadIndex fails ErrNotLeader (before, it was
// answered nil there, on a follower). A follower's raft
// would forward the ReadIndex to the new leader and answer it with that
// leader's index: a linearizable read, but no longer a confirmation that
// this node leads, which is what a keepalive's round is for (rule 1 of
// lockservice's KeepAlive). Here the round is paused at that moment while
// leadership moves to another node.
func TestReadIndexRoundOnANodeThatJustStoppedLeading(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	var target *Node
	for _, n := range net.nodes {
		if n != lead {
			target = n
			break
		}
	}
	reached, release := make(chan struct{}), make(chan struct{})
	var once bool
	lead.readHooks.Store(&readHooks{leaderChecked: func() {
		if !once {
			once = true
			close(reached)
			<-release
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	result := make(chan error, 1)
	go func() { result <- lead.ReadIndexWithin(ctx, time.Millisecond) }()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the round never reached raft")
	}
	if err := lead.TransferLeadership(ctx, target.ID()); err != nil {
		t.Fatalf("transfer leadership: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, "the old leader follows the new one", func() bool {
		return target.LeaderReady() && !lead.IsLeader() && lead.Leader() == target.ID()
	})
	close(release)
	if err := <-result; !errors.Is(err, ErrNotLeader) {
		t.Fatalf("read on a node that stopped leading before its round reached raft: %v, want ErrNotLeader", err)
	}
}

// TestWaitAppliedGivesUpItsWaiter: a WaitApplied whose context ends takes
// its waiter out of the queue (on a node that cannot apply, abandoned
// waiters would pile up for ever), and leaves the other waiters queued:
// a waiter still waiting is released by the next applied entry.
func TestWaitAppliedGivesUpItsWaiter(t *testing.T) {
	n := startSingle(t, openTestStore(t, t.TempDir()), Config{})
	far := n.AppliedIndex() + 1_000_000
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if err := n.WaitApplied(ctx, far); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("WaitApplied(%d): %v, want deadline exceeded", far, err)
			}
		}()
	}
	next := n.AppliedIndex() + 1
	waited := make(chan error, 1)
	go func() { waited <- n.WaitApplied(context.Background(), next) }()
	wg.Wait()
	testkit.Eventually(t, 5*time.Second, "only the live waiter queued", func() bool {
		n.waiting.mu.Lock()
		defer n.waiting.mu.Unlock()
		return len(n.waiting.indexWaiters) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, core.Grant("k", "", 60000, 0)); err != nil {
		t.Fatalf("propose: %v", err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("live waiter: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the live waiter was not released by the next applied entry")
	}
}
