package raftstore

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// The batcher alone, at thousands of rounds a second (no raft: the loop
// below answers each batch it takes at once), with eager and held callers
// mixed, holds from microseconds to milliseconds (so that later joiners
// move a batch's due time earlier, timers of taken batches fire late, and
// stale wake tokens abound) and leadership losses urging the pending
// batch. Every caller must be answered by a batch taken after it joined
// (seq above the last issued when it joined), and none may wait much
// past its hold: each goroutine's last calls are all held, so a batch
// left without a timer or a wake would strand them for good.
func TestReadBatcherNeverEarlierNeverStranded(t *testing.T) {
	const (
		callers  = 8
		each     = 4000
		lastHeld = 20               // each goroutine's last calls: held only
		slack    = 2 * time.Second  // a stranded caller waits forever; a loaded, -race run a few ms
		budget   = 15 * time.Second // the whole run, whatever the machine
	)
	var b readBatcher
	b.init()
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { // the read loop, with an instant round
		defer close(loopDone)
		for {
			select {
			case <-b.wake:
			case <-stop:
				return
			}
			if batch := b.take(); batch != nil {
				close(batch.done)
			}
		}
	}()
	defer func() {
		close(stop)
		<-loopDone
		b.stop()
	}()
	urgeDone := make(chan struct{})
	go func() { // leadership lost now and then, while the mixed calls run
		defer close(urgeDone)
		rng := rand.New(rand.NewPCG(7, 7))
		for i := 0; i < 2000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b.leadershipLost()
			for range rng.IntN(20000) { // spin a little: no sleep, no timer
			}
		}
	}()
	holds := []time.Duration{0, 20 * time.Microsecond, 100 * time.Microsecond, 500 * time.Microsecond, 2 * time.Millisecond}
	end := time.Now().Add(budget)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	var served int64
	var mu sync.Mutex
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			n := int64(0)
			defer func() { mu.Lock(); served += n; mu.Unlock() }()
			for i := range each {
				if time.Now().After(end) && i < each-lastHeld {
					continue // out of time: straight to the held-only tail
				}
				hold := holds[rng.IntN(len(holds))]
				if i >= each-lastHeld && hold == 0 {
					hold = holds[1+rng.IntN(len(holds)-1)]
				}
				batch, arrivedAfter := b.join(hold)
				wait := time.NewTimer(hold + slack)
				select {
				case <-batch.done:
					wait.Stop()
				case <-wait.C:
					errs <- fmt.Errorf("caller %d call %d (hold %v) stranded: not answered within %v", c, i, hold, hold+slack)
					return
				}
				if batch.seq <= arrivedAfter {
					errs <- fmt.Errorf("caller %d call %d joined after batch %d and was answered by batch %d", c, i, arrivedAfter, batch.seq)
					return
				}
				n++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	<-urgeDone
	b.mu.Lock()
	rounds := b.issued
	b.mu.Unlock()
	t.Logf("%d reads in %d batches", served, rounds)
	if served < callers*lastHeld {
		t.Fatalf("%d reads served, want at least the %d held-only tail calls", served, callers*lastHeld)
	}
}
