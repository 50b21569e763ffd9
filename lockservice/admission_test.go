package lockservice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Places that come free go to the identities with proposals waiting in
// turn, one each: bob's one proposal is admitted right after alice's
// first, however many alice queued before him.
func TestAdmissionTurns(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name  string
		limit int
		// queue is the identities of the proposals queued, in order,
		// once the limit's places are taken; want the order they are
		// admitted in as places come free one at a time.
		queue, want []string
	}{
		{"one identity: FIFO", 1, []string{"a", "a", "a"}, []string{"a", "a", "a"}},
		{"late arrival served in the first round", 1,
			[]string{"a", "a", "a", "a", "b"}, []string{"a", "b", "a", "a", "a"}},
		{"three identities round robin", 2,
			[]string{"a", "a", "a", "b", "b", "c"}, []string{"a", "b", "c", "a", "b", "a"}},
		{"anonymous is one identity", 1,
			[]string{"", "", "x", ""}, []string{"", "x", "", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmission(tt.limit, time.Minute)
			for i := 0; i < tt.limit; i++ {
				// Two identities in a row: the limit holds.
				if tk := a.enter(fmt.Sprint("holder", i%2), false, now); tk != nil {
					t.Fatalf("place %d of %d queued", i, tt.limit)
				}
			}
			var tickets []*ticket
			for _, id := range tt.queue {
				tk := a.enter(id, false, now)
				if tk == nil {
					t.Fatalf("%q admitted beyond the limit", id)
				}
				tickets = append(tickets, tk)
			}
			var got []string
			for range tt.queue {
				a.leave()
				for i, tk := range tickets {
					if tk != nil && tk.admitted {
						got = append(got, tt.queue[i])
						tickets[i] = nil
					}
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("admitted %q, want %q", got, tt.want)
			}
			if a.waiting != 0 || len(a.by) != 0 || a.turns.Len() != 0 || a.proposing != tt.limit {
				t.Fatalf("after: waiting %d, queues %d, turns %d, proposing %d", a.waiting, len(a.by), a.turns.Len(), a.proposing)
			}
		})
	}
}

// One identity alone is not bounded once the contention window has
// passed since another proposed; the cluster's own proposals never wait.
func TestAdmissionWhenBound(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAdmission(2, time.Second)
	for i := 0; i < 5; i++ {
		if a.enter("a", false, now) != nil {
			t.Fatalf("alone: proposal %d queued", i)
		}
	}
	// b arrives: the bound holds again, for both.
	if a.enter("b", false, now) == nil {
		t.Fatal("b admitted with 5 of a's in raft and a limit of 2")
	}
	if a.enter("a", false, now.Add(500*time.Millisecond)) == nil {
		t.Fatal("a admitted within the window")
	}
	if a.enter("", true, now) != nil {
		t.Fatal("the cluster's own proposal queued")
	}
}

// A proposal whose time runs out in the queue is refused with ErrTimeout
// and never reaches the node; a Grant's acquire times out at its deadline
// with its key free again; the cluster's own Expire goes through a full
// window.
func TestAdmissionTimeoutProposesNothing(t *testing.T) {
	s, f := newLeader(t, Config{MaxProposing: 1})
	alice := WithIdentity(context.Background(), "alice")
	g, err := s.Acquire(alice, AcquireParams{Key: "k", Lease: time.Minute, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Bob takes the one place: two identities propose, the bound holds.
	if s.admission.enter("bob", false, time.Now()) != nil {
		t.Fatal("bob's proposal queued with the place free")
	}
	before := f.proposals.Load()
	ctx, cancel := context.WithTimeout(alice, 50*time.Millisecond)
	defer cancel()
	if err := s.Release(ctx, "k", g.Token); !errors.Is(err, ErrTimeout) {
		t.Fatalf("release with the place taken: %v, want ErrTimeout", err)
	}
	_, err = s.Acquire(alice, AcquireParams{Key: "free", Lease: time.Minute, Timeout: s.cfg.ReplyMargin + 50*time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("acquire with the place taken: %v, want ErrTimeout", err)
	}
	if n := f.proposals.Load() - before; n != 0 {
		t.Fatalf("%d proposals reached the node", n)
	}
	s.lead.mu.Lock()
	_, reserved := s.lead.reserved["free"]
	s.lead.mu.Unlock()
	if reserved {
		t.Fatal("the timed-out acquire's key is still reserved")
	}
	if a, err := s.propose(context.Background(), core.Expire("k", g.Token)); err != nil || !a.Result.Existed {
		t.Fatalf("the cluster's expire: %+v %v", a, err)
	}
	s.admission.mu.Lock()
	defer s.admission.mu.Unlock()
	if s.admission.waiting != 0 || len(s.admission.by) != 0 {
		t.Fatalf("queue left: waiting %d, identities %d", s.admission.waiting, len(s.admission.by))
	}
}

// Many identities entering, timing out and leaving at once never lose or
// leak a place: afterwards nothing is in raft or queued.
func TestAdmissionConcurrent(t *testing.T) {
	a := newAdmission(3, time.Minute)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; i < 200; i++ {
				tk := a.enter(fmt.Sprint("id", r.IntN(4)), r.IntN(10) == 0, time.Now())
				if tk != nil {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(200))*time.Microsecond)
					err := a.await(ctx, tk)
					cancel()
					if err != nil {
						continue
					}
				}
				a.leave()
			}
		}()
	}
	wg.Wait()
	if a.proposing != 0 || a.waiting != 0 || len(a.by) != 0 || a.turns.Len() != 0 {
		t.Fatalf("after: proposing %d, waiting %d, queues %d, turns %d", a.proposing, a.waiting, len(a.by), a.turns.Len())
	}
}
