package sdk_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// kindResult is a waiting acquire's outcome.
type kindResult struct {
	name string
	l    *sdk.Lock
	err  error
}

// queueFor starts a waiting acquire of key and returns once the leader
// has it queued as the n-th waiter, so that the queue's order is known.
func queueFor(t *testing.T, c *testcluster.Cluster, lead int, cl *sdk.Client, out chan<- kindResult, name, key string, n int, opts ...sdk.AcquireOption) {
	t.Helper()
	go func() {
		l, err := cl.Acquire(t.Context(), key, append(opts, sdk.WithWait(20*time.Second), sdk.WithLease(30*time.Second))...)
		out <- kindResult{name, l, err}
	}()
	testkit.Eventually(t, 10*time.Second, name+" queued", func() bool { return c.Node(lead).Locks().Waiting(key) == n })
}

func served(t *testing.T, out <-chan kindResult) kindResult {
	t.Helper()
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("%s: %v", r.name, r.err)
		}
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("no waiter was served")
	}
	return kindResult{}
}

// A semaphore through NATS: N holders with their own rising tokens, then
// held; a mismatched limit is invalid_argument naming the key's; waiters
// are served FIFO; get shows every holder; one holder's expiry frees one
// slot; a leader change keeps the holders.
func TestSemaphoreCluster(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	short, err := cl.Acquire(ctx, "sem", sdk.WithLimit(3), sdk.WithLease(time.Second), sdk.WithOwner("short"))
	if err != nil {
		t.Fatal(err)
	}
	var held []*sdk.Lock
	for i := 0; i < 2; i++ {
		l, err := cl.Acquire(ctx, "sem", sdk.WithLimit(3), sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
		held = append(held, l)
	}
	if held[0].Token <= short.Token || held[1].Token <= held[0].Token || held[1].Limit != 3 {
		t.Fatalf("tokens %d %d %d (limit %d)", short.Token, held[0].Token, held[1].Token, held[1].Limit)
	}
	if _, err := cl.Acquire(ctx, "sem", sdk.WithLimit(3)); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("fourth try: %v, want held", err)
	}
	if _, err := cl.Acquire(ctx, "sem", sdk.WithLimit(4)); !errors.Is(err, sdk.ErrInvalidArgument) || !strings.Contains(err.Error(), "has limit 3") {
		t.Fatalf("limit 4 on a semaphore of 3: %v, want invalid_argument naming limit 3", err)
	}
	if _, err := cl.Acquire(ctx, "sem"); !errors.Is(err, sdk.ErrInvalidArgument) {
		t.Fatalf("a mutex acquire of a semaphore: %v, want invalid_argument", err)
	}
	h, err := cl.Get(ctx, "sem")
	if err != nil || h.Limit != 3 || len(h.Holders) != 3 || h.Holders[0].Owner != "short" || h.Holders[2].Token != held[1].Token {
		t.Fatalf("get: %+v %v", h, err)
	}
	page, err := cl.List(ctx, "sem", "", 10)
	if err != nil || len(page.Locks) != 3 || page.Locks[1].Token != held[0].Token || page.Locks[1].Limit != 3 {
		t.Fatalf("list: %+v %v", page, err)
	}

	// The short holder's lease runs out: its slot goes to the first waiter.
	out := make(chan kindResult, 2)
	queueFor(t, c, lead, cl, out, "w1", "sem", 1, sdk.WithLimit(3))
	queueFor(t, c, lead, cl, out, "w2", "sem", 2, sdk.WithLimit(3))
	if r := served(t, out); r.name != "w1" || r.l.Token <= held[1].Token {
		t.Fatalf("first served: %s token %d", r.name, r.l.Token)
	} else {
		held = append(held, r.l)
	}
	if err := cl.Release(ctx, "sem", short.Token); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("release of the expired holder: %v, want not_found", err)
	}
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := served(t, out)
	if w2.name != "w2" {
		t.Fatalf("second served: %s", w2.name)
	}
	held = append(held[1:], w2.l)

	// A leader change keeps the holders, their tokens and the limit.
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	lead = c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "a new ready leader", func() bool { return c.Node(lead).Locks().IsLeader() })
	h, err = cl.Get(ctx, "sem")
	if err != nil || len(h.Holders) != 3 {
		t.Fatalf("get after the leader change: %+v %v", h, err)
	}
	for i, l := range held {
		if h.Holders[i].Token != l.Token || h.Holders[i].Remaining <= 0 {
			t.Fatalf("holder %d after the leader change: %+v, want token %d", i, h.Holders[i], l.Token)
		}
	}
	if _, err := cl.Acquire(ctx, "sem", sdk.WithLimit(3)); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("try of the full semaphore on the new leader: %v, want held", err)
	}
}

// A writer waiting on a read/write lock is served while a stream of
// readers keeps the key held shared: later shared requests queue behind
// it. Its token is above every reader's granted before it.
func TestWriterNotStarvedByReaders(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, lead)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var maxReader atomic.Uint64
	var readers sync.WaitGroup
	writerDone := make(chan struct{})
	var reads atomic.Int64
	for r := 0; r < 4; r++ {
		readers.Add(1)
		go func() { // a reader holds for a moment, again and again
			defer readers.Done()
			for i := 0; i < 200; i++ {
				select {
				case <-writerDone:
					return
				default:
				}
				l, err := cl.Acquire(ctx, "rw", sdk.WithShared(), sdk.WithWait(10*time.Second))
				if err != nil {
					return
				}
				for cur := maxReader.Load(); l.Token > cur && !maxReader.CompareAndSwap(cur, l.Token); cur = maxReader.Load() {
				}
				reads.Add(1)
				_ = sleep(ctx, 5*time.Millisecond) // holding, not waiting for a condition
				_ = l.Release(ctx)
			}
		}()
	}
	testkit.Eventually(t, 10*time.Second, "readers holding", func() bool { return reads.Load() > 4 })
	w, err := cl.Acquire(ctx, "rw", sdk.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("writer starved: %v", err)
	}
	before := maxReader.Load()
	close(writerDone)
	// No reader is granted while the writer holds, so every reader token
	// seen so far was granted before it.
	if w.Token <= before {
		t.Fatalf("writer token %d not above the readers' %d", w.Token, before)
	}
	h, err := cl.Get(ctx, "rw")
	if err != nil || !h.Held || h.Token != w.Token || len(h.Holders) != 0 {
		t.Fatalf("the writer is not the only holder: %+v %v", h, err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	readers.Wait()
}

// Curator's order through NATS, step by step: with a reader holding and a
// writer queued, a later reader's try is held and its wait queues behind
// the writer; the writer is served first, then the reader.
func TestReadWriteOrderCluster(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	r1, err := cl.Acquire(ctx, "rw", sdk.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := cl.Acquire(ctx, "rw", sdk.WithShared())
	if err != nil || !r2.Shared {
		t.Fatalf("second reader beside the first: %+v %v", r2, err)
	}
	if _, err := cl.Acquire(ctx, "rw"); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("writer try beside readers: %v, want held", err)
	}
	out := make(chan kindResult, 2)
	queueFor(t, c, lead, cl, out, "writer", "rw", 1)
	if _, err := cl.Acquire(ctx, "rw", sdk.WithShared()); !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("reader try behind a queued writer: %v, want held", err)
	}
	queueFor(t, c, lead, cl, out, "reader3", "rw", 2, sdk.WithShared())
	h, err := cl.Get(ctx, "rw")
	if err != nil || !h.Shared || len(h.Holders) != 2 {
		t.Fatalf("get of the readers: %+v %v", h, err)
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := served(t, out)
	if w.name != "writer" || w.l.Token <= r2.Token {
		t.Fatalf("served %s (token %d) first, want the writer above %d", w.name, w.l.Token, r2.Token)
	}
	select {
	case r := <-out:
		t.Fatalf("%s served beside the writer", r.name)
	default:
	}
	if err := w.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := served(t, out); r.name != "reader3" || r.l.Token <= w.l.Token {
		t.Fatalf("served %s token %d after the writer", r.name, r.l.Token)
	}
}
