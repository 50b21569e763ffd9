package raftstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// walSyncGate is a Pebble errorfs injector that, once shut, holds every
// fsync of the store's WAL until the test lets it through, so a test can
// look at a node whose Ready is stuck in its persist.
type walSyncGate struct {
	mu     sync.Mutex
	shut   bool
	held   chan struct{} // one value for each fsync that starts waiting
	pass   chan struct{} // one value lets one waiting fsync through
	opened chan struct{} // closed: every fsync goes through
	once   sync.Once
}

func newWALSyncGate() *walSyncGate {
	return &walSyncGate{held: make(chan struct{}, 64), pass: make(chan struct{}), opened: make(chan struct{})}
}

func (g *walSyncGate) String() string { return "walSyncGate" }

func (g *walSyncGate) MaybeError(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if !shut || !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	g.held <- struct{}{}
	select {
	case <-g.pass:
	case <-g.opened:
	}
	return nil
}

func (g *walSyncGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = true
}

// open lets every fsync through, now and later.
func (g *walSyncGate) open() { g.once.Do(func() { close(g.opened) }) }

// passOne lets one waiting fsync through.
func (g *walSyncGate) passOne(t *testing.T) {
	t.Helper()
	select {
	case g.pass <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no fsync waiting at the gate")
	}
}

// waitHeld waits until an fsync is waiting at the gate.
func (g *walSyncGate) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no fsync reached the gate")
	}
}

// openGatedStore opens a store that fsyncs (unlike openTestStore) through g.
func openGatedStore(t *testing.T, g *walSyncGate) *Store {
	t.Helper()
	st, err := Open(t.TempDir(), StoreOptions{Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1},
		FS: errorfs.Wrap(vfs.Default, g)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// viewWithin runs View on n and returns whether it had the key key, or
// ok=false when View did not return within d.
func viewWithin(n *Node, key string, d time.Duration) (held, ok bool, later <-chan bool) {
	c := make(chan bool, 1)
	go n.View(func(m *core.Machine) {
		_, h := m.Get(key)
		c <- h
	})
	select {
	case h := <-c:
		return h, true, nil
	case <-time.After(d):
		return false, false, c
	}
}

type proposed struct {
	a   Applied
	err error
}

func proposeAsync(ctx context.Context, n *Node, key string) <-chan proposed {
	c := make(chan proposed, 1)
	go func() {
		a, err := n.Propose(ctx, core.Grant(key, "", 60000, 0))
		c <- proposed{a, err}
	}()
	return c
}

// startStalledSingle starts a single node with cfg on the store open makes over a
// WAL sync gate, proposes a, then b and c so that the Ready that applies b
// (durable in the log by then) and writes c's entry is held in its fsync
// by the gate, and returns the node, the gate and the proposals of b and
// c, not answered yet. The gate opens before the node stops.
func startStalledSingle(t *testing.T, cfg Config, open func(g *walSyncGate) *Store) (n *Node, g *walSyncGate, b, c <-chan proposed) {
	t.Helper()
	g = newWALSyncGate()
	n = startSingle(t, open(g), cfg)
	t.Cleanup(g.open) // before the node stops (cleanups run last first)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := n.Propose(ctx, core.Grant("a", "", 60000, 0)); err != nil {
		t.Fatalf("propose a: %v", err)
	}
	g.close()
	b = proposeAsync(ctx, n, "b")
	g.waitHeld(t) // the Ready that writes b's entry
	c = proposeAsync(ctx, n, "c")
	testkit.Eventually(t, 5*time.Second, "c queued behind the stuck Ready", func() bool { return len(n.propc) > 0 })
	g.passOne(t)
	g.waitHeld(t) // the Ready that applies b (durable) and writes c's entry
	return n, g, b, c
}

// shownState is what a ViewIndexed read: the state's index, the applied
// index read inside it, the digest, and whether b is held.
type shownState struct {
	index, applied uint64
	digest         [32]byte
	hasB           bool
}

// viewIndexedWithin reads shownState from n, failing t if ViewIndexed does
// not return within 5 s.
func viewIndexedWithin(t *testing.T, n *Node) shownState {
	t.Helper()
	c := make(chan shownState, 1)
	go n.ViewIndexed(func(m *core.Machine, index uint64) {
		_, hasB := m.Get("b")
		c <- shownState{index: index, applied: n.AppliedIndex(), digest: m.Digest(), hasB: hasB}
	})
	select {
	case st := <-c:
		return st
	case <-time.After(5 * time.Second):
		t.Fatal("ViewIndexed waited for the fsync of a later entry although everything it shows was durable")
		return shownState{}
	}
}

// appliedKeys records the keys of the commands an observer heard applied.
type appliedKeys struct {
	mu   sync.Mutex
	keys []string
}

func (k *appliedKeys) observer() Observer {
	return ObserverFuncs{Applied: func(a Applied) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.keys = append(k.keys, a.Command.Key)
	}}
}

func (k *appliedKeys) heard(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Contains(k.keys, key)
}

// TestViewAndReplyDoNotWaitForTheFsyncOfLaterEntries: a Ready that applies
// entries already durable in the log and writes new ones shows the applied
// state to View, tells the observers and answers the applied entries'
// proposals while its fsync is in progress (a grant's reply, its fence key
// lookup and the waiter a release frees no longer wait out an fsync of
// other requests' entries); the applied index moves only after the write,
// and the new entry is neither applied nor answered before it is durable.
func TestViewAndReplyDoNotWaitForTheFsyncOfLaterEntries(t *testing.T) {
	var heard appliedKeys
	n, g, b, c := startStalledSingle(t, Config{Observers: []Observer{heard.observer()}},
		func(g *walSyncGate) *Store { return openGatedStore(t, g) })

	held, ok, _ := viewWithin(n, "b", 5*time.Second)
	if !ok {
		t.Fatal("View waited for the fsync of a later entry although everything it shows was durable")
	}
	if !held {
		t.Fatal("View does not show b, whose entry applied")
	}
	var rb proposed
	select {
	case rb = <-b:
	case <-time.After(5 * time.Second):
		t.Fatal("b's proposal waited for the fsync of a later entry although its own entry was durable")
	}
	if rb.err != nil || rb.a.Result.Kind != core.ResultGranted {
		t.Fatalf("b: %+v", rb)
	}
	if !heard.heard("b") {
		t.Fatal("b was answered before the observers heard it applied")
	}
	if a := n.AppliedIndex(); a >= rb.a.Index {
		t.Fatalf("AppliedIndex %d while the write of the Ready that applied b (%d) is in its fsync", a, rb.a.Index)
	}
	// What the reply lets its caller expect of this node is there: the
	// summary (status, ClusterVersion) shows the state after b.
	if sum := n.Summary(); sum.Applied != rb.a.Index || sum.LastToken != rb.a.Result.Token {
		t.Fatalf("summary at %d with last token %d after b's reply (b: index %d, token %d)", sum.Applied, sum.LastToken, rb.a.Index, rb.a.Result.Token)
	}
	select {
	case r := <-c:
		t.Fatalf("c answered (%+v) while its entry's fsync was held", r)
	default:
	}
	if heard.heard("c") {
		t.Fatal("the observers heard c applied while its entry's fsync was held")
	}
	g.open()
	if r := <-c; r.err != nil || r.a.Result.Kind != core.ResultGranted {
		t.Fatalf("c: %+v", r)
	}
}

// TestViewIndexedWhileTheWriteIsInFlight: while a Ready that released
// machineMu before its write is in its fsync, View shows that Ready's state
// but the applied index is still the one before it. ViewIndexed names the
// index of the state it shows, so a reader that records "the state at index
// N" (a backup: control/snapshot.go) never labels a later state with an
// earlier index, as AppliedIndex read inside View would.
func TestViewIndexedWhileTheWriteIsInFlight(t *testing.T) {
	n, g, b, c := startStalledSingle(t, Config{}, func(g *walSyncGate) *Store { return openGatedStore(t, g) })

	shown := viewIndexedWithin(t, n)
	g.open()
	rb, rc := <-b, <-c
	if rb.err != nil || rc.err != nil {
		t.Fatalf("b: %+v, c: %+v", rb, rc)
	}
	if !shown.hasB {
		t.Fatal("the state ViewIndexed showed does not hold b, whose entry applied")
	}
	if shown.index != rb.a.Index {
		t.Fatalf("ViewIndexed named index %d for the state after b, which applied at %d", shown.index, rb.a.Index)
	}
	if shown.applied >= shown.index {
		t.Fatalf("AppliedIndex %d inside the view, want below %d: the write was in flight", shown.applied, shown.index)
	}
}

// TestStateShownBeforeItsWriteSurvivesACrash: the node crashes (only what
// was synced survives: a crashable MemFS's clone) while the Ready that
// applied b is in its fsync, after View showed b's state and b's grant was
// answered. The crash loses
// that Ready's state rows, HardState and applied index and c's entry, but
// not b's entry, which was durable before; the restarted node applies b
// again and reaches exactly the state View showed, b with the token its
// reply named (applyAndPersist's and deliverApplied's argument, end to end
// on one node).
func TestStateShownBeforeItsWriteSurvivesACrash(t *testing.T) {
	roomy := vfs.DiskUsage{AvailBytes: 1 << 40, TotalBytes: 1 << 40}
	mem := vfs.NewCrashableMem()
	mem.TestingSetDiskUsage(roomy)
	const dir = "/store"
	open := func(fs vfs.FS) *Store {
		t.Helper()
		st, err := Open(dir, StoreOptions{Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}, FS: fs})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	n, g, b, _ := startStalledSingle(t, Config{}, func(g *walSyncGate) *Store { return open(errorfs.Wrap(mem, g)) })

	shown := viewIndexedWithin(t, n)
	if !shown.hasB {
		t.Fatal("View does not show b, whose entry applied")
	}
	var rb proposed
	select {
	case rb = <-b:
	case <-time.After(5 * time.Second):
		t.Fatal("b not answered while the write of the Ready that applied it was in its fsync")
	}
	if rb.err != nil || rb.a.Index != shown.index || rb.a.Result.Kind != core.ResultGranted {
		t.Fatalf("b: %+v, want granted at %d", rb, shown.index)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{}) // exactly what was synced
	crashed.TestingSetDiskUsage(roomy)
	g.open()

	st := open(crashed)
	if a := st.AppliedIndex(); a >= shown.index {
		t.Fatalf("the crashed store has applied %d, want below %d: the crash did not hit the Ready's write", a, shown.index)
	}
	n2 := startSingle(t, st, Config{})
	testkit.Eventually(t, 10*time.Second, "the restarted node applies b again", func() bool { return n2.AppliedIndex() >= shown.index })
	var digest [32]byte
	var lockB core.Lock
	var hasB, hasC bool
	n2.View(func(m *core.Machine) {
		digest = m.Digest()
		lockB, hasB = m.Get("b")
		_, hasC = m.Get("c")
	})
	if !hasB || hasC || digest != shown.digest {
		t.Fatalf("after the crash: b held %v, c held %v, digest %x; View showed b held, digest %x", hasB, hasC, digest[:6], shown.digest[:6])
	}
	if lockB.Token != rb.a.Result.Token {
		t.Fatalf("after the crash b is held with token %d; its reply, sent before the crash, said %d", lockB.Token, rb.a.Result.Token)
	}
}

// TestViewWaitsWhenEntriesCommitInTheirOwnReady: a follower that receives
// an entry together with a commit index covering it applies the entry in
// the Ready that also writes it; View must not show that state until the
// write is durable (a crash before it would lose the entry from this
// node's log, and the state with it), nor tell its observers about x.
func TestViewWaitsWhenEntriesCommitInTheirOwnReady(t *testing.T) {
	gates := make([]*walSyncGate, 3)
	stores := make([]*Store, 3)
	heard := make([]appliedKeys, 3)
	observers := make([][]Observer, 3)
	for i := range gates {
		gates[i] = newWALSyncGate()
		stores[i] = openGatedStore(t, gates[i])
		observers[i] = []Observer{heard[i].observer()}
	}
	net := startMemClusterObserved(t, stores, observers)
	for _, g := range gates {
		t.Cleanup(g.open)
	}
	lead := net.leader(t)
	net.allApplied(t, lead.AppliedIndex(), 5*time.Second)
	var victim uint64 = 1
	if lead.ID() == 1 {
		victim = 2
	}
	f, g := net.nodes[victim-1], gates[victim-1]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// x commits on the leader and the other follower; the victim's
	// append is lost.
	net.dropAppendTo.Store(victim)
	x, err := lead.Propose(ctx, core.Grant("x", "", 60000, 0))
	if err != nil {
		t.Fatalf("propose x: %v", err)
	}
	g.close()
	net.dropAppendTo.Store(0)
	// The leader resends x on a heartbeat's answer, with its commit
	// index: the victim's Ready writes x and applies it.
	g.waitHeld(t)
	if last, err := f.cfg.Store.LastIndex(); err != nil || last >= x.Index {
		t.Fatalf("victim's durable last index %d (err %v), want below x's %d", last, err, x.Index)
	}
	if _, ok, later := viewWithin(f, "x", 300*time.Millisecond); ok {
		t.Fatal("View returned while the Ready that applied x (not durable before it) was in its fsync")
	} else {
		if heard[victim-1].heard("x") {
			t.Fatal("the victim's observers heard x applied while the Ready that wrote and applied it was in its fsync")
		}
		g.open()
		select {
		case held := <-later:
			if !held {
				t.Fatal("View after the write does not show x")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("View still waiting after the fsync completed")
		}
	}
	if f.AppliedIndex() < x.Index {
		t.Fatalf("victim applied %d after the write, want at least %d", f.AppliedIndex(), x.Index)
	}
}

func TestCommittedWereDurable(t *testing.T) {
	ents := func(idx ...uint64) []raftpb.Entry {
		var es []raftpb.Entry
		for _, i := range idx {
			es = append(es, raftpb.Entry{Index: i, Term: 1})
		}
		return es
	}
	snap := raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 1}}
	for _, tc := range []struct {
		name        string
		rd          raft.Ready
		lastDurable uint64
		want        bool
	}{
		{"nothing committed", raft.Ready{Entries: ents(7, 8)}, 6, true},
		{"committed durable, nothing new", raft.Ready{CommittedEntries: ents(5, 6)}, 6, true},
		{"committed durable, new entries after", raft.Ready{CommittedEntries: ents(5, 6), Entries: ents(7)}, 6, true},
		{"committed beyond the durable log", raft.Ready{CommittedEntries: ents(6, 7), Entries: ents(7)}, 6, false},
		{"committed and written in one Ready", raft.Ready{CommittedEntries: ents(7), Entries: ents(7, 8)}, 6, false},
		{"committed entry rewritten", raft.Ready{CommittedEntries: ents(6), Entries: ents(6, 7)}, 8, false},
		{"a snapshot", raft.Ready{Snapshot: snap}, 6, false},
		{"a snapshot and entries", raft.Ready{Snapshot: snap, CommittedEntries: ents(6)}, 6, false},
	} {
		if got := committedWereDurable(tc.rd, tc.lastDurable); got != tc.want {
			t.Errorf("%s: committedWereDurable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestViewsReadWhileTheLoopPersists: readers walk the whole machine
// (ViewIndexed: digest, snapshot encoding, every lock) while grants and
// releases stream through a node that fsyncs, so most Readies release
// machineMu before their write and the loop reads the machine (the
// summary, a background snapshot's count) alongside the readers. Under
// -race this catches a read path that writes (a cache, lazy decoding);
// always, the index ViewIndexed names never goes back and is never below
// the applied index or the published summary read before it.
func TestViewsReadWhileTheLoopPersists(t *testing.T) {
	st, err := Open(t.TempDir(), StoreOptions{Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	n := startSingle(t, st, Config{SnapshotEntries: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	stop := make(chan struct{})
	errc := make(chan error, 1)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	var readers sync.WaitGroup
	var ahead atomic.Int64 // views of a state whose write was in flight
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				applied, summary := n.AppliedIndex(), n.Summary().Applied
				n.ViewIndexed(func(m *core.Machine, index uint64) {
					if index < last || index < applied || index < summary {
						report(fmt.Errorf("ViewIndexed index %d; before it: previous view %d, applied %d, summary %d", index, last, applied, summary))
					}
					last = index
					if index > n.AppliedIndex() {
						ahead.Add(1)
					}
					_ = m.Digest()
					_ = m.Snapshot()
					m.ForEachLock(func(core.Lock) {})
				})
			}
		}()
	}
	const writers, rounds = 4, 24
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := fmt.Sprintf("w%d/%d", w, i%8)
				a, err := n.Propose(ctx, core.Grant(key, "", 60000, 0))
				if err == nil && a.Result.Kind == core.ResultGranted {
					_, err = n.Propose(ctx, core.Release(key, a.Result.Token))
				}
				if err != nil {
					report(fmt.Errorf("writer %d round %d: %w", w, i, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	t.Logf("%d views showed a state whose write was in flight", ahead.Load())
}
