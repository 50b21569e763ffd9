package raftstore

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// kindsWorkload is sessionWorkload at cluster version 5 plus semaphores
// and read/write locks: semaphore slots (limit 2 or 3, some with a
// lock-delay, some in sessions, some with request ids), shared and
// exclusive holds, a Grant of the wrong kind now and then, releases,
// renewals and expiries of holders (mostly of a current one), and clears
// of delayed slots. It counts what the machine did.
type kindsWorkload struct {
	sessionWorkload
	slotsExpired, slotsCleared, sharedGranted int
}

func (w *kindsWorkload) next(m *core.Machine) core.Command {
	if w.r.IntN(100) >= 55 {
		return w.sessionWorkload.next(m)
	}
	key := fmt.Sprintf("s%d", w.r.IntN(3))
	if w.r.IntN(2) == 0 {
		key = fmt.Sprintf("r%d", w.r.IntN(3))
	}
	kh, multi := m.KeyHolders(key)
	holder := func() (core.Lock, bool) {
		if !multi || len(kh.Holders) == 0 {
			return core.Lock{}, false
		}
		return kh.Holders[w.r.IntN(len(kh.Holders))], true
	}
	w.now += w.r.Uint64N(1000)
	switch p := w.r.IntN(100); {
	case p < 40:
		var c core.Command
		if key[0] == 's' {
			c = core.Grant(key, "o", 1000, w.now).WithKind(uint32(2+w.r.IntN(2)), core.ModeExclusive)
		} else {
			c = core.Grant(key, "o", 1000, w.now).WithKind(0, core.Mode(w.r.IntN(2)))
			if c.Mode == core.ModeShared && (!multi || len(kh.Holders) > 0 || len(kh.Delays) == 0) {
				w.sharedGranted++
			}
		}
		switch w.r.IntN(4) {
		case 0:
			c = c.WithLockDelay(700)
		case 1:
			ss := m.SessionState()
			if len(ss.Sessions) > 0 {
				c = c.InSession(ss.Sessions[w.r.IntN(len(ss.Sessions))].ID)
			}
		case 2:
			c = c.WithRequest(fmt.Sprintf("id-%d", w.r.IntN(2)), fmt.Sprintf("h-%d", w.r.IntN(5)))
		}
		return c
	case p < 60:
		if l, ok := holder(); ok {
			return core.Release(key, l.Token)
		}
	case p < 78:
		if l, ok := holder(); ok {
			if l.LockDelayMS > 0 {
				w.slotsExpired++
			}
			return core.Expire(key, l.Token)
		}
	case p < 85:
		if l, ok := holder(); ok {
			return core.Renew(key, l.Token, 2000)
		}
	default:
		if multi && len(kh.Delays) > 0 {
			w.slotsCleared++
			return core.ClearDelay(key, kh.Delays[w.r.IntN(len(kh.Delays))].Seq)
		}
	}
	return w.sessionWorkload.next(m)
}

// v5Ref is a cluster version 5 machine (index 1 applied the version) and
// the store it was written to.
func v5Ref(t testing.TB, s *Store) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 1, core.SetClusterVersion(5)), HardState: raftpb.HardState{Term: 1, Commit: 1},
		State: applyRun(m, 1, core.SetClusterVersion(5))})
	return m
}

// checkHolderRows checks that the holder rows of s are exactly m's
// multi-holder keys.
func checkHolderRows(t *testing.T, step string, s *Store, m *core.Machine) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var got []core.KeyHolders
	if err := forEachHolderRow(s.view, func(kh core.KeyHolders) error {
		got = append(got, kh)
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	if want := m.MultiKeys(); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: holder rows %+v, machine %+v", step, got, want)
	}
}

// The holder rows follow the machine through runs of commands, reopen
// after reopen, and a snapshot built from the rows is the machine's.
func TestHolderRowsPersist(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ref := v5Ref(t, s)
	w := &kindsWorkload{sessionWorkload: sessionWorkload{requestWorkload: requestWorkload{r: rand.New(rand.NewPCG(9, 10))}}}
	index := uint64(1)
	maxHolders, maxSlots := 0, 0
	for run := 0; run < 80; run++ {
		var cmds []core.Command
		scratch := core.NewMachine()
		if err := scratch.Restore(ref.Snapshot()); err != nil {
			t.Fatal(err)
		}
		for range 1 + w.r.IntN(12) {
			c := w.next(scratch)
			scratch.Apply(c)
			cmds = append(cmds, c)
		}
		first := index + 1
		index += uint64(len(cmds))
		mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, first, cmds...), HardState: raftpb.HardState{Term: 1, Commit: index},
			State: applyRun(ref, index, cmds...)})
		step := fmt.Sprintf("run %d", run)
		checkMachine(t, step, s, index, ref, raftpb.ConfState{})
		checkSessionRows(t, step, s, ref)
		checkHolderRows(t, step, s, ref)
		maxHolders, maxSlots = max(maxHolders, ref.HolderCount()), max(maxSlots, ref.SlotDelayCount())
		if run%10 == 9 {
			s = reopen(t, s, dir)
			checkMachine(t, step+" reopened", s, index, ref, raftpb.ConfState{})
		}
		if run%8 == 7 {
			v, err := s.viewState()
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodeSnapshot(v, ref.Len()-ref.HolderCount(), 0, nil)
			_ = v.snap.Close()
			if err != nil || !bytes.Equal(got, ref.Snapshot()) {
				t.Fatalf("%s: the snapshot from the store rows differs from the machine's (%v)", step, err)
			}
		}
	}
	if maxHolders < 3 || maxSlots < 1 || w.slotsExpired == 0 || w.slotsCleared == 0 || w.sharedGranted == 0 {
		t.Fatalf("the workload had at most %d holders, %d delayed slots, %d slot expiries, %d clears, %d shared grants: it did not test",
			maxHolders, maxSlots, w.slotsExpired, w.slotsCleared, w.sharedGranted)
	}
}

// Installing a snapshot replaces every holder row; one without
// multi-holder keys removes them all.
func TestHolderRowsSnapshotInstall(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	local := v5Ref(t, s)
	run := []core.Command{
		core.Grant("a", "", 1000, 1).WithKind(3, core.ModeExclusive),
		core.Grant("a", "", 1000, 1).WithKind(3, core.ModeExclusive),
		core.Grant("b", "", 1000, 1).WithKind(0, core.ModeShared),
	}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 4}, State: applyRun(local, 4, run...)})
	checkHolderRows(t, "local", s, local)

	leader := core.NewMachine()
	applyRun(leader, 30, core.SetClusterVersion(5),
		core.Grant("a", "", 1000, 1), // a mutex now
		core.Grant("c", "", 1000, 1).WithKind(2, core.ModeExclusive).WithLockDelay(10),
		core.Grant("c", "", 1000, 1).WithKind(2, core.ModeExclusive),
		core.Expire("c", 2),
		core.Grant("d", "", 1000, 1).WithKind(0, core.ModeShared))
	if leader.HolderCount() != 2 || leader.SlotDelayCount() != 1 {
		t.Fatalf("leader: %+v", leader.MultiKeys())
	}
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap := raftpb.Snapshot{Data: leader.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 30, Term: 2}}
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 2, Commit: 30}})
	checkMachine(t, "installed", s, 30, leader, cs)
	checkHolderRows(t, "installed", s, leader)

	after := []core.Command{core.ClearDelay("c", 1), core.Release("d", 4)}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(2, 31, after...), HardState: raftpb.HardState{Term: 2, Commit: 32},
		State: applyRun(leader, 32, after...)})
	s = reopen(t, s, dir)
	checkMachine(t, "after", s, 32, leader, cs)
	checkHolderRows(t, "after", s, leader)
	if len(leader.MultiKeys()) != 1 {
		t.Fatalf("after: %+v", leader.MultiKeys())
	}

	v4 := core.NewMachine()
	v4run := []core.Command{core.SetClusterVersion(4)}
	for i := range 7 {
		v4run = append(v4run, core.Grant(fmt.Sprintf("q%d", i), "", 1000, 1))
	}
	applyRun(v4, 40, v4run...)
	snap = raftpb.Snapshot{Data: v4.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 40, Term: 3}}
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 3, Commit: 40}})
	checkMachine(t, "v4 installed", s, 40, v4, cs)
	checkHolderRows(t, "v4 installed", s, v4)
}

// Write refuses holder rows LoadMachine would refuse, and a key twice;
// LoadMachine refuses a holder row under another key or before cluster
// version 5.
func TestHolderRowsRejects(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	ref := v5Ref(t, s)
	good := core.KeyHolders{Key: "a", Limit: 2, Holders: []core.Lock{{Key: "a", Token: 1, LeaseMS: 1000, Limit: 2}}}
	for _, tc := range []struct {
		name string
		sc   StateChange
	}{
		{"token above last", StateChange{Index: 2, LastToken: 0, PutHolders: []core.KeyHolders{good}}},
		{"empty key group", StateChange{Index: 2, LastToken: 1, PutHolders: []core.KeyHolders{{Key: "a", Limit: 2}}}},
		{"a mutex as a holder row", StateChange{Index: 2, LastToken: 1, PutHolders: []core.KeyHolders{{Key: "a",
			Holders: []core.Lock{{Key: "a", Token: 1, LeaseMS: 1000}}}}}},
		{"key twice", StateChange{Index: 2, LastToken: 1, PutHolders: []core.KeyHolders{good}, DeleteHolders: []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tc.sc
			if err := s.Write(ReadyWrite{State: &sc}); err == nil {
				t.Fatal("Write accepted it")
			}
			checkMachine(t, tc.name, s, 1, ref, raftpb.ConfState{})
		})
	}
}

// A node's semaphore and read/write holders, with a delayed slot, come
// back whole after a restart from its snapshot and rows; the Applied
// event of a holder's grant carries its lease.
func TestNodeKindsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	n := startSingle(t, st, Config{SnapshotEntries: 5, CompactKeep: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	propose := func(c core.Command) Applied {
		t.Helper()
		a, err := n.Propose(ctx, c)
		if err != nil {
			t.Fatalf("Propose(%+v): %v", c, err)
		}
		return a
	}
	slot := core.Grant("sem", "w", 1000, 1).WithKind(2, core.ModeExclusive)
	if a := propose(slot); a.Result.Kind != core.ResultNoop {
		t.Fatalf("semaphore grant below cluster version 5 = %v", a.Result)
	}
	propose(core.SetClusterVersion(5))
	if a := propose(slot.WithLockDelay(2_000)); a.Result != (core.Result{Kind: core.ResultGranted, Token: 1}) || a.LeaseMS != 1000 {
		t.Fatalf("first slot = %v, lease %d", a.Result, a.LeaseMS)
	}
	propose(slot)
	if a := propose(slot); a.Result.Kind != core.ResultGrantRejected {
		t.Fatalf("third slot of two = %v", a.Result)
	}
	if a := propose(core.Expire("sem", 1)); !a.Result.Existed {
		t.Fatalf("expire slot 1 = %v", a.Result)
	}
	for range 2 {
		if a := propose(core.Grant("rw", "r", 1000, 1).WithKind(0, core.ModeShared)); a.Result.Kind != core.ResultGranted {
			t.Fatalf("shared = %v", a.Result)
		}
	}
	if a := propose(core.Grant("rw", "x", 1000, 1)); a.Result != (core.Result{Kind: core.ResultGrantRejected, Token: 3}) {
		t.Fatalf("exclusive beside shared = %v", a.Result)
	}
	testkit.Eventually(t, 10*time.Second, "a snapshot is taken", func() bool { return n.snapIndex.Load() > 0 })
	propose(core.Renew("rw", 4, 5_000)) // after the snapshot: from the rows
	var digest [32]byte
	var ks []core.KeyHolders
	n.View(func(m *core.Machine) { digest, ks = m.Digest(), m.MultiKeys() })
	n.Stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if len(ks) != 2 || len(ks[1].Delays) != 1 || ks[0].Holders[1].LeaseMS != 5_000 {
		t.Fatalf("before restart: %+v", ks)
	}
	st2 := openTestStore(t, dir)
	n2 := startSingle(t, st2, Config{})
	var gotDigest [32]byte
	var got []core.KeyHolders
	n2.View(func(m *core.Machine) { gotDigest, got = m.Digest(), m.MultiKeys() })
	if !reflect.DeepEqual(got, ks) || gotDigest != digest {
		t.Fatalf("after restart: %+v, want %+v (digest equal: %t)", got, ks, gotDigest == digest)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	if a, err := n2.Propose(ctx2, core.ClearDelay("sem", ks[1].Delays[0].Seq)); err != nil || a.Result.Kind != core.ResultDelayCleared {
		t.Fatalf("ClearDelay of the slot after restart = %v, %v", a.Result, err)
	}
	if a, err := n2.Propose(ctx2, slot); err != nil || a.Result != (core.Result{Kind: core.ResultGranted, Token: 5}) {
		t.Fatalf("a slot after restart = %v, %v", a.Result, err)
	}
	// A session's end names each holder it ended.
	open, err := n2.Propose(ctx2, core.OpenSession("", core.MinSessionTTLMS, 0))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		g := core.Grant("sem2", "w", 0, 1).WithKind(3, core.ModeExclusive).InSession(open.Result.Session)
		if a, err := n2.Propose(ctx2, g); err != nil || a.Result.Kind != core.ResultGranted {
			t.Fatalf("slot in a session = %v, %v", a.Result, err)
		}
	}
	a, err := n2.Propose(ctx2, core.CloseSession(open.Result.Session, ""))
	if err != nil || a.Result.Count != 2 || !slices.Equal(a.Keys, []string{"sem2", "sem2"}) || len(a.Ended) != 2 ||
		a.Ended[0].Token != 6 || a.Ended[1].Token != 7 || a.Ended[0].Limit != 3 {
		t.Fatalf("CloseSession = %v, keys %q, ended %+v, %v", a.Result, a.Keys, a.Ended, err)
	}
}
