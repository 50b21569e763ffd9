package raftstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

// servedLog records, for every caller a round answered, the last round
// issued when it joined and the round that answered it.
type servedLog struct {
	mu    sync.Mutex
	pairs [][2]uint64
}

func (l *servedLog) add(arrivedAfter, servedBy uint64) {
	l.mu.Lock()
	l.pairs = append(l.pairs, [2]uint64{arrivedAfter, servedBy})
	l.mu.Unlock()
}

// checkNeverEarlier fails if a caller was answered by a round issued
// before (or as) it arrived.
func (l *servedLog) checkNeverEarlier(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.pairs {
		if p[1] <= p[0] {
			t.Fatalf("a caller that arrived after round %d was answered by round %d", p[0], p[1])
		}
	}
}

// readConcurrently runs callers goroutines that each call read(c, i) for
// i in [0, each), and fails the test with the first error any returned.
func readConcurrently(t *testing.T, callers, each int, read func(c, i int) error) {
	t.Helper()
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := read(c, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("read index: %v", err)
	}
}

// A caller that arrives while a round is in flight waits for the next
// round: here round 1 is held before it goes to raft, caller B joins
// meanwhile, and B returns only after round 2, which the test holds too.
func TestReadIndexCallerWaitsForARoundIssuedAfterIt(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n := startSingle(t, st, Config{})
	testkit.Eventually(t, 5*time.Second, "leader", n.IsLeader)

	var log servedLog
	issued := make(chan uint64, 4)
	release := map[uint64]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	n.readHooks.Store(&readHooks{
		issuing: func(seq uint64) {
			issued <- seq
			if ch, ok := release[seq]; ok {
				<-ch
			}
		},
		served: log.add,
	})
	rounds0, readers0 := n.ReadIndexRounds()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func() chan error {
		done := make(chan error, 1)
		go func() { done <- n.ReadIndex(ctx) }()
		return done
	}
	nextIssued := func(want uint64) {
		t.Helper()
		select {
		case seq := <-issued:
			if seq != want {
				t.Fatalf("round %d issued, want %d", seq, want)
			}
		case <-ctx.Done():
			t.Fatalf("round %d never issued", want)
		}
	}

	a := read()
	nextIssued(1)
	b := read()
	testkit.Eventually(t, 5*time.Second, "caller B joined", func() bool {
		_, readers := n.ReadIndexRounds()
		return readers == readers0+2
	})
	close(release[1])
	if err := <-a; err != nil {
		t.Fatalf("caller A: %v", err)
	}
	nextIssued(2) // B's own round: B did not ride on round 1
	select {
	case err := <-b:
		t.Fatalf("caller B returned (%v) before its round was released", err)
	default:
	}
	close(release[2])
	if err := <-b; err != nil {
		t.Fatalf("caller B: %v", err)
	}
	log.checkNeverEarlier(t)
	if rounds, _ := n.ReadIndexRounds(); rounds != rounds0+2 {
		t.Fatalf("%d rounds, want 2", rounds-rounds0)
	}
}

// Many concurrent callers on a 3-node leader share few rounds (one raft
// ReadIndex, one heartbeat broadcast, each), and none is answered by a
// round issued before it arrived.
func TestReadIndexConcurrentCallersShareRounds(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	var log servedLog
	lead.readHooks.Store(&readHooks{served: log.add})
	rounds0, readers0 := lead.ReadIndexRounds()

	const callers, each = 64, 40
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	readConcurrently(t, callers, each, func(int, int) error { return lead.ReadIndex(ctx) })
	rounds, readers := lead.ReadIndexRounds()
	rounds, readers = rounds-rounds0, readers-readers0
	t.Logf("%d reads in %d raft ReadIndex rounds", readers, rounds)
	if readers != callers*each {
		t.Fatalf("%d readers counted, want %d", readers, callers*each)
	}
	// Unbatched, every read is a round. With 64 callers looping, a round
	// in flight gathers most of the others; a quarter is far above what
	// batching gives and far below one round per read.
	if rounds*4 > readers {
		t.Fatalf("%d rounds for %d reads: not batched", rounds, readers)
	}
	log.checkNeverEarlier(t)
}

// A leader that loses its quorum while callers wait, in a round in flight
// or for the next one, answers every one of them ErrNotLeader (CheckQuorum
// steps it down); none is answered as if the read were confirmed.
func TestReadIndexCallersFailNotLeaderWhenLeadershipIsLost(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	for _, n := range net.nodes {
		if n != lead {
			n.Stop() // no heartbeat is answered any more
		}
	}
	rounds0, _ := lead.ReadIndexRounds()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const callers = 40
	errs := make(chan error, callers)
	read := func() { errs <- lead.ReadIndex(ctx) }
	for range callers / 2 {
		go read()
	}
	// The rest arrive while the first round is in flight: they wait for
	// the next round, which finds the node no longer leading.
	testkit.Eventually(t, 5*time.Second, "a round in flight", func() bool {
		rounds, _ := lead.ReadIndexRounds()
		return rounds > rounds0
	})
	for range callers - callers/2 {
		go read()
	}
	for range callers {
		if err := <-errs; !errors.Is(err, ErrNotLeader) {
			t.Fatalf("read index while the leader lost its quorum: %v, want ErrNotLeader", err)
		}
	}
	if lead.IsLeader() {
		t.Fatal("the leader still leads without a quorum")
	}
}

// Callers that can wait do not start a round until the first hold ends or
// a caller that cannot wait joins; then one round answers them all. Here
// the hold is far longer than the test, so only the eager caller can
// start the round.
func TestReadIndexWithinWaitsForHoldOrEagerCaller(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n := startSingle(t, st, Config{})
	testkit.Eventually(t, 5*time.Second, "leader", n.IsLeader)
	var log servedLog
	n.readHooks.Store(&readHooks{served: log.add})
	rounds0, readers0 := n.ReadIndexRounds()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const lazy = 20
	errs := make(chan error, lazy+1)
	for range lazy {
		go func() { errs <- n.ReadIndexWithin(ctx, time.Minute) }()
	}
	testkit.Eventually(t, 5*time.Second, "every lazy caller joined", func() bool {
		_, readers := n.ReadIndexRounds()
		return readers == readers0+lazy
	})
	// No round was started for them: nothing wakes the loop before the
	// minute's hold but an eager caller.
	if rounds, _ := n.ReadIndexRounds(); rounds != rounds0 {
		t.Fatalf("%d rounds started for callers holding a minute", rounds-rounds0)
	}
	select {
	case err := <-errs:
		t.Fatalf("a lazy caller returned (%v) before any round", err)
	default:
	}
	go func() { errs <- n.ReadIndex(ctx) }()
	for range lazy + 1 {
		if err := <-errs; err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	if rounds, _ := n.ReadIndexRounds(); rounds != rounds0+1 {
		t.Fatalf("%d rounds, want the eager caller's one round for all %d callers", rounds-rounds0, lazy+1)
	}
	log.checkNeverEarlier(t)
}

// A lone caller that can wait is answered once its hold ends, by a round
// issued after it joined; callers holding past a round in flight wait for
// the next one.
func TestReadIndexWithinServedAfterHold(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	var log servedLog
	lead.readHooks.Store(&readHooks{served: log.add})
	rounds0, readers0 := lead.ReadIndexRounds()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const hold = 50 * time.Millisecond
	start := time.Now()
	if err := lead.ReadIndexWithin(ctx, hold); err != nil {
		t.Fatalf("read: %v", err)
	}
	if took := time.Since(start); took < hold {
		t.Fatalf("answered after %v, before its %v hold", took, hold)
	}
	if rounds, _ := lead.ReadIndexRounds(); rounds != rounds0+1 {
		t.Fatalf("%d rounds for one caller", rounds-rounds0)
	}

	// Many callers, each reading in a loop with a hold: they share rounds
	// far more than eager callers would, and none is answered early.
	rounds0, readers0 = lead.ReadIndexRounds()
	const callers, each = 32, 10
	readConcurrently(t, callers, each, func(int, int) error { return lead.ReadIndexWithin(ctx, hold) })
	rounds, readers := lead.ReadIndexRounds()
	rounds, readers = rounds-rounds0, readers-readers0
	t.Logf("%d held reads in %d rounds", readers, rounds)
	if readers != callers*each {
		t.Fatalf("%d readers counted, want %d", readers, callers*each)
	}
	if rounds*8 > readers {
		t.Fatalf("%d rounds for %d reads held %v: the hold did not batch them", rounds, readers, hold)
	}
	log.checkNeverEarlier(t)
}

// Eager and held callers mixed, many rounds: none is answered by a round
// issued before it joined, and none waits much past its hold (a held
// caller stranded with no timer to wake the loop would wait for the next
// eager caller, which here may never come: the last calls are all held).
func TestReadIndexMixedEagerAndHeldCallers(t *testing.T) {
	net := startMemCluster(t, 3)
	lead := net.leader(t)
	var log servedLog
	lead.readHooks.Store(&readHooks{served: log.add})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const callers, each = 16, 30
	readConcurrently(t, callers, each, func(c, i int) error {
		// Every third caller is eager until its last calls; the holds
		// vary from 1 to 7 ms so that later joiners move a batch's due
		// time earlier (Reset).
		if c%3 == 0 && i < each-5 {
			return lead.ReadIndex(ctx)
		}
		hold := time.Duration(1+(c*7+i)%7) * time.Millisecond
		start := time.Now()
		if err := lead.ReadIndexWithin(ctx, hold); err != nil {
			return err
		}
		if took := time.Since(start); took > hold+5*time.Second {
			return fmt.Errorf("a read held %v waited %v", hold, took)
		}
		return nil
	})
	log.checkNeverEarlier(t)
	log.mu.Lock()
	n := len(log.pairs)
	log.mu.Unlock()
	if n != callers*each {
		t.Fatalf("%d reads served, want %d", n, callers*each)
	}
}
