package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// requestWorkload makes the next n commands of a cluster version 3
// workload for m (which it does not change): grants with request ids from
// small pools (so that repeats, mismatches and ended records happen),
// grants without, releases and expires of held locks, and a clock that
// now and then jumps past the retention (so that records are pruned).
type requestWorkload struct {
	r   *rand.Rand
	now uint64
}

func (w *requestWorkload) next(m *core.Machine) core.Command {
	key := fmt.Sprintf("k%d", w.r.IntN(6))
	switch p := w.r.IntN(100); {
	case p < 45:
		if w.r.IntN(10) == 0 {
			w.now += core.RequestRetentionMS / 2
		}
		w.now += w.r.Uint64N(1000)
		c := core.Grant(key, "o", 1000, w.now)
		if w.r.IntN(4) > 0 {
			c = c.WithRequest(fmt.Sprintf("id-%d", w.r.IntN(2)), fmt.Sprintf("r-%d", w.r.IntN(5)))
		}
		return c
	case p < 75:
		if l, ok := m.Get(key); ok {
			return core.Release(key, l.Token)
		}
		return core.Release(key, 1)
	case p < 95:
		if l, ok := m.Get(key); ok {
			return core.Expire(key, l.Token)
		}
		return core.Expire(key, 1)
	}
	if l, ok := m.Get(key); ok {
		return core.Renew(key, l.Token, 2000)
	}
	return core.Renew(key, 1, 0)
}

// v3Ref is a cluster version 3 machine (index 1 applied the version) and
// the store it was written to.
func v3Ref(t testing.TB, s *Store) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 1, core.SetClusterVersion(3)), HardState: raftpb.HardState{Term: 1, Commit: 1},
		State: applyRun(m, 1, core.SetClusterVersion(3))})
	return m
}

// endedRows counts the ended request rows of s and checks they are the
// machine's, in order.
func checkEndedRows(t *testing.T, step string, s *Store, m *core.Machine) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	head, next := m.EndedSeqs()
	h, err := readRequestsHeader(s.view)
	if err != nil || h != (requestMark{clockMS: m.DataClockMS(), head: head, next: next}) {
		t.Fatalf("%s: header %+v, %v; machine %d..%d clock %d", step, h, err, head, next, m.DataClockMS())
	}
	seq := head
	if err := forEachEnded(s.view, h, func(e core.EndedRequest) error {
		if want, _ := m.EndedRequestAt(seq); e != want {
			return fmt.Errorf("row %d: %+v, machine %+v", seq, e, want)
		}
		seq++
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
}

// The request rows follow the machine through runs of commands, reopen
// after reopen, and a snapshot built from the rows is the machine's.
func TestRequestRowsPersist(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ref := v3Ref(t, s)
	w := &requestWorkload{r: rand.New(rand.NewPCG(1, 2))}
	index := uint64(1)
	sawPruned, sawEnded := false, false
	for run := 0; run < 60; run++ {
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
		checkEndedRows(t, step, s, ref)
		head, next := ref.EndedSeqs()
		sawPruned = sawPruned || head > 0
		sawEnded = sawEnded || next > head
		if run%10 == 9 {
			s = reopen(t, s, dir)
			checkMachine(t, step+" reopened", s, index, ref, raftpb.ConfState{})
		}
		if run%15 == 14 {
			v, err := s.viewState()
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodeSnapshot(v, ref.Len(), 0, nil)
			_ = v.snap.Close()
			if err != nil || !bytes.Equal(got, ref.Snapshot()) {
				t.Fatalf("%s: the snapshot from the store rows differs from the machine's (%v)", step, err)
			}
		}
	}
	if !sawPruned || !sawEnded {
		t.Fatalf("the workload never pruned (%t) or kept (%t) an ended record", sawPruned, sawEnded)
	}
}

// Installing a snapshot replaces every request row; applying after it
// carries on from the snapshot's sequence numbers.
func TestRequestRowsSnapshotInstall(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	local := v3Ref(t, s)
	run := []core.Command{
		core.Grant("a", "", 1000, 10).WithRequest("x", "1"), core.Release("a", 1),
		core.Grant("b", "", 1000, 10).WithRequest("x", "2"), core.Release("b", 2),
		core.Grant("c", "", 1000, 10).WithRequest("x", "3"),
	}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 6}, State: applyRun(local, 6, run...)})

	// The leader's state at index 30: its ended records start further on.
	leader := core.NewMachine()
	lrun := []core.Command{core.SetClusterVersion(3)}
	for i := range 8 {
		key := fmt.Sprintf("L%d", i)
		lrun = append(lrun, core.Grant(key, "", 1000, uint64(i)*core.RequestRetentionMS).WithRequest("y", key), core.Release(key, uint64(i+1)))
	}
	applyRun(leader, 30, lrun...)
	lhead, lnext := leader.EndedSeqs()
	if lhead == 0 || lnext-lhead == 0 {
		t.Fatalf("leader ended %d..%d: the test wants pruned and kept records", lhead, lnext)
	}
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap := raftpb.Snapshot{Data: leader.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 30, Term: 2}}
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 2, Commit: 30}})
	checkMachine(t, "installed", s, 30, leader, cs)
	checkEndedRows(t, "installed", s, leader)

	after := []core.Command{core.Grant("z", "", 1000, 10*core.RequestRetentionMS).WithRequest("y", "z"), core.Release("z", leader.LastToken()+1)}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(2, 31, after...), HardState: raftpb.HardState{Term: 2, Commit: 32},
		State: applyRun(leader, 32, after...)})
	s = reopen(t, s, dir)
	checkMachine(t, "after", s, 32, leader, cs)
	checkEndedRows(t, "after", s, leader)
	if got := func() core.RequestRecord {
		_, m, _, _ := s.LoadMachine()
		return m.LookupRequest("y", "z")
	}(); got.Status != core.RequestEnded {
		t.Fatalf("LookupRequest after restart = %+v", got)
	}
}

// Write refuses a request change that does not follow the persisted rows,
// and writes nothing.
func TestRequestRowsWriteRejects(t *testing.T) {
	e := func(tok uint64) core.EndedRequest { return core.EndedRequest{Token: tok, EndedAtMS: 5} }
	for _, tc := range []struct {
		name string
		rc   RequestChange
	}{
		{"clock backwards", RequestChange{DataClockMS: 9, Head: 0, Next: 2, Ended: nil}},
		{"head backwards", RequestChange{DataClockMS: 10, Head: 0, Next: 2}},
		{"next backwards", RequestChange{DataClockMS: 10, Head: 1, Next: 1}},
		{"head past next", RequestChange{DataClockMS: 10, Head: 3, Next: 2}},
		{"appended records missing", RequestChange{DataClockMS: 10, Head: 1, Next: 3}},
		{"appended records too many", RequestChange{DataClockMS: 10, Head: 1, Next: 3, Ended: []core.EndedRequest{e(1), e(2)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTestStore(t, t.TempDir())
			// Persisted: clock 10, ended rows 1..1 (row 0 pruned).
			mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 3), HardState: raftpb.HardState{Term: 1, Commit: 3},
				State: &StateChange{Index: 1, LastToken: 5, Requests: &RequestChange{DataClockMS: 10, Head: 1, Next: 2, Ended: []core.EndedRequest{e(4)}}}})
			err := s.Write(ReadyWrite{State: &StateChange{Index: 2, LastToken: 5, Requests: &tc.rc}})
			if !errors.Is(err, ErrInvariant) {
				t.Fatalf("Write = %v, want ErrInvariant", err)
			}
			if s.AppliedIndex() != 1 || s.st.requests != (requestMark{clockMS: 10, head: 1, next: 2}) {
				t.Fatalf("a refused write changed the state: applied %d, requests %+v", s.AppliedIndex(), s.st.requests)
			}
		})
	}
}

// corruptV3Store writes a small cluster version 3 store with ended request
// rows 1..2 (row 0 pruned) and closes it.
func corruptV3Store(t *testing.T) (dir string, m *core.Machine) {
	dir = t.TempDir()
	s := openTestStore(t, dir)
	m = v3Ref(t, s)
	run := []core.Command{
		core.Grant("a", "", 1000, 10).WithRequest("x", "1"), core.Release("a", 1),
		core.Grant("b", "", 1000, 10).WithRequest("x", "2"), core.Release("b", 2),
		core.Grant("c", "", 1000, 20+core.RequestRetentionMS).WithRequest("x", "3"), core.Release("c", 3),
		core.Grant("d", "", 1000, 20+core.RequestRetentionMS).WithRequest("x", "4"),
	}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 8}, State: applyRun(m, 8, run...)})
	if head, next := m.EndedSeqs(); head != 2 || next != 3 {
		t.Fatalf("setup: ended %d..%d", head, next)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func TestRequestRowsCorrupt(t *testing.T) {
	loadMachine := func(s *Store) error { _, _, _, err := s.LoadMachine(); return err }
	dir, m := corruptV3Store(t)
	e2, _ := m.EndedRequestAt(2)
	held := e2
	held.Token = 4 // the token of the lock held on d
	header := func(clock, head, next uint64) []byte {
		return encodeRequestsHeader(requestMark{clockMS: clock, head: head, next: next})
	}
	clock := m.DataClockMS()
	for _, tc := range []struct {
		name       string
		key, value []byte
		read       func(*Store) error
	}{
		{"header short", keyRequests, []byte{1, 2, 3}, nil},
		{"header head past next", keyRequests, header(clock, 4, 3), nil},
		{"header names a missing row", keyRequests, header(clock, 1, 3), loadMachine},
		{"header names too few rows", keyRequests, header(clock, 2, 2), loadMachine},
		{"header missing", keyRequests, nil, loadMachine},
		{"row missing", endedKey(2), nil, loadMachine},
		{"row garbage", endedKey(2), []byte{1, 2}, loadMachine},
		{"row beyond next", endedKey(3), core.EncodeEndedRequest(e2), loadMachine},
		{"row with a held token", endedKey(2), core.EncodeEndedRequest(held), loadMachine},
		{"stray key", append(endedKey(2), 'x'), []byte{}, loadMachine},
		{"clock behind a row", keyRequests, header(1, 2, 3), loadMachine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := corruptV3Store(t)
			corruptAndCheck(t, d, tc.key, tc.value, tc.read)
		})
	}
	// The untouched store loads the machine.
	s := openTestStore(t, dir)
	checkMachine(t, "untouched", s, 8, m, raftpb.ConfState{})
}

// A crash at any moment keeps every applied entry together with its effect
// or loses both, the request rows included: the state loaded back after a
// crash, with the committed entries after its applied index re-applied
// from the log, is always the state the reference reached at that commit
// index, never one that applied an entry twice or skipped one.
func TestCrashNeverAppliesTwiceNorLoses(t *testing.T) {
	// At cluster version 3 (request rows) and 4 (the session and delay
	// rows too, with request ids in the same workload).
	t.Run("v3", func(t *testing.T) {
		crashNeverAppliesTwiceNorLoses(t, 3, &requestWorkload{r: rand.New(rand.NewPCG(3, 4))})
	})
	t.Run("v4", func(t *testing.T) {
		w := &sessionWorkload{requestWorkload: requestWorkload{r: rand.New(rand.NewPCG(5, 6))}}
		crashNeverAppliesTwiceNorLoses(t, 4, w)
		if w.expired == 0 || w.delaysCleared == 0 {
			t.Fatalf("the workload expired %d sessions and cleared %d delays: the test did not test", w.expired, w.delaysCleared)
		}
	})
	// At 5, the holder rows of semaphores and read/write keys too.
	t.Run("v5", func(t *testing.T) {
		w := &kindsWorkload{sessionWorkload: sessionWorkload{requestWorkload: requestWorkload{r: rand.New(rand.NewPCG(11, 12))}}}
		crashNeverAppliesTwiceNorLoses(t, 5, w)
		if w.slotsExpired == 0 || w.slotsCleared == 0 || w.sharedGranted == 0 {
			t.Fatalf("the workload expired %d slots, cleared %d, granted %d shared: the test did not test", w.slotsExpired, w.slotsCleared, w.sharedGranted)
		}
	})
}

// workload makes the next command for a machine, which it does not change.
type workload interface {
	next(m *core.Machine) core.Command
}

func crashNeverAppliesTwiceNorLoses(t *testing.T, version uint64, w workload) {
	fs := vfs.NewCrashableMem()
	s, err := Open("/store", StoreOptions{FS: memDisk{fs}, Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := rand.New(rand.NewPCG(version, 4))
	// scratch applies each entry as it is made: digests[i] is the state
	// after entry i, the reference every recovery is compared with. ref is
	// the node's machine, which applies committed entries in runs.
	scratch, ref := core.NewMachine(), core.NewMachine()
	digests := map[uint64][32]byte{0: scratch.Digest()}
	var pending []core.Command // committed, not yet applied
	last, applied := uint64(0), uint64(0)
	crashes := 0
	for step := 0; step < 150; step++ {
		var newEnts []raftpb.Entry
		for range r.IntN(4) {
			c := w.next(scratch)
			if last == 0 {
				c = core.SetClusterVersion(version)
			}
			scratch.Apply(c)
			last++
			digests[last] = scratch.Digest()
			newEnts = append(newEnts, cmdEntries(1, last, c)...)
			pending = append(pending, c)
		}
		// Apply a prefix of what is committed: in the same write as the
		// new entries (synced), or in a write of its own that may skip
		// the fsync (its entries are durable already).
		var sc *StateChange
		if n := r.IntN(len(pending) + 1); n > 0 {
			applied += uint64(n)
			sc = applyRun(ref, applied, pending[:n]...)
			pending = pending[n:]
			if ref.Digest() != digests[applied] {
				t.Fatalf("step %d: applying in runs differs from applying one by one", step)
			}
		}
		append := ReadyWrite{Entries: newEnts, HardState: raftpb.HardState{Term: 1, Commit: last}}
		switch {
		case sc == nil:
			mustWrite(t, s, append)
		case r.IntN(2) == 0:
			append.State = sc
			mustWrite(t, s, append)
		default:
			mustWrite(t, s, append)
			mustWrite(t, s, ReadyWrite{State: sc, MaySkipSync: true})
		}
		if applied > 0 && r.IntN(8) == 0 {
			if err := s.CreateSnapshot(applied, raftpb.ConfState{Voters: []uint64{1}}, ref.Snapshot()); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
				t.Fatal(err)
			}
			if err := s.Compact(applied); err != nil && !errors.Is(err, raft.ErrCompacted) {
				t.Fatal(err)
			}
		}
		if r.IntN(5) == 0 {
			crashes++
			clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: r.IntN(101), RNG: rand.New(rand.NewPCG(uint64(step), 5))})
			checkCrashRecovery(t, clone, digests)
		}
	}
	if crashes == 0 || ref.RequestRecords() == 0 {
		t.Fatalf("%d crashes, %d request records: the test did not test", crashes, ref.RequestRecords())
	}
}

// memDisk is a crashable in-memory filesystem that reports free space
// (vfs.MemFS does not), so that the store's disk guard runs on it.
type memDisk struct{ *vfs.MemFS }

func (memDisk) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: 1 << 40, TotalBytes: 1 << 41}, nil
}

// checkCrashRecovery opens the store on a crashed copy of the filesystem,
// loads its machine, re-applies the committed entries after the applied
// index, and compares with the reference digest at the commit index.
func checkCrashRecovery(t *testing.T, fs *vfs.MemFS, digests map[uint64][32]byte) {
	t.Helper()
	s, err := Open("/store", StoreOptions{FS: memDisk{fs}, Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatalf("open after crash: %v", err)
	}
	defer s.Close()
	applied, m, _, err := s.LoadMachine()
	if err != nil {
		t.Fatalf("load after crash: %v", err)
	}
	hs, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if want, ok := digests[applied]; !ok || m.Digest() != want {
		t.Fatalf("after a crash the state at applied index %d is not the reference's (known: %t)", applied, ok)
	}
	if hs.Commit > applied {
		ents, err := s.Entries(applied+1, hs.Commit+1, math.MaxUint64)
		if err != nil {
			t.Fatalf("committed entries %d..%d after a crash: %v", applied+1, hs.Commit, err)
		}
		for _, e := range ents {
			ent, err := core.DecodeEntry(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			m.Apply(ent.Command)
		}
	}
	if want, ok := digests[hs.Commit]; !ok || m.Digest() != want {
		t.Fatalf("after a crash and replay to %d the state differs from the reference's", hs.Commit)
	}
	// And the rows agree with what LoadMachine built.
	var rs core.RequestState
	s.mu.RLock()
	h, err := readRequestsHeader(s.view)
	if err == nil {
		rs = core.RequestState{DataClockMS: h.clockMS, EndedHead: h.head}
		err = forEachEnded(s.view, h, func(e core.EndedRequest) error { rs.Ended = append(rs.Ended, e); return nil })
	}
	s.mu.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	_, loaded, _, _ := s.LoadMachine()
	if got := loaded.RequestState(); !reflect.DeepEqual(got, rs) {
		t.Fatalf("request rows %+v, loaded %+v", rs, got)
	}
	checkSessionRows(t, "after a crash", s, loaded)
}

// Through a real node: request ids proposed at cluster version 3 give the
// first grant's outcome to a retry, the events carry the repeated grant's
// lease, and after a snapshot and a restart the node finds the same
// records and the same digest.
func TestNodeRequestRecordsSurviveRestart(t *testing.T) {
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
	g := core.Grant("job", "w", 4000, 1_000).WithRequest("acct", "req-1")
	if a := propose(g); a.Result.Kind != core.ResultNoop {
		t.Fatalf("a request grant below cluster version 3 = %v", a.Result)
	}
	propose(core.SetClusterVersion(3))
	first := propose(g)
	if first.Result.Kind != core.ResultGranted {
		t.Fatalf("first grant = %v", first.Result)
	}
	if again := propose(g); again.Result != (core.Result{Kind: core.ResultGrantRepeated, Token: first.Result.Token}) || again.LeaseMS != 4000 {
		t.Fatalf("retry = %v (lease %d), want the first token %d", again.Result, again.LeaseMS, first.Result.Token)
	}
	propose(core.Release("job", first.Result.Token))
	for i := range 12 {
		key := fmt.Sprintf("other/%d", i)
		a := propose(core.Grant(key, "", 4000, 2_000+uint64(i)).WithRequest("acct", key))
		propose(core.Expire(key, a.Result.Token))
	}
	if a := propose(g); a.Result != (core.Result{Kind: core.ResultGrantEnded, Token: first.Result.Token}) {
		t.Fatalf("retry after release = %v", a.Result)
	}
	testkit.Eventually(t, 10*time.Second, "a snapshot is taken", func() bool { return n.snapIndex.Load() > 0 })
	var digest [32]byte
	var records int
	n.View(func(m *core.Machine) { digest, records = m.Digest(), m.RequestRecords() })
	n.Stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st2 := openTestStore(t, dir)
	n2 := startSingle(t, st2, Config{})
	var got core.RequestRecord
	var gotDigest [32]byte
	var gotRecords int
	n2.View(func(m *core.Machine) {
		got, gotDigest, gotRecords = m.LookupRequest("acct", "req-1"), m.Digest(), m.RequestRecords()
	})
	if got.Status != core.RequestEnded || got.Token != first.Result.Token || gotRecords != records {
		t.Fatalf("after restart: %+v, %d records (want ended, token %d, %d records)", got, gotRecords, first.Result.Token, records)
	}
	// The restarted node appended its own empty entry (no state change), so
	// the state is the one it stopped with.
	if gotDigest != digest {
		t.Fatal("after restart the digest differs")
	}
}
