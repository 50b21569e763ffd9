package plugins

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The budget: a second's worth at first, spent by the time calls held an
// instance, refilled at its rate, never above a second's worth; a spent
// budget refuses at once with a *ShareError naming the identity.
func TestShareBudget(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	s := newShares("p", 2, 100*time.Millisecond)
	s.now = clk.Now
	call := func(id string, used time.Duration) error {
		sh, err := s.begin(context.Background(), id)
		if err != nil {
			return err
		}
		s.end(id, sh, used)
		return nil
	}
	steps := []struct {
		name    string
		advance time.Duration
		id      string
		used    time.Duration
		refused bool
	}{
		{name: "first call", id: "A", used: 60 * time.Millisecond},
		{name: "within the second's worth", id: "A", used: 60 * time.Millisecond},
		{name: "spent", id: "A", refused: true},
		{name: "another identity is not", id: "B", used: time.Millisecond},
		{name: "anonymous is one more identity", id: "", used: time.Millisecond},
		{name: "still spent after 100ms", advance: 100 * time.Millisecond, id: "A", refused: true},
		{name: "refilled after 300ms", advance: 200 * time.Millisecond, id: "A", used: 2 * time.Second},
		{name: "a long call is a long debt", advance: time.Second, id: "A", refused: true},
		{name: "paid off", advance: 20 * time.Second, id: "A", used: 0},
	}
	for _, st := range steps {
		clk.add(st.advance)
		err := call(st.id, st.used)
		var se *ShareError
		switch {
		case st.refused && (!errors.As(err, &se) || !errors.Is(err, ErrShareSpent) || se.Identity != st.id || se.PerSecond != 100*time.Millisecond):
			t.Fatalf("%s: err %v, want a ShareError for %q", st.name, err, st.id)
		case !st.refused && err != nil:
			t.Fatalf("%s: %v", st.name, err)
		}
	}
	// A budget refills to a second's worth, no more: after an hour the
	// state of each identity that calls again is dropped as soon as it
	// is idle (full, as a fresh one).
	clk.add(time.Hour)
	for _, id := range []string{"A", "B", ""} {
		if err := call(id, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	n := len(s.by)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d idle identities kept, want none", n)
	}
}

// At most calls of one identity run at once; the next waits for one of
// them (or its context), and other identities do not wait at all.
func TestShareConcurrency(t *testing.T) {
	s := newShares("p", 2, time.Hour)
	a1, err := s.begin(context.Background(), "A")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := s.begin(context.Background(), "A")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.begin(short, "A"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a third call of A: %v, want to wait until its deadline", err)
	}
	b, err := s.begin(context.Background(), "B")
	if err != nil {
		t.Fatal(err)
	}
	s.end("B", b, 0)
	got := make(chan error, 1)
	go func() {
		sh, err := s.begin(context.Background(), "A")
		if err == nil {
			s.end("A", sh, 0)
		}
		got <- err
	}()
	s.end("A", a1, 0)
	if err := <-got; err != nil {
		t.Fatalf("A's waiting call: %v", err)
	}
	s.end("A", a2, 0)
}

// The plugin slow path: identity A's keys make the policy run to
// its deadline, from 8 callers at once, while B asks for fast keys. With
// shares A holds at most its one instance of two and is soon refused, so
// B never waits behind a slow call: B's p99 stays far below the deadline.
// Without shares (every instance to anyone, an unbounded budget) B queues
// behind A's calls; the test checks that too, so it cannot pass for want
// of contention.
func TestSlowIdentityKeepsToItsShare(t *testing.T) {
	const deadline = 150 * time.Millisecond
	run := func(cfg Config, calls int) (bP99 time.Duration, aRefused int64) {
		cfg.MaxInstances, cfg.CallTimeout = 2, deadline
		p := load(t, "loop", cfg)
		wantAllows(t, p, "fine") // warm
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var refused atomic.Int64
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, err := p.ValidateGrant(ctx, Grant{Key: "loop", Owner: "o", Identity: "A", LeaseMS: 1000})
					if errors.Is(err, ErrShareSpent) {
						refused.Add(1)
						select { // a refused caller retries, not spins
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond):
						}
					}
				}
			}()
		}
		call := func(i int) time.Duration {
			start := time.Now()
			v, err := p.ValidateGrant(ctx, Grant{Key: fmt.Sprintf("fine/%d", i), Owner: "o", Identity: "B", LeaseMS: 1000})
			if err != nil || !v.Allow {
				t.Fatalf("B's call %d: %+v %v", i, v, err)
			}
			return time.Since(start)
		}
		for i := range 10 { // the pool's second instance starts on one of B's calls
			call(i)
		}
		lat := make([]time.Duration, 0, calls)
		for i := range calls {
			lat = append(lat, call(i))
			time.Sleep(5 * time.Millisecond) // B's pace: a steady tenant, well inside its share
		}
		close(stop)
		wg.Wait()
		slices.Sort(lat)
		return lat[len(lat)*99/100], refused.Load()
	}
	// A loaded machine can starve B of CPU for a moment whatever the
	// shares do; without them B queues behind A in every round.
	for round := 1; ; round++ {
		// B's 200 calls come in over at least a second: even at 1.5 ms of
		// instance time each (a loaded machine, the race detector) they
		// stay inside 300 ms a second, while A's, each running to the
		// deadline, spend it in two calls.
		shared, refused := run(Config{IdentityTime: 300 * time.Millisecond}, 200)
		t.Logf("round %d with shares: B's p99 %v, %d of A's calls refused", round, shared, refused)
		if refused == 0 {
			t.Fatal("none of A's calls was refused")
		}
		if shared <= deadline/2 {
			break
		}
		if round == 3 {
			t.Fatalf("with shares B's p99 is %v in every round, want below half the deadline %v", shared, deadline)
		}
	}
	// Fewer calls: each waits for one of A's.
	unshared, _ := run(Config{IdentityCalls: 2, IdentityTime: time.Hour}, 20)
	t.Logf("without shares: B's p99 %v", unshared)
	if unshared < deadline/2 {
		t.Fatalf("without shares B's p99 is %v: the test makes no contention", unshared)
	}
}
