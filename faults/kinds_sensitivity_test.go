package faults

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// TestKindsCheckersCatchBrokenHistories proves the semaphore and
// read/write checkers are not vacuous on a history a real node produced:
// a scripted run on one in-process node (a semaphore of 2 filled, a third
// try refused, a slot passed on; two shared holders, an exclusive waiter
// queued behind them and a shared waiter queued behind it) passes every
// checker, and each broken copy of it is refused by the checkers named:
// N+1 holders of the semaphore, a shared holder beside an exclusive one,
// a falling token, a later waiter granted first.
func TestKindsCheckersCatchBrokenHistories(t *testing.T) {
	ks := newKindsScenario(t, 2)
	ws := ks.ws
	const lease, wait = 5 * time.Second, 4 * time.Second

	// Semaphore of 2.
	a1 := ks.hold(t, 0, ks.sem, false)
	a2 := ks.hold(t, 1, ks.sem, false)
	if l := ws[2].acquireAs(ks.sem, lease, 0, false); l != nil {
		t.Fatalf("a third holder of a semaphore of 2: token %d", l.Token)
	}
	ks.wantHolders(t, ks.sem, a1.Token, a2.Token)
	ks.drop(0, a1)
	a3 := ks.hold(t, 2, ks.sem, false)
	ks.wantHolders(t, ks.sem, a2.Token, a3.Token)
	ks.drop(1, a2)
	ks.drop(2, a3)

	// Read/write lock: two shared holders, an exclusive try refused, an
	// exclusive waiter, then a shared waiter behind it (FIFO across
	// modes: not granted beside the shared holders).
	s1 := ks.hold(t, 0, ks.rw, true)
	s2 := ks.hold(t, 1, ks.rw, true)
	ks.wantHolders(t, ks.rw, s1.Token, s2.Token)
	if l := ws[2].acquireAs(ks.rw, lease, 0, false); l != nil {
		t.Fatalf("an exclusive holder beside two shared ones: token %d", l.Token)
	}
	exclusive, shared := make(chan *sdk.Lock, 1), make(chan *sdk.Lock, 1)
	go func() { exclusive <- ws[2].acquireAs(ks.rw, lease, wait, false) }()
	// The FIFO check judges requests sent fifoArrival apart: space them
	// (a fixed interval, not a wait for a condition).
	time.Sleep(fifoArrival + 100*time.Millisecond)
	go func() { shared <- ws[3].acquireAs(ks.rw, lease, wait, true) }()
	time.Sleep(fifoArrival + 100*time.Millisecond)
	ks.wantHolders(t, ks.rw, s1.Token, s2.Token)
	ks.drop(0, s1)
	ks.drop(1, s2)
	e := receive(t, exclusive, "the exclusive waiter")
	ks.use(t, 2, e)
	ks.wantHolders(t, ks.rw, e.Token)
	ks.drop(2, e)
	s4 := receive(t, shared, "the shared waiter")
	ks.use(t, 3, s4)
	ks.drop(3, s4)
	ks.wantHolders(t, ks.rw)

	ops, writes, _, _ := ks.h.snapshot(-1)
	res := Check(0, ops, writes, nil, jumpCheckOptions)
	for _, v := range res.Violations {
		t.Log(v.String())
	}
	if len(res.Violations) > 0 || res.FIFOPairs == 0 {
		t.Fatalf("the real history: %d violations, %d FIFO pairs judged; want none and some", len(res.Violations), res.FIFOPairs)
	}
	third := -1 // the refused try of the semaphore
	for i, o := range ops {
		if o.Kind == OpAcquire && o.Key == ks.sem && o.Result == OutHeld {
			third = i
		}
	}
	cases := []struct {
		name   string
		want   string
		mutate func(ops []Op, writes []Write)
	}{
		{"N+1 holders: the third try of the semaphore granted", "kinds-exclusion,linearizability", func(ops []Op, _ []Write) {
			o := &ops[third]
			o.Result, o.Token, o.Granted = OutOK, e.Token+s4.Token+100, o.Lease
			o.Deadline = o.Call + o.Lease
		}},
		{"a shared holder beside an exclusive one", "kinds-exclusion,linearizability", func(ops []Op, _ []Write) {
			for i := range ops {
				if ops[i].Kind == OpAcquire && ops[i].Token == s2.Token {
					ops[i].Shared = false
				}
			}
		}},
		{"a falling token: the semaphore's second grant above its third", "tokens,linearizability", func(ops []Op, writes []Write) {
			swapTokens(ops, writes, ks.sem, a2.Token, a3.Token)
		}},
		{"FIFO: the later shared waiter granted before the exclusive one", "fifo,linearizability", func(ops []Op, writes []Write) {
			swapTokens(ops, writes, ks.rw, e.Token, s4.Token)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bops, bwrites := slices.Clone(ops), slices.Clone(writes)
			for i := range bops {
				bops[i].Holders = slices.Clone(bops[i].Holders)
			}
			c.mutate(bops, bwrites)
			got := checkers(Check(0, bops, bwrites, nil, jumpCheckOptions))
			t.Logf("checkers fired: %s", got)
			for _, w := range strings.Split(c.want, ",") {
				if !strings.Contains(got, w) {
					t.Errorf("checker %s did not fire (got %q)", w, got)
				}
			}
		})
	}
}

// TestKindsResourceRefusesBeyondTheKey: the guarded resource of a
// multi-holder key refuses a use that would make more users than it
// believes the key admits. Two real holders of a semaphore of 2 are
// refused by a resource that takes the key for a semaphore of 1, or for
// a read/write lock (both holds exclusive), and kinds-resource reports
// the refusal of a holder valid by its deadline.
func TestKindsResourceRefusesBeyondTheKey(t *testing.T) {
	ks := newKindsScenario(t, 2)
	a1 := ks.hold(t, 0, ks.sem, false)
	a2 := ks.hold(t, 1, ks.sem, false)
	for _, spec := range []keySpec{{Lock: LockSemaphore, Limit: 1}, {Lock: LockRW}} {
		h := NewHistory()
		tight := newResource(h, map[string]keySpec{ks.sem: spec})
		if _, acc := tight.write(0, a1); !acc {
			t.Fatalf("%v: the first user refused", spec)
		}
		if _, acc := tight.write(1, a2); acc {
			t.Fatalf("%v: a second user accepted", spec)
		}
		tight.leave(a1)
		if _, acc := tight.write(1, a2); !acc {
			t.Fatalf("%v: the second user refused after the first left", spec)
		}
	}
	ks.drop(0, a1)
	ks.drop(1, a2)
	// The same refusal recorded in the run's history: reported.
	ops, writes, _, _ := ks.h.snapshot(-1)
	writes = append(writes, Write{Client: 1, Key: ks.sem, Token: a2.Token, At: writes[len(writes)-1].At, Highest: a1.Token})
	if got := checkers(Check(0, ops, writes, nil, jumpCheckOptions)); got != "kinds-resource" {
		t.Fatalf("checkers %q, want kinds-resource alone", got)
	}
}

// kindsScenario is one in-process node with four harness workers sharing
// a history and a resource, on a semaphore key and a read/write key.
type kindsScenario struct {
	h       *History
	res     *resource
	ws      []*worker
	sem, rw string
}

func newKindsScenario(t *testing.T, limit int) *kindsScenario {
	t.Helper()
	c, err := startInProcess(t, 1, testkit.QuietLogger(), 20, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if !waitLeader(c, 10*time.Second) {
		t.Fatal("single node did not lead")
	}
	keys, kinds := kindKeys("sensitivity", limit)
	ks := &kindsScenario{h: NewHistory(), sem: keys[0], rw: keys[1]}
	ks.res = newResource(ks.h, kinds)
	wl := &workload{h: ks.h, res: ks.res, keys: keys, kinds: kinds, opTimeout: 2 * time.Second}
	for i := 0; i < 4; i++ {
		cl, err := connectClient(c.clientURLs())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		ks.ws = append(ks.ws, &worker{id: i, cl: cl, w: wl})
	}
	if err := waitKinds(ks.ws[0].cl, "sensitivity", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return ks
}

// hold acquires key for worker i (a try) and uses the resource.
func (ks *kindsScenario) hold(t *testing.T, i int, key string, shared bool) *sdk.Lock {
	t.Helper()
	l := ks.ws[i].acquireAs(key, 5*time.Second, 0, shared)
	if l == nil {
		t.Fatalf("worker %d: acquire of %s (shared %v) refused", i, key, shared)
	}
	ks.use(t, i, l)
	return l
}

func (ks *kindsScenario) use(t *testing.T, i int, l *sdk.Lock) {
	t.Helper()
	if _, acc := ks.res.write(i, l); !acc {
		t.Fatalf("worker %d: use of %s by token %d refused", i, l.Key, l.Token)
	}
}

// drop leaves the resource and releases l.
func (ks *kindsScenario) drop(i int, l *sdk.Lock) {
	ks.res.leave(l)
	ks.ws[i].release(l.Key, l.Token)
}

// wantHolders records a get of key and checks it shows exactly tokens.
func (ks *kindsScenario) wantHolders(t *testing.T, key string, tokens ...uint64) {
	t.Helper()
	ks.ws[3].get(key)
	ops, _, _, _ := ks.h.snapshot(-1)
	g := ops[len(ops)-1]
	if g.Result != OutOK || !slices.Equal(shownHolders(g), tokens) {
		t.Fatalf("get of %s: %s, want holders %v", key, g, tokens)
	}
}

func receive(t *testing.T, ch chan *sdk.Lock, what string) *sdk.Lock {
	t.Helper()
	select {
	case l := <-ch:
		if l == nil {
			t.Fatalf("%s was not granted", what)
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer within 10s", what)
	}
	return nil
}

// swapTokens exchanges tokens a and b of key in every operation and
// write: the same history with the two grants' order reversed.
func swapTokens(ops []Op, writes []Write, key string, a, b uint64) {
	swap := func(t uint64) uint64 {
		switch t {
		case a:
			return b
		case b:
			return a
		}
		return t
	}
	for i := range ops {
		if ops[i].Key != key {
			continue
		}
		ops[i].Token = swap(ops[i].Token)
		for j, h := range ops[i].Holders {
			ops[i].Holders[j] = swap(h)
		}
		slices.Sort(ops[i].Holders)
	}
	for i := range writes {
		if writes[i].Key == key {
			writes[i].Token, writes[i].Highest = swap(writes[i].Token), swap(writes[i].Highest)
		}
	}
}
