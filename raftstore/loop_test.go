package raftstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// A queued batch that raft drops (here: a follower that knows no leader)
// was certainly not proposed: every caller in it hears ErrNotLeader, and
// nothing reaches the log.
func TestDroppedProposalBatchAnswersNotLeader(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n, err := NewNode(Config{ID: 1, Peers: []uint64{1, 2, 3}, Store: st, Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatalf("NewNode: %v", err)
	}
	t.Cleanup(n.Stop)
	before, err := st.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint64{11, 12, 13}
	var chans []chan proposalResult
	var batch []raftpb.Entry
	for _, id := range ids {
		chans = append(chans, n.waiting.addProposal(id))
		batch = append(batch, raftpb.Entry{Data: core.EncodeEntry(core.Entry{RequestID: id, Command: core.Grant(fmt.Sprint(id), "", 1000, 0)})})
	}
	n.call(context.Background(), func(*raft.RawNode) { n.proposeBatch(batch, ids) })
	for i, ch := range chans {
		select {
		case r := <-ch:
			if !errors.Is(r.err, ErrNotLeader) {
				t.Fatalf("proposal %d: err %v, want ErrNotLeader", ids[i], r.err)
			}
		default:
			t.Fatalf("proposal %d was not answered", ids[i])
		}
	}
	n.call(context.Background(), func(rn *raft.RawNode) {
		if rn.HasReady() {
			for _, e := range rn.Ready().Entries {
				if e.Type == raftpb.EntryNormal && len(e.Data) > 0 {
					t.Errorf("a dropped proposal reached the log at %d", e.Index)
				}
			}
		}
	})
	if after, _ := st.LastIndex(); after != before {
		t.Fatalf("last index %d -> %d", before, after)
	}
}

// Proposals queued while the loop is busy go to raft together: they are
// applied in one Ready, and each caller gets its own result.
func TestQueuedProposalsShareOneReady(t *testing.T) {
	const callers = 50
	st := openTestStore(t, t.TempDir())
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	n := startSingle(t, st, Config{Metrics: metrics})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Hold the loop until every caller's entry is queued.
	release := make(chan struct{})
	held := make(chan struct{})
	go n.call(ctx, func(*raft.RawNode) {
		close(held)
		<-release
	})
	<-held
	appliesBefore, entriesBefore := histogram(t, reg, "ticketd_apply_batch_entries")

	var wg sync.WaitGroup
	tokens := make([]uint64, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := n.Propose(ctx, core.Grant(fmt.Sprintf("k%d", i), "", 60000, 0))
			tokens[i], errs[i] = a.Result.Token, err
		}()
	}
	testkit.Eventually(t, 5*time.Second, "all proposals queued", func() bool { return len(n.propc) == callers })
	close(release)
	wg.Wait()

	seen := make(map[uint64]bool)
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if tokens[i] == 0 || seen[tokens[i]] {
			t.Fatalf("caller %d: token %d (zero or given twice)", i, tokens[i])
		}
		seen[tokens[i]] = true
	}
	// The replies go out before the Ready's write (deliverApplied), the
	// apply metric after it.
	var applies uint64
	var entries float64
	testkit.Eventually(t, 5*time.Second, "the applying Ready observed", func() bool {
		applies, entries = histogram(t, reg, "ticketd_apply_batch_entries")
		return applies > appliesBefore
	})
	if applies-appliesBefore != 1 || entries-entriesBefore != callers {
		t.Fatalf("%d proposals queued together were applied in %d Readys (%v entries), want 1", callers, applies-appliesBefore, entries-entriesBefore)
	}
}

// Status, a read and a membership proposal work before Start (run on the
// caller), and calls after Stop return at once instead of hanging.
func TestCallsBeforeStartAndAfterStop(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n, err := NewNode(Config{ID: 1, Peers: []uint64{1}, Store: st, Logger: testkit.QuietLogger(), TickInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewNode: %v", err)
	}
	if st := n.Status(); st.ID != 1 {
		t.Fatalf("status before start: id %d", st.ID)
	}
	n.Start()
	testkit.Eventually(t, 10*time.Second, "leads", n.LeaderReady)
	if st := n.Status(); st.RaftState != raft.StateLeader {
		t.Fatalf("status after start: %v", st.RaftState)
	}
	n.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Status()
		n.ReportUnreachable(2)
		if err := n.ReadIndex(context.Background()); err == nil {
			t.Error("read index after stop succeeded")
		}
		if _, err := n.Propose(context.Background(), core.Grant("k", "", 1000, 0)); err == nil {
			t.Error("propose after stop succeeded")
		}
		if err := n.Step(context.Background(), raftpb.Message{Type: raftpb.MsgHeartbeat, From: 2, To: 1}); err != nil && !errors.Is(err, ErrStopped) {
			t.Errorf("step after stop: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("calls after Stop hang")
	}
}

// A loop held by a long Ready (here: a blocking call standing in for a
// stalled fsync) does not hang status readers or callers with a deadline:
// Status answers with the last status the loop published, ReadIndex with
// its context's error.
func TestStatusAndReadIndexWhileLoopIsBusy(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n := startSingle(t, st, Config{})
	testkit.Eventually(t, 5*time.Second, "leader status published", func() bool {
		return n.Status().RaftState == raft.StateLeader
	})
	release := make(chan struct{})
	held := make(chan struct{})
	go n.call(context.Background(), func(*raft.RawNode) {
		close(held)
		<-release
	})
	defer close(release)
	<-held

	start := time.Now()
	if got := n.Status(); got.RaftState != raft.StateLeader || got.ID != 1 {
		t.Fatalf("status of a busy loop: %v id %d, want the last published (leader, 1)", got.RaftState, got.ID)
	}
	if d := time.Since(start); d > 3*statusWait {
		t.Fatalf("status took %v", d)
	}
	// The caller's deadline is well inside the read round's own timeout
	// (readRoundTimeoutElections election timeouts, 100 ms here), so it is
	// the context that ends the wait, not the round.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := n.ReadIndex(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read index on a busy loop: %v, want its deadline", err)
	}
}
