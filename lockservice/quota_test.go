package lockservice

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// fakeNode applies every proposal at once to an in-memory machine and
// tells the service, as the raft loop would (before Propose returns).
type fakeNode struct {
	mu        sync.Mutex
	m         *core.Machine
	index     uint64
	obs       raftstore.Observer
	proposals atomic.Int64
	// readIndex, if set, is what ReadIndex does (nil: succeed).
	readIndex   func() error
	readIndexes atomic.Int64
	// beforeView, if set, runs at the start of every View, outside mu:
	// tests interleave applied commands with a reader's steps there.
	beforeView func()
	// afterView, if set, runs at the end of every View, outside mu:
	// tests change the state between a reader's View and its next step.
	afterView func()
	// beforePropose, if set, runs at the start of every Propose, outside
	// mu: tests apply a racing command before cmd there.
	beforePropose func(cmd core.Command)
}

func (f *fakeNode) ID() uint64     { return 1 }
func (f *fakeNode) Leader() uint64 { return 1 }
func (f *fakeNode) Propose(ctx context.Context, cmd core.Command) (raftstore.Applied, error) {
	if err := cmd.Validate(); err != nil {
		return raftstore.Applied{}, err
	}
	if f.beforePropose != nil {
		f.beforePropose(cmd)
	}
	f.proposals.Add(1)
	f.mu.Lock()
	f.index++
	var ending []core.Lock // the locks a session command may end, as raftstore names them
	if cmd.Kind == core.KindCloseSession || cmd.Kind == core.KindExpireSession {
		ending = f.m.SessionLocks(cmd.SessionID)
	}
	a := raftstore.Applied{Index: f.index, Term: 1, Command: cmd, Result: f.m.Apply(cmd)}
	if a.Result.Count > 0 {
		for _, l := range ending {
			a.Keys = append(a.Keys, l.Key)
		}
	}
	if a.Result.Kind == core.ResultGranted || a.Result.Kind == core.ResultRenewed {
		l, _ := f.m.Holder(cmd.Key, a.Result.Token)
		a.LeaseMS = l.LeaseMS
	}
	f.mu.Unlock()
	f.obs.OnApplied(a)
	return a, nil
}
func (f *fakeNode) ReadIndex(ctx context.Context) error {
	f.readIndexes.Add(1)
	if f.readIndex != nil {
		return f.readIndex()
	}
	return nil
}
func (f *fakeNode) ReadIndexWithin(ctx context.Context, _ time.Duration) error {
	return f.ReadIndex(ctx)
}
func (f *fakeNode) View(fn func(m *core.Machine)) {
	if f.beforeView != nil {
		f.beforeView()
	}
	f.mu.Lock()
	fn(f.m)
	f.mu.Unlock()
	if f.afterView != nil {
		f.afterView()
	}
}
func (f *fakeNode) ScanLocks(prefix, after string, afterToken uint64, limit int) (raftstore.LockPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := raftstore.LockPage{Applied: f.index}
	locks := f.m.Locks()
	for _, kh := range f.m.MultiKeys() { // holders too, as raftstore lists them
		locks = append(locks, kh.Holders...)
	}
	sort.SliceStable(locks, func(i, j int) bool { return locks[i].Key < locks[j].Key }) // tokens stay in order
	for _, l := range locks {
		if !strings.HasPrefix(l.Key, prefix) || l.Key < after || l.Key == after && (afterToken == 0 || l.Token <= afterToken) {
			continue
		}
		if len(p.Locks) == limit {
			p.More = true
			break
		}
		p.Locks = append(p.Locks, l)
	}
	return p, nil
}
func (f *fakeNode) ClusterVersion() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.ClusterVersion()
}

// newLeader returns a service that leads over a fake node at cluster
// version 2 (so grants record identities).
func newLeader(t *testing.T, cfg Config) (*Service, *fakeNode) {
	t.Helper()
	cfg.Logger = testkit.QuietLogger()
	s := New(cfg)
	f := &fakeNode{m: core.NewMachine(), obs: s}
	f.m.Apply(core.SetClusterVersion(2))
	s.Attach(f)
	s.OnLeaderReady(1)
	t.Cleanup(s.Close)
	return s, f
}

func acquire(s *Service, identity, key string, wait time.Duration) (Grant, error) {
	ctx := WithIdentity(context.Background(), identity)
	return s.Acquire(ctx, AcquireParams{Key: key, Lease: time.Minute, Wait: wait, Timeout: wait + 5*time.Second})
}

func wantLimit(t *testing.T, err error, resource string) {
	t.Helper()
	var le *LimitError
	if !errors.Is(err, ErrResourceExhausted) || !errors.As(err, &le) || le.Resource != resource {
		t.Fatalf("err = %v, want resource_exhausted (%s)", err, resource)
	}
}

// At the total quota a Grant is refused with resource_exhausted and
// nothing is proposed or changed; a release still works and makes room.
func TestQuotaTotalLocks(t *testing.T) {
	s, f := newLeader(t, Config{Limits: Limits{MaxLocks: 3}})
	var tokens []uint64
	for i := 0; i < 3; i++ {
		g, err := acquire(s, "", fmt.Sprintf("k%d", i), 0)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		tokens = append(tokens, g.Token)
	}
	before, digest := f.proposals.Load(), f.m.Digest()
	_, err := acquire(s, "", "k3", 0)
	wantLimit(t, err, ResourceLocks)
	// A waiting acquire on a free key is refused the same way.
	_, err = acquire(s, "", "k4", time.Second)
	wantLimit(t, err, ResourceLocks)
	if f.proposals.Load() != before || f.m.Digest() != digest {
		t.Fatal("a refused grant proposed or changed something")
	}
	if err := s.Release(context.Background(), "k0", tokens[0]); err != nil {
		t.Fatalf("release at quota: %v", err)
	}
	if _, err := acquire(s, "", "k3", 0); err != nil {
		t.Fatalf("acquire after a release made room: %v", err)
	}
}

// Per identity: each identity has its own quota, anonymous requests share
// the "" one, the lock records the identity, and a new leader rebuilds the
// counts from the applied table.
func TestQuotaPerIdentity(t *testing.T) {
	s, f := newLeader(t, Config{Limits: Limits{MaxLocks: 100, MaxLocksPerIdentity: 2}})
	for i := 0; i < 2; i++ {
		if _, err := acquire(s, "A", fmt.Sprintf("a%d", i), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := acquire(s, "", fmt.Sprintf("anon%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	_, err := acquire(s, "A", "a2", 0)
	wantLimit(t, err, ResourceIdentityLocks)
	_, err = acquire(s, "", "anon2", 0)
	wantLimit(t, err, ResourceIdentityLocks)
	if _, err := acquire(s, "B", "b0", 0); err != nil {
		t.Fatalf("another identity is refused: %v", err)
	}
	var l core.Lock
	f.View(func(m *core.Machine) { l, _ = m.Get("a0") })
	if l.Identity != "A" {
		t.Fatalf("lock a0 records identity %q, want A", l.Identity)
	}
	// Leadership moves away and back: counts come from the table.
	s.OnLeadershipLost()
	s.OnLeaderReady(2)
	_, err = acquire(s, "A", "a2", 0)
	wantLimit(t, err, ResourceIdentityLocks)
	if err := s.Release(WithIdentity(context.Background(), "A"), "a0", l.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(s, "A", "a2", 0); err != nil {
		t.Fatalf("identity A after releasing one: %v", err)
	}
}

// Before cluster version 2 no identity goes into a Grant (no replica
// could apply it), and every lock counts under "".
func TestQuotaBeforeClusterVersion2(t *testing.T) {
	cfg := Config{Logger: testkit.QuietLogger(), Limits: Limits{MaxLocksPerIdentity: 1}}
	s := New(cfg)
	f := &fakeNode{m: core.NewMachine(), obs: s}
	s.Attach(f)
	s.OnLeaderReady(1)
	defer s.Close()
	if _, err := acquire(s, "A", "k0", 0); err != nil {
		t.Fatal(err)
	}
	var l core.Lock
	f.View(func(m *core.Machine) { l, _ = m.Get("k0") })
	if l.Identity != "" || l.Token == 0 {
		t.Fatalf("lock %+v, want granted without identity", l)
	}
	s.OnLeadershipLost()
	s.OnLeaderReady(2)
	_, err := acquire(s, "", "k1", 0)
	wantLimit(t, err, ResourceIdentityLocks)
}

// Waiters are bounded per key and per node, with resource_exhausted at
// once instead of queueing; the admitted waiters are served in order.
func TestWaiterBounds(t *testing.T) {
	s, _ := newLeader(t, Config{Limits: Limits{MaxWaitersPerKey: 2, MaxWaiters: 3}})
	g, err := acquire(s, "holder", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   Grant
		err error
	}
	results := make(chan result, 4)
	wait := func(identity, key string) {
		go func() {
			g, err := acquire(s, identity, key, 10*time.Second)
			results <- result{g, err}
		}()
	}
	waiters := func() int {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters
	}
	wait("A", "k")
	testkit.Eventually(t, 5*time.Second, "first waiter queued", func() bool { return waiters() == 1 })
	wait("B", "k")
	testkit.Eventually(t, 5*time.Second, "second waiter queued", func() bool { return waiters() == 2 })
	_, err = acquire(s, "C", "k", 10*time.Second)
	wantLimit(t, err, ResourceKeyWaiters)
	g2, err := acquire(s, "C", "k2", 0)
	if err != nil {
		t.Fatal(err)
	}
	wait("D", "k2")
	testkit.Eventually(t, 5*time.Second, "third waiter queued", func() bool { return waiters() == 3 })
	_, err = acquire(s, "E", "k2", 10*time.Second)
	wantLimit(t, err, ResourceWaiters)

	if err := s.Release(WithIdentity(context.Background(), "holder"), "k", g.Token); err != nil {
		t.Fatal(err)
	}
	r := <-results
	if r.err != nil || r.g.Key != "k" {
		t.Fatalf("first waiter: %+v %v", r.g, r.err)
	}
	if err := s.Release(WithIdentity(context.Background(), "A"), "k", r.g.Token); err != nil {
		t.Fatal(err)
	}
	r = <-results
	if r.err != nil || r.g.Key != "k" {
		t.Fatalf("second waiter: %+v %v", r.g, r.err)
	}
	if err := s.Release(WithIdentity(context.Background(), "C"), "k2", g2.Token); err != nil {
		t.Fatal(err)
	}
	if r = <-results; r.err != nil || r.g.Key != "k2" {
		t.Fatalf("k2 waiter: %+v %v", r.g, r.err)
	}
}

// A waiter whose turn comes while its identity holds its quota is woken
// with resource_exhausted, and the key goes to the next waiter.
func TestWaiterRefusedAtItsTurn(t *testing.T) {
	s, _ := newLeader(t, Config{Limits: Limits{MaxLocksPerIdentity: 1}})
	g, err := acquire(s, "B", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(s, "A", "other", 0); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() { _, err := acquire(s, "A", "k", 10*time.Second); errA <- err }()
	testkit.Eventually(t, 5*time.Second, "A queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 1
	})
	gotC := make(chan Grant, 1)
	go func() { g, _ := acquire(s, "C", "k", 10*time.Second); gotC <- g }()
	testkit.Eventually(t, 5*time.Second, "C queued", func() bool {
		s.lead.mu.Lock()
		defer s.lead.mu.Unlock()
		return s.lead.waiters == 2
	})
	if err := s.Release(WithIdentity(context.Background(), "B"), "k", g.Token); err != nil {
		t.Fatal(err)
	}
	wantLimit(t, <-errA, ResourceIdentityLocks)
	if g := <-gotC; g.Key != "k" || g.Token == 0 {
		t.Fatalf("the next waiter did not get the key: %+v", g)
	}
}

// While the storage alarm is on, Grants are refused (direct and handed to
// waiters) and releases and expiries still apply.
func TestStorageAlarmRefusesOnlyGrants(t *testing.T) {
	var low atomic.Bool
	s, f := newLeader(t, Config{StorageAlarm: func() error {
		if low.Load() {
			return errors.New("data directory has 10 MiB free, the alarm is at 256 MiB")
		}
		return nil
	}})
	g, err := acquire(s, "", "k", 0)
	if err != nil {
		t.Fatal(err)
	}
	short, err := s.Acquire(context.Background(), AcquireParams{Key: "short", Lease: core.MinLease, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	low.Store(true)
	_, err = acquire(s, "", "k2", 0)
	wantLimit(t, err, ResourceStorage)
	if err := s.Release(context.Background(), "k", g.Token); err != nil {
		t.Fatalf("release on a low disk: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, "the short lease expires on a low disk", func() bool {
		var held bool
		f.View(func(m *core.Machine) { _, held = m.Get("short") })
		return !held
	})
	_ = short
	low.Store(false)
	if _, err := acquire(s, "", "k2", 0); err != nil {
		t.Fatalf("grant after the alarm cleared: %v", err)
	}
}
