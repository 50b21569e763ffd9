package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// TestShutdownHandsLeadershipOver: a leader stopping on purpose hands
// leadership to a follower first, while a client takes and releases locks
// the whole time. The old leader ends none of its proposals indeterminate
// (each one it took applies, with its answer, before it is deposed), the
// next leader takes over in the next term well inside an election
// timeout, and the client goes on being served. (A request NATS had
// already routed to the old leader's server when its subscription went
// can still time out on the client: that race is NATS's, and is logged.)
func TestShutdownHandsLeadershipOver(t *testing.T) {
	const tickMS, electionTicks = 20, 50 // an election timeout of 1 s
	c := testcluster.New(t, 3, testcluster.WithTicks(tickMS, electionTicks))
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	cl, err := sdk.Connect(c.ClientURL(c.Follower(lead)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })

	var ok, indeterminate atomic.Int64
	var mu sync.Mutex
	var other []error
	stop := make(chan struct{})
	wait := testkit.Workers(4, stop, func(w, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := cl.Acquire(ctx, fmt.Sprintf("handover/%d/%d", w, i%4), sdk.WithLease(5*time.Second))
		if err == nil {
			err = l.Release(ctx)
		}
		switch {
		case err == nil:
			ok.Add(1)
		case errors.Is(err, sdk.ErrIndeterminate):
			indeterminate.Add(1)
		default:
			mu.Lock()
			other = append(other, err)
			mu.Unlock()
		}
	})
	testkit.Eventually(t, 10*time.Second, "cycles before the hand-over", func() bool { return ok.Load() >= 40 })

	old := c.Node(lead)
	term := old.Node().Status().Term
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := old.Node().HandOver(ctx); err != nil {
		t.Fatalf("hand over: %v", err)
	}
	took := time.Since(start)
	if election := time.Duration(tickMS*electionTicks) * time.Millisecond; took >= election {
		t.Fatalf("hand-over took %v, not less than an election timeout (%v)", took, election)
	}
	if st := old.Node().Status(); st.RaftState == raft.StateLeader || st.Lead == old.Node().ID() {
		t.Fatalf("hand-over returned with node %d still leading (%v, leader %d)", lead+1, st.RaftState, st.Lead)
	}
	before := ok.Load()
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(t, old, "ticketd_proposal_failures_total", "code", "indeterminate"); n != 0 {
		t.Fatalf("the old leader ended %v proposals indeterminate", n)
	}
	next := c.Leader(10 * time.Second)
	if st := c.Node(next).Node().Status(); st.Term != term+1 {
		t.Fatalf("new leader %d in term %d, want the transfer's term %d", next+1, st.Term, term+1)
	}
	testkit.Eventually(t, 10*time.Second, "cycles after the hand-over", func() bool { return ok.Load() >= before+40 })
	close(stop)
	wait()
	t.Logf("hand-over took %v; client: %d cycles, %d indeterminate, other errors %v", took, ok.Load(), indeterminate.Load(), other)
}
