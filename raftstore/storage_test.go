package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

func openTestStore(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func reopen(t testing.TB, s *Store, dir string) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openTestStore(t, dir)
}

func mustWrite(t testing.TB, s *Store, w ReadyWrite) {
	t.Helper()
	if err := s.Write(w); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

// mkEnts returns entries lo..hi (inclusive) of the given term whose Data
// lengths vary (0..4 bytes, the 0 case a non-nil empty slice) so that maxSize
// boundaries fall between entries of different sizes.
func mkEnts(term, lo, hi uint64) []raftpb.Entry {
	var ents []raftpb.Entry
	for i := lo; i <= hi; i++ {
		ents = append(ents, raftpb.Entry{Term: term, Index: i, Data: bytes.Repeat([]byte{byte('a' + i%26)}, int(i%5))})
	}
	return ents
}

func entriesEqual(a, b []raftpb.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Term != b[i].Term || a[i].Index != b[i].Index || a[i].Type != b[i].Type || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

func metaBytes(t testing.TB, m raftpb.SnapshotMetadata) []byte {
	t.Helper()
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	testConfState = raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	emptySnapData = core.NewMachine().Snapshot()
)

// mirrorOp is one operation run against both raft.MemoryStorage and Store.
type mirrorOp struct {
	kind  string // append, commit, snapshot, compact, install
	ents  []raftpb.Entry
	index uint64
	term  uint64
}

func opAppend(ents []raftpb.Entry) mirrorOp { return mirrorOp{kind: "append", ents: ents} }
func opCommit(i uint64) mirrorOp            { return mirrorOp{kind: "commit", index: i} }
func opSnapshot(i uint64) mirrorOp          { return mirrorOp{kind: "snapshot", index: i} }
func opCompact(i uint64) mirrorOp           { return mirrorOp{kind: "compact", index: i} }
func opInstall(i, term uint64, ents []raftpb.Entry) mirrorOp {
	return mirrorOp{kind: "install", index: i, term: term, ents: ents}
}

func (o mirrorOp) String() string {
	switch o.kind {
	case "append":
		if len(o.ents) == 0 {
			return "append()"
		}
		return fmt.Sprintf("append(%d..%d@t%d)", o.ents[0].Index, o.ents[len(o.ents)-1].Index, o.ents[0].Term)
	case "install":
		return fmt.Sprintf("install(%d@t%d +%d ents)", o.index, o.term, len(o.ents))
	}
	return fmt.Sprintf("%s(%d)", o.kind, o.index)
}

// run applies o to both storages and returns their errors.
func (o mirrorOp) run(mem *raft.MemoryStorage, s *Store) (memErr, storeErr error) {
	switch o.kind {
	case "append":
		return mem.Append(o.ents), s.Write(ReadyWrite{Entries: o.ents})
	case "commit":
		hs := raftpb.HardState{Term: 1, Commit: o.index}
		memErr = mem.SetHardState(hs)
		storeErr = s.Write(ReadyWrite{HardState: hs, State: &StateChange{Index: o.index}})
		return memErr, storeErr
	case "snapshot":
		_, memErr = mem.CreateSnapshot(o.index, &testConfState, emptySnapData)
		return memErr, s.CreateSnapshot(o.index, testConfState, emptySnapData)
	case "compact":
		return mem.Compact(o.index), s.Compact(o.index)
	case "install":
		snap := raftpb.Snapshot{Data: emptySnapData, Metadata: raftpb.SnapshotMetadata{
			ConfState: testConfState, Index: o.index, Term: o.term}}
		hs := raftpb.HardState{Term: o.term, Commit: o.index}
		memErr = mem.ApplySnapshot(snap)
		if memErr == nil {
			_ = mem.SetHardState(hs)
			memErr = mem.Append(o.ents)
		}
		return memErr, s.Write(ReadyWrite{Snapshot: snap, HardState: hs, Entries: o.ents})
	}
	panic("unknown op " + o.kind)
}

// compareWithMemory checks every observable answer of s against mem: first
// and last index, Term over the whole range and beyond, Entries for every
// [lo, hi) and several maxSizes, the snapshot and the hard state. Storage
// errors must be raft's sentinels, identical (==) to MemoryStorage's.
func compareWithMemory(t *testing.T, step string, mem *raft.MemoryStorage, s *Store) {
	t.Helper()
	mf, _ := mem.FirstIndex()
	ml, _ := mem.LastIndex()
	sf, err := s.FirstIndex()
	if err != nil {
		t.Fatalf("%s: FirstIndex: %v", step, err)
	}
	sl, err := s.LastIndex()
	if err != nil {
		t.Fatalf("%s: LastIndex: %v", step, err)
	}
	if mf != sf || ml != sl {
		t.Fatalf("%s: [first,last] store [%d,%d], memory [%d,%d]", step, sf, sl, mf, ml)
	}
	for i := uint64(0); i <= ml+2; i++ {
		mt, merr := mem.Term(i)
		st, serr := s.Term(i)
		if mt != st || merr != serr {
			t.Fatalf("%s: Term(%d) store (%d, %v), memory (%d, %v)", step, i, st, serr, mt, merr)
		}
	}
	one := uint64((&raftpb.Entry{Term: 1, Index: 1}).Size())
	for lo := uint64(0); lo <= ml+1; lo++ {
		for hi := lo; hi <= ml+1; hi++ {
			for _, max := range []uint64{0, one, 2 * one, 2*one + 3, 5 * one, math.MaxUint64} {
				me, merr := mem.Entries(lo, hi, max)
				se, serr := s.Entries(lo, hi, max)
				if merr != serr || !entriesEqual(me, se) {
					t.Fatalf("%s: Entries(%d, %d, %d)\nstore  %v %v\nmemory %v %v", step, lo, hi, max, se, serr, me, merr)
				}
			}
		}
	}
	msnap, _ := mem.Snapshot()
	ssnap, err := s.Snapshot()
	if err != nil {
		t.Fatalf("%s: Snapshot: %v", step, err)
	}
	if !bytes.Equal(metaBytes(t, msnap.Metadata), metaBytes(t, ssnap.Metadata)) || !bytes.Equal(msnap.Data, ssnap.Data) {
		t.Fatalf("%s: Snapshot store %v, memory %v", step, ssnap.Metadata, msnap.Metadata)
	}
	mhs, _, _ := mem.InitialState()
	shs, _, err := s.InitialState()
	if err != nil {
		t.Fatalf("%s: InitialState: %v", step, err)
	}
	if mhs != shs {
		t.Fatalf("%s: HardState store %v, memory %v", step, shs, mhs)
	}
}

func TestStorageMirrorsMemoryStorage(t *testing.T) {
	tests := []struct {
		name string
		ops  []mirrorOp
	}{
		{"empty", nil},
		{"append", []mirrorOp{opAppend(mkEnts(1, 1, 5)), opAppend(mkEnts(2, 6, 8)), opAppend(nil)}},
		{"overlap truncates tail", []mirrorOp{
			opAppend(mkEnts(1, 1, 5)), opAppend(mkEnts(2, 3, 4)), opAppend(mkEnts(3, 5, 6))}},
		{"overlap at first index", []mirrorOp{opAppend(mkEnts(1, 1, 3)), opAppend(mkEnts(2, 1, 2))}},
		{"overlap replays identical entries", []mirrorOp{opAppend(mkEnts(1, 1, 3)), opAppend(mkEnts(1, 2, 3))}},
		{"overlap longer than log", []mirrorOp{opAppend(mkEnts(1, 1, 3)), opAppend(mkEnts(2, 2, 9))}},
		{"compact", []mirrorOp{
			opAppend(mkEnts(1, 1, 10)), opCommit(7), opSnapshot(5), opCompact(3),
			opCompact(3), opCompact(2), opCompact(5), opSnapshot(5), opSnapshot(4),
			opAppend(mkEnts(2, 11, 12))}},
		{"compact to snapshot index then append", []mirrorOp{
			opAppend(mkEnts(1, 1, 4)), opCommit(4), opSnapshot(4), opCompact(4), opAppend(mkEnts(2, 5, 6))}},
		{"append below first index", []mirrorOp{
			opAppend(mkEnts(1, 1, 10)), opCommit(6), opSnapshot(6), opCompact(6),
			opAppend(mkEnts(1, 3, 5)), opAppend(mkEnts(1, 4, 6)), opAppend(mkEnts(2, 5, 8))}},
		{"install snapshot", []mirrorOp{
			opAppend(mkEnts(1, 1, 5)), opInstall(10, 3, nil), opAppend(mkEnts(3, 11, 13)),
			opInstall(8, 3, nil), opInstall(10, 3, nil)}},
		{"install snapshot inside the log", []mirrorOp{
			opAppend(mkEnts(1, 1, 10)), opCommit(2), opInstall(5, 2, nil), opAppend(mkEnts(2, 6, 7))}},
		{"install with entries in the same write", []mirrorOp{
			opAppend(mkEnts(1, 1, 3)), opInstall(6, 2, mkEnts(2, 4, 9)), opAppend(mkEnts(3, 8, 8))}},
		{"install then snapshot and compact", []mirrorOp{
			opInstall(5, 1, nil), opAppend(mkEnts(1, 6, 9)), opCommit(8), opSnapshot(8), opCompact(7),
			opCompact(6), opCommit(9), opSnapshot(9), opCompact(9)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			mem := raft.NewMemoryStorage()
			s := openTestStore(t, dir)
			compareWithMemory(t, "initial", mem, s)
			for i, op := range tt.ops {
				step := fmt.Sprintf("op %d %v", i, op)
				merr, serr := op.run(mem, s)
				if (merr == nil) != (serr == nil) || (merr != nil && !errors.Is(serr, merr)) {
					t.Fatalf("%s: store error %v, memory error %v", step, serr, merr)
				}
				compareWithMemory(t, step, mem, s)
				s = reopen(t, s, dir)
				compareWithMemory(t, step+" after reopen", mem, s)
			}
		})
	}
}

func TestStorageEmptyLikeMemoryStorage(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	if fi, _ := s.FirstIndex(); fi != 1 {
		t.Errorf("FirstIndex = %d, want 1", fi)
	}
	if li, _ := s.LastIndex(); li != 0 {
		t.Errorf("LastIndex = %d, want 0", li)
	}
	if term, err := s.Term(0); term != 0 || err != nil {
		t.Errorf("Term(0) = %d, %v; want 0, nil", term, err)
	}
	if _, err := s.Term(1); err != raft.ErrUnavailable {
		t.Errorf("Term(1) err = %v, want ErrUnavailable", err)
	}
	if _, err := s.Entries(1, 1, math.MaxUint64); err != raft.ErrUnavailable {
		t.Errorf("Entries(1,1) err = %v, want ErrUnavailable", err)
	}
	if _, err := s.Entries(0, 1, math.MaxUint64); err != raft.ErrCompacted {
		t.Errorf("Entries(0,1) err = %v, want ErrCompacted", err)
	}
	if _, err := s.Entries(1, 2, math.MaxUint64); !errors.Is(err, ErrInvariant) {
		t.Errorf("Entries(1,2) beyond last err = %v, want ErrInvariant", err)
	}
	hs, cs, err := s.InitialState()
	if err != nil || !raft.IsEmptyHardState(hs) || len(cs.Voters) != 0 {
		t.Errorf("InitialState = %v, %v, %v; want empty", hs, cs, err)
	}
	if snap, err := s.Snapshot(); err != nil || !raft.IsEmptySnap(snap) {
		t.Errorf("Snapshot = %v, %v; want empty", snap.Metadata, err)
	}
	applied, m, _, err := s.LoadMachine()
	if err != nil || applied != 0 || m.Len() != 0 || m.LastToken() != 0 {
		t.Errorf("LoadMachine = %d, %d locks, token %d, %v; want empty", applied, m.Len(), m.LastToken(), err)
	}
}

func TestStorageTruncateOnOverlap(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 5)})
	mustWrite(t, s, ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 2}})
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(2, 3, 4)})
	for pass := 0; pass < 2; pass++ {
		if li, _ := s.LastIndex(); li != 4 {
			t.Fatalf("pass %d: LastIndex = %d, want 4 (entry 5 dropped)", pass, li)
		}
		got, err := s.Entries(1, 5, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		want := append(mkEnts(1, 1, 2), mkEnts(2, 3, 4)...)
		if !entriesEqual(got, want) {
			t.Fatalf("pass %d: entries %v, want %v", pass, got, want)
		}
		if _, err := s.Term(5); err != raft.ErrUnavailable {
			t.Fatalf("pass %d: Term(5) err %v, want ErrUnavailable", pass, err)
		}
		s = reopen(t, s, dir)
	}
	// Truncating at or below the commit index is refused.
	if err := s.Write(ReadyWrite{Entries: mkEnts(3, 2, 2)}); !errors.Is(err, ErrInvariant) {
		t.Fatalf("truncate committed: err %v, want ErrInvariant", err)
	}
}

func TestStorageEntriesMaxSize(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	var ents []raftpb.Entry
	for i := uint64(1); i <= 6; i++ {
		ents = append(ents, raftpb.Entry{Term: 1, Index: i, Data: bytes.Repeat([]byte{'x'}, 100)})
	}
	mustWrite(t, s, ReadyWrite{Entries: ents})
	size := uint64(ents[0].Size())
	tests := []struct {
		maxSize uint64
		want    int
	}{
		{0, 1},
		{1, 1},
		{size, 1},
		{2*size - 1, 1},
		{2 * size, 2},
		{3*size + 1, 3},
		{6 * size, 6},
		{math.MaxUint64, 6},
	}
	for _, tt := range tests {
		got, err := s.Entries(1, 7, tt.maxSize)
		if err != nil {
			t.Fatalf("Entries(1, 7, %d): %v", tt.maxSize, err)
		}
		if len(got) != tt.want || !entriesEqual(got, ents[:tt.want]) {
			t.Errorf("Entries(1, 7, %d) gave %d entries, want %d", tt.maxSize, len(got), tt.want)
		}
	}

	// The caller owns the slice and the entries: appending to it or
	// scribbling on Data must not reach the store.
	got, err := s.Entries(2, 4, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, raftpb.Entry{Index: 99})
	got[0].Data[0] = 'Z'
	again, err := s.Entries(2, 5, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	if !entriesEqual(again, ents[1:4]) {
		t.Fatalf("store changed through a returned slice: %v", again)
	}
	_ = got
}

func TestStorageCompactSemantics(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 10), HardState: raftpb.HardState{Term: 1, Commit: 8},
		State: &StateChange{Index: 8}})
	if err := s.Compact(3); !errors.Is(err, ErrInvariant) {
		t.Fatalf("Compact(3) without snapshot: err %v, want ErrInvariant", err)
	}
	if err := s.CreateSnapshot(9, testConfState, emptySnapData); !errors.Is(err, ErrInvariant) {
		t.Fatalf("CreateSnapshot(9) above applied: err %v, want ErrInvariant", err)
	}
	if err := s.CreateSnapshot(6, testConfState, []byte("junk")); !errors.Is(err, ErrInvariant) {
		t.Fatalf("CreateSnapshot with junk data: err %v, want ErrInvariant", err)
	}
	if err := s.CreateSnapshot(6, testConfState, emptySnapData); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(7); !errors.Is(err, ErrInvariant) {
		t.Fatalf("Compact(7) beyond snapshot 6: err %v, want ErrInvariant", err)
	}
	if err := s.Compact(0); err != raft.ErrCompacted {
		t.Fatalf("Compact(0): err %v, want ErrCompacted", err)
	}
	if err := s.Compact(4); err != nil {
		t.Fatal(err)
	}
	for pass := 0; pass < 2; pass++ {
		if fi, _ := s.FirstIndex(); fi != 5 {
			t.Fatalf("pass %d: FirstIndex after Compact(4) = %d, want 5", pass, fi)
		}
		if term, err := s.Term(4); term != 1 || err != nil {
			t.Fatalf("pass %d: Term(4) = %d, %v; want 1, nil", pass, term, err)
		}
		if _, err := s.Term(3); err != raft.ErrCompacted {
			t.Fatalf("pass %d: Term(3) err %v, want ErrCompacted", pass, err)
		}
		if _, err := s.Entries(4, 6, math.MaxUint64); err != raft.ErrCompacted {
			t.Fatalf("pass %d: Entries(4, 6) err %v, want ErrCompacted", pass, err)
		}
		if err := s.Compact(4); err != raft.ErrCompacted {
			t.Fatalf("pass %d: Compact(4) again: err %v, want ErrCompacted", pass, err)
		}
		s = reopen(t, s, dir)
	}
}

// applyRun applies cmds to m and returns the StateChange of the run built
// the recommended way: net change of the touched keys.
func applyRun(m *core.Machine, index uint64, cmds ...core.Command) *StateChange {
	// The node's own bookkeeping (ready.go), so that what a test writes is
	// what a node would.
	ra := &readyApply{applied: index}
	ra.mark(m)
	for _, c := range cmds {
		ra.apply(m, c)
	}
	return ra.rowChange(m)
}

func cmdEntries(term, first uint64, cmds ...core.Command) []raftpb.Entry {
	ents := make([]raftpb.Entry, len(cmds))
	for i, c := range cmds {
		ents[i] = raftpb.Entry{Term: term, Index: first + uint64(i),
			Data: core.EncodeEntry(core.Entry{RequestID: first + uint64(i), Command: c})}
	}
	return ents
}

func checkMachine(t *testing.T, step string, s *Store, wantApplied uint64, want *core.Machine, wantCS raftpb.ConfState) {
	t.Helper()
	applied, m, cs, err := s.LoadMachine()
	if err != nil {
		t.Fatalf("%s: LoadMachine: %v", step, err)
	}
	if applied != wantApplied || s.AppliedIndex() != wantApplied {
		t.Fatalf("%s: applied %d (AppliedIndex %d), want %d", step, applied, s.AppliedIndex(), wantApplied)
	}
	if m.Digest() != want.Digest() {
		t.Fatalf("%s: machine differs:\n got token %d %v\nwant token %d %v", step, m.LastToken(), m.Locks(), want.LastToken(), want.Locks())
	}
	if err := cs.Equivalent(wantCS); err != nil {
		t.Fatalf("%s: conf state: %v", step, err)
	}
}

func TestStorageReopenRecoversEverything(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ref := core.NewMachine()

	cs1 := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	run1 := []core.Command{core.Grant("a", "o1", 1000, 1), core.Grant("b", "o2", 2000, 2), core.Grant("c", "", 3000, 3)}
	ents1 := cmdEntries(1, 1, run1...)
	hs1 := raftpb.HardState{Term: 1, Vote: 1, Commit: 3}
	as1 := applyRun(ref, 3, run1...)
	as1.ConfState = &cs1
	mustWrite(t, s, ReadyWrite{HardState: hs1, Entries: ents1, State: as1})

	// Grant and release "d" in one run, release "a": the net change deletes
	// a and d and puts nothing for d.
	run2 := []core.Command{core.Grant("d", "o4", 500, 4), core.Release("d", 4), core.Release("a", 1), core.Expire("b", 99)}
	ents2 := cmdEntries(2, 4, run2...)
	hs2 := raftpb.HardState{Term: 2, Vote: 2, Commit: 7}
	as2 := applyRun(ref, 7, run2...)
	mustWrite(t, s, ReadyWrite{HardState: hs2, Entries: ents2, State: as2})
	if err := s.CreateSnapshot(7, cs1, ref.Snapshot()); err != nil {
		t.Fatal(err)
	}
	snapData := ref.Snapshot()
	if err := s.Compact(5); err != nil {
		t.Fatal(err)
	}
	// Two more entries, committed but not yet applied.
	ents3 := cmdEntries(2, 8, core.Grant("e", "o5", 700, 5), core.Grant("f", "o6", 800, 6))
	hs3 := raftpb.HardState{Term: 2, Vote: 2, Commit: 9}
	mustWrite(t, s, ReadyWrite{HardState: hs3, Entries: ents3})

	allEnts := append(append(append([]raftpb.Entry{}, ents1...), ents2...), ents3...)
	for pass := 0; pass < 3; pass++ {
		step := fmt.Sprintf("pass %d", pass)
		hs, cs, err := s.InitialState()
		if err != nil {
			t.Fatal(err)
		}
		if hs != hs3 {
			t.Fatalf("%s: hard state %v, want %v", step, hs, hs3)
		}
		if err := cs.Equivalent(cs1); err != nil {
			t.Fatalf("%s: conf state: %v", step, err)
		}
		if fi, _ := s.FirstIndex(); fi != 6 {
			t.Fatalf("%s: FirstIndex %d, want 6", step, fi)
		}
		if li, _ := s.LastIndex(); li != 9 {
			t.Fatalf("%s: LastIndex %d, want 9", step, li)
		}
		if term, err := s.Term(5); err != nil || term != 2 {
			t.Fatalf("%s: Term(5) = %d, %v; want 2", step, term, err)
		}
		got, err := s.Entries(6, 10, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		if !entriesEqual(got, allEnts[5:]) {
			t.Fatalf("%s: entries %v, want %v", step, got, allEnts[5:])
		}
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if snap.Metadata.Index != 7 || snap.Metadata.Term != 2 || !bytes.Equal(snap.Data, snapData) ||
			snap.Metadata.ConfState.Equivalent(cs1) != nil {
			t.Fatalf("%s: snapshot %v", step, snap.Metadata)
		}
		checkMachine(t, step, s, 7, ref, cs1)
		if _, m, _, _ := s.LoadMachine(); m.LastToken() != 4 {
			t.Fatalf("%s: last token %d, want 4", step, m.LastToken())
		}
		if l, ok := ref.Get("c"); !ok || l.Owner != "" || l.LeaseMS != 3000 {
			t.Fatalf("%s: reference lost lock c", step)
		}
		s = reopen(t, s, dir)
	}
}

func TestStorageSnapshotInstallReplacesAllRows(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	local := core.NewMachine()
	run := []core.Command{core.Grant("a", "", 1000, 0), core.Grant("b", "", 1000, 0), core.Grant("c", "", 1000, 0)}
	mustWrite(t, s, ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 3}, Entries: cmdEntries(1, 1, run...),
		State: applyRun(local, 3, run...)})
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 4, core.Grant("x", "", 1000, 0))}) // uncommitted tail

	// The leader's state at index 20: b re-granted, d new, a and c gone.
	leader := core.NewMachine()
	leader.Load(17, []core.Lock{
		{Key: "b", Token: 9, Owner: "nb", LeaseMS: 5000},
		{Key: "d", Token: 17, Owner: "nd", LeaseMS: 6000, GrantedAtMS: 42},
	})
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 4}, Learners: []uint64{5}}
	snap := raftpb.Snapshot{Data: leader.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 20, Term: 3}}
	after := cmdEntries(3, 19, core.Grant("y", "", 1000, 0), core.Grant("z", "", 1000, 0), core.Grant("w", "", 1000, 0))
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 3, Commit: 20}, Entries: after,
		State: &StateChange{Index: 20, LastToken: 17}}) // a no-op State at the snapshot index is accepted

	for pass := 0; pass < 2; pass++ {
		step := fmt.Sprintf("pass %d", pass)
		checkMachine(t, step, s, 20, leader, cs)
		if fi, _ := s.FirstIndex(); fi != 21 {
			t.Fatalf("%s: FirstIndex %d, want 21", step, fi)
		}
		if li, _ := s.LastIndex(); li != 21 {
			t.Fatalf("%s: LastIndex %d, want 21 (only entries after the snapshot kept)", step, li)
		}
		if term, err := s.Term(20); term != 3 || err != nil {
			t.Fatalf("%s: Term(20) = %d, %v", step, term, err)
		}
		if _, err := s.Term(4); err != raft.ErrCompacted {
			t.Fatalf("%s: Term(4) err %v, want ErrCompacted", step, err)
		}
		got, err := s.Entries(21, 22, math.MaxUint64)
		if err != nil || !entriesEqual(got, after[2:]) {
			t.Fatalf("%s: Entries(21,22) = %v, %v", step, got, err)
		}
		got2, err := s.Snapshot()
		if err != nil || got2.Metadata.Index != 20 || !bytes.Equal(got2.Data, snap.Data) {
			t.Fatalf("%s: Snapshot = %v, %v", step, got2.Metadata, err)
		}
		s = reopen(t, s, dir)
	}
}

func TestStorageWriteRejectsInvalid(t *testing.T) {
	snapAt := func(index, term, lastToken uint64) raftpb.Snapshot {
		m := core.NewMachine()
		m.Load(lastToken, nil)
		return raftpb.Snapshot{Data: m.Snapshot(), Metadata: raftpb.SnapshotMetadata{Index: index, Term: term, ConfState: testConfState}}
	}
	lock := func(key string, token uint64) core.Lock { return core.Lock{Key: key, Token: token, LeaseMS: 1000} }
	tests := []struct {
		name string
		w    ReadyWrite
		also error
	}{
		{"gap", ReadyWrite{Entries: mkEnts(1, 7, 8)}, nil},
		{"not contiguous", ReadyWrite{Entries: []raftpb.Entry{{Term: 1, Index: 6}, {Term: 1, Index: 8}}}, nil},
		{"truncate committed", ReadyWrite{Entries: mkEnts(2, 3, 3)}, nil},
		{"commit beyond last", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 6}}, nil},
		{"applied beyond commit", ReadyWrite{State: &StateChange{Index: 4, LastToken: 5}}, nil},
		{"applied does not advance", ReadyWrite{State: &StateChange{Index: 2, LastToken: 5}}, nil},
		{"applied again with changes", ReadyWrite{State: &StateChange{Index: 3, LastToken: 6,
			Put: []core.Lock{lock("n", 6)}}}, nil},
		{"last token decreases", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 4}}, nil},
		{"lock token above last token", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 5, Put: []core.Lock{lock("n", 6)}}}, nil},
		{"invalid lock", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 6, Put: []core.Lock{lock("", 6)}}}, core.ErrInvalidArgument},
		{"invalid delete key", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 5, Delete: []string{""}}}, core.ErrInvalidArgument},
		{"put and delete same key", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 6, Put: []core.Lock{lock("n", 6)}, Delete: []string{"n"}}}, nil},
		{"put twice differently", ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 4},
			State: &StateChange{Index: 4, LastToken: 7, Put: []core.Lock{lock("n", 6), lock("n", 7)}}}, nil},
		{"snapshot out of date", ReadyWrite{Snapshot: snapAt(3, 1, 9), HardState: raftpb.HardState{Term: 1, Commit: 3}},
			raft.ErrSnapOutOfDate},
		{"snapshot lowers last token", ReadyWrite{Snapshot: snapAt(9, 2, 4), HardState: raftpb.HardState{Term: 2, Commit: 9}}, nil},
		{"snapshot with junk data", ReadyWrite{Snapshot: raftpb.Snapshot{Data: []byte("junk"),
			Metadata: raftpb.SnapshotMetadata{Index: 9, Term: 2}}, HardState: raftpb.HardState{Term: 2, Commit: 9}}, core.ErrMalformed},
		{"snapshot without commit", ReadyWrite{Snapshot: snapAt(9, 2, 9)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			m := core.NewMachine()
			run := []core.Command{core.Grant("a", "", 1000, 0), core.Grant("b", "", 1000, 0), core.Grant("c", "", 1000, 0),
				core.Release("a", 1), core.Grant("a", "", 1000, 0), core.Grant("q", "", 1000, 0)}
			// Entries 1..5, commit 3, applied 3 (tokens 1..5 issued by the run
			// of 6 commands compressed into applied index 3).
			mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 5), HardState: raftpb.HardState{Term: 1, Commit: 3},
				State: applyRun(m, 3, run...)})
			if m.LastToken() != 5 {
				t.Fatalf("setup: last token %d", m.LastToken())
			}
			hsBefore, _, _ := s.InitialState()
			err := s.Write(tt.w)
			if !errors.Is(err, ErrInvariant) {
				t.Fatalf("Write: err %v, want ErrInvariant", err)
			}
			if tt.also != nil && !errors.Is(err, tt.also) {
				t.Fatalf("Write: err %v, want it to wrap %v too", err, tt.also)
			}
			// Nothing changed, also after a reopen.
			for pass := 0; pass < 2; pass++ {
				hs, _, _ := s.InitialState()
				li, _ := s.LastIndex()
				fi, _ := s.FirstIndex()
				if hs != hsBefore || li != 5 || fi != 1 {
					t.Fatalf("pass %d: state changed: hs %v, [%d,%d]", pass, hs, fi, li)
				}
				got, err := s.Entries(1, 6, math.MaxUint64)
				if err != nil || !entriesEqual(got, mkEnts(1, 1, 5)) {
					t.Fatalf("pass %d: entries changed: %v, %v", pass, got, err)
				}
				checkMachine(t, fmt.Sprintf("pass %d", pass), s, 3, m, raftpb.ConfState{})
				s = reopen(t, s, dir)
			}
		})
	}
}

func TestStorageWriteAcceptsRepeatsWithSameEffect(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	m := core.NewMachine()
	m.Apply(core.Grant("a", "", 1000, 0))
	held, _ := m.Get("a")
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 2), HardState: raftpb.HardState{Term: 1, Commit: 2},
		State: &StateChange{Index: 2, LastToken: 1, Put: []core.Lock{held, held}, Delete: []string{"zz", "zz"}}})
	checkMachine(t, "after write", s, 2, m, raftpb.ConfState{})
	// Nothing at all: no commit, no fsync observed.
	if err := s.Write(ReadyWrite{}); err != nil {
		t.Fatal(err)
	}
}

func TestStorageCorruptRow(t *testing.T) {
	entry := func(e raftpb.Entry) []byte {
		b, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	garbage := []byte{0xff, 0xff, 0xff}
	readEntries := func(s *Store) error { _, err := s.Entries(3, 7, math.MaxUint64); return err }
	readTerm3 := func(s *Store) error { _, err := s.Term(3); return err }
	initialState := func(s *Store) error { _, _, err := s.InitialState(); return err }
	loadMachine := func(s *Store) error { _, _, _, err := s.LoadMachine(); return err }
	snapshot := func(s *Store) error { _, err := s.Snapshot(); return err }
	tests := []struct {
		name  string
		key   []byte
		value []byte // nil deletes the row
		read  func(*Store) error
	}{
		{"entry garbage", logKey(3), garbage, readEntries},
		{"entry garbage via Term", logKey(3), garbage, readTerm3},
		{"entry under wrong index", logKey(3), entry(raftpb.Entry{Term: 1, Index: 4}), readEntries},
		{"entry bad type", logKey(3), entry(raftpb.Entry{Term: 1, Index: 3, Type: 7}), readTerm3},
		{"entry missing", logKey(3), nil, nil},
		{"last entry garbage", logKey(6), garbage, nil},
		{"dummy entry garbage", logKey(2), garbage, nil},
		{"stray log key", append(logKey(4), 'x'), []byte{}, nil},
		{"hard state garbage", keyHardState, garbage, nil},
		{"hard state missing", keyHardState, nil, nil},
		{"conf state garbage", keyConfState, garbage, initialState},
		{"conf state garbage via LoadMachine", keyConfState, garbage, loadMachine},
		{"snapshot metadata garbage", keySnapMeta, garbage, nil},
		{"legacy snapshot data garbage", keySnapData, []byte("TKS\x01junk"), snapshot},
		{"applied index short", keyApplied, []byte{0, 0, 3}, nil},
		{"applied above commit", keyApplied, encodeUint64(5), nil},
		{"last token missing", keyLastToken, nil, nil},
		{"lock row garbage", lockKey("a"), garbage, loadMachine},
		{"lock row under other key", lockKey("zz"), core.EncodeLockRecord(core.Lock{Key: "a", Token: 1, LeaseMS: 1000}), loadMachine},
		{"lock row token above last token", lockKey("a"), core.EncodeLockRecord(core.Lock{Key: "a", Token: 99, LeaseMS: 1000}), loadMachine},
		{"lock row duplicate token", lockKey("zz"), core.EncodeLockRecord(core.Lock{Key: "zz", Token: 1, LeaseMS: 1000}), loadMachine},
		{"version unknown", keyVersion, encodeUint64(3), nil},
		{"version missing", keyVersion, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkCorruptRow(t, tt.key, tt.value, tt.read) })
	}
}

// checkCorruptRow writes a small store (entries 1..6, commit and applied 4,
// snapshot and compaction at 2), overwrites the row key with value (nil
// deletes it) behind the store's back, and checks that Open, or read on the
// reopened store when read is set, reports ErrCorrupt.
func checkCorruptRow(t *testing.T, key, value []byte, read func(*Store) error) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	m := core.NewMachine()
	run := []core.Command{core.Grant("a", "", 1000, 0), core.Grant("b", "", 1000, 0)}
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 6), HardState: raftpb.HardState{Term: 1, Commit: 4},
		State: applyRun(m, 4, run...)})
	if err := s.CreateSnapshot(2, testConfState, m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	corruptAndCheck(t, dir, key, value, read)
}

// corruptAndCheck overwrites the row key of the closed store in dir with
// value (nil deletes it) behind the store's back, and checks that Open, or
// read on the reopened store when read is set, reports ErrCorrupt.
func corruptAndCheck(t *testing.T, dir string, key, value []byte, read func(*Store) error) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{Logger: newPebbleLogger(testkit.QuietLogger(), nil)})
	if err != nil {
		t.Fatal(err)
	}
	if value == nil {
		err = db.Delete(key, pebble.Sync)
	} else {
		err = db.Set(key, value, pebble.Sync)
	}
	if err := errors.Join(err, db.Close()); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger()})
	if read == nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: err %v, want ErrCorrupt", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s2.Close()
	if err := read(s2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read: err %v, want ErrCorrupt", err)
	}
}

// histogram returns the sample count and sum of the histogram name in reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

func TestStorageFsyncMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := Open(t.TempDir(), StoreOptions{Logger: testkit.QuietLogger(), Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	fsyncs := func() (calls, entries int, total float64) {
		calls64, sum := histogram(t, reg, "ticketd_fsync_entries")
		_, total = histogram(t, reg, "ticketd_fsync_seconds")
		return int(calls64), int(sum), total
	}
	defer s.Close()
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 3)})
	mustWrite(t, s, ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 3}})
	mustWrite(t, s, ReadyWrite{})                         // nothing: not committed, not reported
	_ = s.Write(ReadyWrite{Entries: mkEnts(1, 9, 9)})     // refused: not reported
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 4, 7)}) // 4 entries
	if calls, entries, total := fsyncs(); calls != 3 || entries != 7 || total <= 0 {
		t.Fatalf("fsyncs: %d calls, %d entries, %vs; want 3 calls, 7 entries, >0", calls, entries, total)
	}
	// The state change of durable entries may skip the fsync; entries never do.
	mustWrite(t, s, ReadyWrite{HardState: raftpb.HardState{Term: 1, Commit: 7}, MaySkipSync: true,
		State: &StateChange{Index: 3, LastToken: 0}})
	if calls, _, _ := fsyncs(); calls != 3 {
		t.Fatalf("a MaySkipSync write was fsynced (fsync observed)")
	}
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 8, 8), MaySkipSync: true})
	if calls, _, _ := fsyncs(); calls != 4 {
		t.Fatalf("a write carrying entries skipped its fsync")
	}
	if s.AppliedIndex() != 3 {
		t.Fatalf("applied %d, want 3", s.AppliedIndex())
	}
}

func TestStorageClosed(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Entries(1, 1, 0); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Entries after Close: %v", err)
	}
	if _, err := s.Term(0); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Term after Close: %v", err)
	}
	if err := s.Write(ReadyWrite{Entries: mkEnts(1, 1, 1)}); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if err := s.Compact(1); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Compact after Close: %v", err)
	}
}

// TestStorageConcurrentReaders reads from "the raft goroutine" while
// another goroutine appends, snapshots and compacts. Every read must be
// consistent: the only acceptable error is ErrCompacted (the log moved on
// between FirstIndex and Entries).
// raceReaders starts two readers that, until the returned stop is called,
// read the whole log [FirstIndex, LastIndex] and hand it to check; stop
// waits for them and reports every error.
func raceReaders(t *testing.T, s *Store, check func(fi, li uint64, ents []raftpb.Entry) error) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				fi, _ := s.FirstIndex()
				li, _ := s.LastIndex()
				if li < fi {
					continue
				}
				ents, err := s.Entries(fi, li+1, math.MaxUint64)
				if err == raft.ErrCompacted {
					continue
				}
				if err == nil {
					err = check(fi, li, ents)
				}
				if err != nil {
					errc <- fmt.Errorf("Entries(%d, %d): %w", fi, li+1, err)
					return
				}
			}
		}()
	}
	return func() {
		done.Store(true)
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
	}
}

func TestStorageConcurrentReaders(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	const writes = 300
	stop := raceReaders(t, s, func(fi, li uint64, ents []raftpb.Entry) error {
		for i, e := range ents {
			if e.Index != fi+uint64(i) || e.Term != 1 {
				return fmt.Errorf("entry %d: got index %d term %d", fi+uint64(i), e.Index, e.Term)
			}
		}
		if _, err := s.Term(li); err != nil && err != raft.ErrCompacted {
			return fmt.Errorf("Term(%d): %w", li, err)
		}
		return nil
	})
	for i := uint64(1); i <= writes; i++ {
		if err := s.Write(ReadyWrite{Entries: mkEnts(1, i, i), HardState: raftpb.HardState{Term: 1, Commit: i},
			State: &StateChange{Index: i}}); err != nil {
			t.Fatal(err)
		}
		if i%25 == 0 {
			if err := s.CreateSnapshot(i, testConfState, emptySnapData); err != nil {
				t.Fatal(err)
			}
			if err := s.Compact(i - 5); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop()
}

// testNode is a raft.RawNode over a Store with a minimal Ready loop that
// follows the Store contract.
type testNode struct {
	id      uint64
	dir     string
	st      *Store
	rn      *raft.RawNode
	m       *core.Machine
	applied uint64
	cs      raftpb.ConfState
}

var discardRaftLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

func startTestNode(t *testing.T, id uint64, dir string, peers []uint64) *testNode {
	t.Helper()
	st := openTestStore(t, dir)
	applied, m, cs, err := st.LoadMachine()
	if err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
		Applied: applied, MaxSizePerMsg: 4096, MaxInflightMsgs: 16, Logger: discardRaftLogger})
	if err != nil {
		t.Fatal(err)
	}
	if peers != nil {
		var ps []raft.Peer
		for _, p := range peers {
			ps = append(ps, raft.Peer{ID: p})
		}
		if err := rn.Bootstrap(ps); err != nil {
			t.Fatal(err)
		}
	}
	return &testNode{id: id, dir: dir, st: st, rn: rn, m: m, applied: applied, cs: cs}
}

func (n *testNode) handleReady(t *testing.T) []raftpb.Message {
	t.Helper()
	rd := n.rn.Ready()
	w := ReadyWrite{HardState: rd.HardState, Entries: rd.Entries, Snapshot: rd.Snapshot}
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := n.m.Restore(rd.Snapshot.Data); err != nil {
			t.Fatal(err)
		}
		n.applied, n.cs = rd.Snapshot.Metadata.Index, rd.Snapshot.Metadata.ConfState
	}
	var touched []string
	confChanged, advanced, control := false, false, false
	mark := markRequests(n.m)
	for _, e := range rd.CommittedEntries {
		if e.Index <= n.applied {
			continue
		}
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) > 0 {
				ent, err := core.DecodeEntry(e.Data)
				if err != nil {
					t.Fatal(err)
				}
				n.m.Apply(ent.Command)
				if ent.Command.Kind == core.KindControl {
					control = true
				} else if !slices.Contains(touched, ent.Command.Key) {
					touched = append(touched, ent.Command.Key)
				}
			}
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				t.Fatal(err)
			}
			n.cs = *n.rn.ApplyConfChange(cc)
			confChanged = true
		}
		n.applied, advanced = e.Index, true
	}
	if advanced {
		as := &StateChange{Index: n.applied, LastToken: n.m.LastToken(), Requests: requestChange(n.m, mark)}
		if control {
			as.Control = n.m.ControlSnapshot()
		}
		for _, k := range touched {
			if l, ok := n.m.Get(k); ok {
				as.Put = append(as.Put, l)
			} else {
				as.Delete = append(as.Delete, k)
			}
		}
		if confChanged {
			cs := n.cs
			as.ConfState = &cs
		}
		w.State = as
	}
	if err := n.st.Write(w); err != nil {
		t.Fatalf("node %d: Write: %v", n.id, err)
	}
	n.rn.Advance(rd)
	return rd.Messages
}

type testCluster struct {
	t     *testing.T
	nodes map[uint64]*testNode
	down  map[uint64]bool
}

func (c *testCluster) settle() {
	c.t.Helper()
	var queue []raftpb.Message
	for round := 0; round < 10000; round++ {
		progressed := false
		for id := uint64(1); id <= uint64(len(c.nodes)); id++ {
			n := c.nodes[id]
			for !c.down[id] && n.rn.HasReady() {
				queue = append(queue, n.handleReady(c.t)...)
				progressed = true
			}
		}
		if !progressed && len(queue) == 0 {
			return
		}
		q := queue
		queue = nil
		for _, m := range q {
			if c.down[m.To] || c.down[m.From] {
				continue
			}
			if err := c.nodes[m.To].rn.Step(m); err != nil {
				c.t.Fatalf("step %v to %d: %v", m.Type, m.To, err)
			}
		}
	}
	c.t.Fatal("cluster did not settle")
}

func (c *testCluster) propose(leader uint64, cmds ...core.Command) {
	c.t.Helper()
	for i, cmd := range cmds {
		data := core.EncodeEntry(core.Entry{RequestID: uint64(i + 1), Command: cmd})
		if err := c.nodes[leader].rn.Propose(data); err != nil {
			c.t.Fatalf("propose %v: %v", cmd, err)
		}
	}
	c.settle()
}

func (c *testCluster) token(id uint64, key string) uint64 {
	l, ok := c.nodes[id].m.Get(key)
	if !ok {
		c.t.Fatalf("node %d: %q not held", id, key)
	}
	return l.Token
}

// checkSame asserts that every live node has the same applied index and
// machine, in memory and as persisted in its Store.
func (c *testCluster) checkSame(step string) {
	c.t.Helper()
	ref := c.nodes[1]
	for id, n := range c.nodes {
		if c.down[id] {
			continue
		}
		if n.applied != ref.applied || n.m.Digest() != ref.m.Digest() {
			c.t.Fatalf("%s: node %d applied %d token %d, node 1 applied %d token %d",
				step, id, n.applied, n.m.LastToken(), ref.applied, ref.m.LastToken())
		}
		checkMachine(c.t, fmt.Sprintf("%s node %d", step, id), n.st, n.applied, n.m, n.cs)
	}
}

// TestStorageRaftCluster runs three real raft.RawNodes over Stores: a
// follower misses a stretch of the log, the others snapshot and compact,
// the follower catches up through a snapshot installed by Write, and then
// every node restarts from its Store alone and carries on issuing tokens.
func TestStorageRaftCluster(t *testing.T) {
	peers := []uint64{1, 2, 3}
	dirs := map[uint64]string{}
	c := &testCluster{t: t, nodes: map[uint64]*testNode{}, down: map[uint64]bool{}}
	for _, id := range peers {
		dirs[id] = t.TempDir()
		c.nodes[id] = startTestNode(t, id, dirs[id], peers)
	}
	c.settle()
	if err := c.nodes[1].rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	c.settle()
	if lead := c.nodes[2].rn.Status().Lead; lead != 1 {
		t.Fatalf("leader %d, want 1", lead)
	}
	c.propose(1, core.Grant("a", "o", 1000, 0), core.Grant("b", "o", 1000, 0))
	c.checkSame("after first grants")
	// From here on at cluster version 3, with request ids: the request
	// rows (held ids in lock rows, ended records, the data clock, pruning
	// as the clock passes the retention) travel the same paths.
	c.propose(1, core.SetClusterVersion(3))

	c.down[3] = true
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("k%02d", i)
		at := uint64(i) * core.RequestRetentionMS / 4
		c.propose(1, core.Grant(key, "o", 1000, at).WithRequest("acct", key))
		if i%3 == 0 {
			// Grant and release "hot" in one Ready: its net change is a
			// delete, which the Ready loop must send as Delete only; its
			// ended record is appended (and the oldest pruned) in the same
			// run.
			next := c.nodes[1].m.LastToken() + 1
			c.propose(1, core.Grant("hot", "o", 1000, at).WithRequest("", fmt.Sprintf("hot-%d", i)), core.Release("hot", next),
				core.Release(key, c.token(1, key)))
		}
	}
	if head, next := c.nodes[1].m.EndedSeqs(); head == 0 || next-head < 2 {
		t.Fatalf("the workload should have pruned some ended records and kept some: %d..%d", head, next)
	}
	c.propose(1, core.Release("a", c.token(1, "a")))
	for _, id := range []uint64{1, 2} {
		n := c.nodes[id]
		if err := n.st.CreateSnapshot(n.applied, n.cs, n.m.Snapshot()); err != nil {
			t.Fatal(err)
		}
		if err := n.st.Compact(n.applied); err != nil {
			t.Fatal(err)
		}
	}
	snapIndex := c.nodes[1].applied

	c.down[3] = false
	c.nodes[1].rn.Tick() // heartbeat: the leader finds node 3 behind its first index
	c.settle()
	c.propose(1, core.Grant("after", "o", 1000, 0))
	c.checkSame("after catch-up")
	snap, err := c.nodes[3].st.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap.Metadata.Index != snapIndex {
		t.Fatalf("node 3 snapshot index %d, want %d (caught up through a snapshot)", snap.Metadata.Index, snapIndex)
	}

	lastToken := c.nodes[1].m.LastToken()
	for _, id := range peers {
		if err := c.nodes[id].st.Close(); err != nil {
			t.Fatal(err)
		}
		c.nodes[id] = startTestNode(t, id, dirs[id], nil)
	}
	c.checkSame("after restart")
	if err := c.nodes[2].rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	c.settle()
	c.propose(2, core.Grant("post-restart", "o", 1000, 0))
	c.checkSame("after restart and grant")
	if got := c.token(3, "post-restart"); got != lastToken+1 {
		t.Fatalf("token after restart %d, want %d", got, lastToken+1)
	}
}

// benchWrite measures one Write per iteration carrying perWrite entries of
// 64 bytes and the HardState that commits them (synced unless noSync).
func benchWrite(b *testing.B, perWrite int, noSync bool) {
	s, err := Open(b.TempDir(), StoreOptions{NoSync: noSync, Logger: testkit.QuietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := bytes.Repeat([]byte{'x'}, 64)
	ents := make([]raftpb.Entry, perWrite)
	next := uint64(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range ents {
			ents[j] = raftpb.Entry{Term: 1, Index: next, Data: data}
			next++
		}
		if err := s.Write(ReadyWrite{Entries: ents, HardState: raftpb.HardState{Term: 1, Vote: 1, Commit: next - 1}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perWrite), "ns/entry")
}

// BenchmarkWriteSync: one entry per synced Write, i.e. the cost of an fsync.
func BenchmarkWriteSync(b *testing.B) { benchWrite(b, 1, false) }

// BenchmarkWriteBatch64: 64 entries per synced Write (one fsync amortised).
func BenchmarkWriteBatch64(b *testing.B) { benchWrite(b, 64, false) }

// BenchmarkWriteNoSync: BenchmarkWriteSync without the fsync, the CPU cost
// of a Write; the difference is the fsync.
func BenchmarkWriteNoSync(b *testing.B) { benchWrite(b, 1, true) }

// The snapshot data lives in its own file (format 2): a missing file is
// corruption at Open, a damaged one at Snapshot.
func TestStorageCorruptSnapshotFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
		atOpen bool
	}{
		{"missing", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"garbage", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("TKS\x03junk"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"one bit flipped", func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 1
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			m := core.NewMachine()
			mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 4), HardState: raftpb.HardState{Term: 1, Commit: 4},
				State: applyRun(m, 4, core.Grant("a", "", 1000, 0))})
			if err := s.CreateSnapshot(4, testConfState, m.Snapshot()); err != nil {
				t.Fatal(err)
			}
			path := s.snaps.name(1, 4)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path)
			s2, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger()})
			if tc.atOpen {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open: err %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if _, err := s2.Snapshot(); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Snapshot: err %v, want ErrCorrupt", err)
			}
		})
	}
}

// A store of format 1 (snapshot data in the r/snapdata row) is read as it
// is, and its next snapshot moves it to format 2: data in a file, the row
// deleted, the version row raised, older snapshot files removed.
func TestStorageFormat1Migrates(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	m := core.NewMachine()
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 6), HardState: raftpb.HardState{Term: 1, Commit: 6},
		State: applyRun(m, 4, core.Grant("a", "", 1000, 0))})
	old := m.Snapshot()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Write the rows a format 1 binary would have written for a snapshot
	// at index 4.
	db, err := pebble.Open(dir, &pebble.Options{Logger: newPebbleLogger(testkit.QuietLogger(), nil)})
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	meta := raftpb.SnapshotMetadata{ConfState: testConfState, Index: 4, Term: 1}
	if err := errors.Join(setMarshaled(b, keySnapMeta, &meta), b.Set(keySnapData, old, nil),
		b.Set(keyVersion, encodeUint64(storeFormatVersion1), nil), b.Commit(pebble.Sync), b.Close(), db.Close()); err != nil {
		t.Fatal(err)
	}

	s = openTestStore(t, dir)
	snap, err := s.Snapshot()
	if err != nil || !bytes.Equal(snap.Data, old) || snap.Metadata.Index != 4 {
		t.Fatalf("format 1 snapshot: index %d, err %v", snap.Metadata.Index, err)
	}
	mustWrite(t, s, ReadyWrite{State: applyRun(m, 6, core.Grant("b", "", 1000, 0), core.Grant("c", "", 1000, 0))})
	if err := s.CreateSnapshot(6, testConfState, m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := get(s.db, keySnapData); ok {
		t.Fatal("r/snapdata survived the move to a snapshot file")
	}
	if v, _, _ := get(s.db, keyVersion); !bytes.Equal(v, encodeUint64(storeFormatVersion)) {
		t.Fatalf("format version row %x, want %d", v, storeFormatVersion)
	}
	s = reopen(t, s, dir)
	snap, err = s.Snapshot()
	if err != nil || !bytes.Equal(snap.Data, m.Snapshot()) || snap.Metadata.Index != 6 {
		t.Fatalf("after the move: index %d, err %v", snap.Metadata.Index, err)
	}
	names, err := os.ReadDir(filepath.Join(dir, snapDirName))
	if err != nil || len(names) != 1 {
		t.Fatalf("snapshot directory holds %v (%v), want the one file", names, err)
	}
}

// A second Open of a store that is open (another process on the same data
// folder, or this one) is refused before it touches anything: the running
// store's temporary snapshot file is still there, and the error says what
// to do. Once the first is closed, the store opens again.
func TestOpenRefusesAStoreInUse(t *testing.T) {
	dir := t.TempDir()
	opts := StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}}
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, snapDirName, "0000000000000001-0000000000000009"+snapSuffix+tmpSuffix)
	if err := os.WriteFile(tmp, []byte("being written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(dir, opts); err == nil {
		_ = s2.Close()
		t.Fatal("a second Open of an open store succeeded")
	} else if !strings.Contains(err.Error(), "is in use") || !strings.Contains(err.Error(), "another ticketd") {
		t.Fatalf("second Open: %v, want it to say the store is in use", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the refused Open touched the running store's files: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, opts)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
