package raftstore

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestTailMirrorsMemoryStorage drives a Store and raft.MemoryStorage with
// random appends (some truncating an uncommitted suffix), commits,
// snapshots and compactions well past the tail's bounds, and compares
// sampled Entries and Term answers, which now mostly come from the tail.
func TestTailMirrorsMemoryStorage(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed))
			mem := raft.NewMemoryStorage()
			s := openTestStore(t, t.TempDir())
			term, commit := uint64(1), uint64(0)
			// 400 operations grow the log past the tail (4096 entries), so
			// the final check below can hold; fewer cannot (-short used 150
			// and failed it every time), and all of them take under a second.
			for op := 0; op < 400; op++ {
				last, _ := mem.LastIndex()
				first, _ := mem.FirstIndex()
				switch r := rng.IntN(10); {
				case r < 7:
					at := last + 1
					if r == 0 && last > commit {
						// A new leader overwrites part of the uncommitted suffix.
						at = commit + 1 + rng.Uint64N(last-commit)
						term++
					}
					n := 1 + rng.IntN(64)
					ents := make([]raftpb.Entry, n)
					for i := range ents {
						size := rng.IntN(64)
						ents[i] = raftpb.Entry{Term: term, Index: at + uint64(i), Data: bytes.Repeat([]byte{byte(op)}, size)}
					}
					if err := errorsAgree(mem.Append(ents), s.Write(ReadyWrite{Entries: ents})); err != nil {
						t.Fatalf("op %d append at %d: %v", op, at, err)
					}
				case r < 9 && last > commit:
					commit += 1 + rng.Uint64N(last-commit)
					hs := raftpb.HardState{Term: term, Commit: commit}
					if err := errorsAgree(mem.SetHardState(hs), s.Write(ReadyWrite{HardState: hs, State: &StateChange{Index: commit}})); err != nil {
						t.Fatalf("op %d commit %d: %v", op, commit, err)
					}
				case op%100 == 99 && commit >= first:
					// Rare, so that the log outgrows the tail and older
					// entries come from Pebble.
					i := first + rng.Uint64N(commit-first+1)
					_, merr := mem.CreateSnapshot(i, &testConfState, emptySnapData)
					if err := errorsAgree(merr, s.CreateSnapshot(i, testConfState, emptySnapData)); err != nil {
						t.Fatalf("op %d snapshot %d: %v", op, i, err)
					}
					if err := errorsAgree(mem.Compact(i), s.Compact(i)); err != nil {
						t.Fatalf("op %d compact %d: %v", op, i, err)
					}
				}
				sampleAgainstMemory(t, fmt.Sprint("op ", op), rng, mem, s)
			}
			if n, first := len(s.st.tail.ents), s.st.tail.first(); n < maxTailEntries/2 || first <= s.st.offset+1 {
				t.Fatalf("tail holds %d entries from %d (log from %d), want at least %d and older entries in Pebble", n, first, s.st.offset+1, maxTailEntries/2)
			}
		})
	}
}

// The tail keeps at most maxTailEntries and maxTailBytes (but always the
// newest entry), and its byte count is exact.
func TestTailBounds(t *testing.T) {
	big := make([]byte, maxTailBytes/3)
	var tl logTail
	next := uint64(1)
	add := func(n int, data []byte) {
		ents := make([]raftpb.Entry, n)
		for i := range ents {
			ents[i] = raftpb.Entry{Term: 1, Index: next, Data: data}
			next++
		}
		tl = tl.appended(ents)
		want := 0
		for i := range tl.ents {
			want += tailCost(&tl.ents[i])
		}
		if tl.bytes != want || len(tl.ents) > maxTailEntries || (tl.bytes > maxTailBytes && len(tl.ents) > 1) {
			t.Fatalf("after %d entries: %d cached, %d bytes counted, %d real", next-1, len(tl.ents), tl.bytes, want)
		}
		if tl.ents[len(tl.ents)-1].Index != next-1 {
			t.Fatalf("newest cached entry %d, want %d", tl.ents[len(tl.ents)-1].Index, next-1)
		}
	}
	add(maxTailEntries+10, nil)
	if len(tl.ents) != maxTailEntries {
		t.Fatalf("%d cached, want %d", len(tl.ents), maxTailEntries)
	}
	add(3, big)
	if len(tl.ents) >= maxTailEntries {
		t.Fatalf("%d cached after three entries of a third of the byte bound each", len(tl.ents))
	}
	add(1, make([]byte, 2*maxTailBytes))
	if len(tl.ents) != 1 {
		t.Fatalf("%d cached after an entry over the byte bound, want only it", len(tl.ents))
	}
	tl = tl.compacted(next)
	if len(tl.ents) != 0 || tl.bytes != 0 {
		t.Fatalf("compacted past the end: %d entries, %d bytes", len(tl.ents), tl.bytes)
	}
}

func errorsAgree(memErr, storeErr error) error {
	if (memErr == nil) != (storeErr == nil) || (memErr != nil && memErr != storeErr) {
		return fmt.Errorf("store error %v, memory error %v", storeErr, memErr)
	}
	return nil
}

// sampleAgainstMemory compares Term at every index near both ends and
// Entries over random ranges and sizes.
func sampleAgainstMemory(t *testing.T, step string, rng *rand.Rand, mem *raft.MemoryStorage, s *Store) {
	t.Helper()
	first, _ := mem.FirstIndex()
	last, _ := mem.LastIndex()
	for i := first - 1; i <= last+1; i++ {
		if i > first+8 && i+8 < last {
			i = last - 8
		}
		mt, merr := mem.Term(i)
		st, serr := s.Term(i)
		if mt != st || merr != serr {
			t.Fatalf("%s: Term(%d) store (%d, %v), memory (%d, %v)", step, i, st, serr, mt, merr)
		}
	}
	for k := 0; k < 20; k++ {
		lo := first - 1 + rng.Uint64N(last-first+3)
		hi := lo + rng.Uint64N(last+2-lo)
		max := []uint64{0, 100, 4096, math.MaxUint64}[rng.IntN(4)]
		me, merr := mem.Entries(lo, hi, max)
		se, serr := s.Entries(lo, hi, max)
		if merr != serr || !entriesEqual(me, se) {
			t.Fatalf("%s: Entries(%d, %d, %d): store %d entries %v, memory %d entries %v", step, lo, hi, max, len(se), serr, len(me), merr)
		}
	}
}

// A slice Entries returned keeps its content when a later write truncates
// and rewrites those indexes, and appending to it does not write into the
// store's tail: readers and raft may hold such slices at any time.
func TestTailSlicesStayValid(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 10)})
	held, err := s.Entries(4, 11, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]raftpb.Entry(nil), held...)
	mustWrite(t, s, ReadyWrite{Entries: mkEnts(2, 6, 12)})
	if !entriesEqual(held, want) {
		t.Fatalf("a held slice changed under a truncation: %v, want %v", held, want)
	}
	front, err := s.Entries(1, 3, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(front, raftpb.Entry{Term: 9, Index: 3})
	got, err := s.Entries(3, 4, math.MaxUint64)
	if err != nil || got[0].Term != 1 {
		t.Fatalf("Entries(3,4) after a caller appended to a returned slice = %v, %v; want term 1", got, err)
	}
}

// Readers racing a writer that appends, truncates and compacts always see
// a contiguous log of the term they expect (run with -race).
func TestTailConcurrentTruncation(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	stop := raceReaders(t, s, func(fi, li uint64, ents []raftpb.Entry) error {
		for i := range ents {
			e := &ents[i]
			if e.Index != fi+uint64(i) || (i > 0 && e.Term < ents[i-1].Term) || len(e.Data) != 1 || uint64(e.Data[0]) != e.Term%256 {
				return fmt.Errorf("entry %d is index %d term %d data %v", i, e.Index, e.Term, e.Data)
			}
		}
		return nil
	})
	mk := func(term, lo, hi uint64) []raftpb.Entry {
		var ents []raftpb.Entry
		for i := lo; i <= hi; i++ {
			ents = append(ents, raftpb.Entry{Term: term, Index: i, Data: []byte{byte(term % 256)}})
		}
		return ents
	}
	commit := uint64(0)
	for term := uint64(1); term <= 200; term++ {
		last, _ := s.LastIndex()
		// Overwrite the uncommitted half of the suffix, then commit part of it.
		at := max(commit+1, last-(last-commit)/2)
		mustWrite(t, s, ReadyWrite{Entries: mk(term, at, at+20)})
		commit = at + 10
		mustWrite(t, s, ReadyWrite{HardState: raftpb.HardState{Term: term, Commit: commit}, State: &StateChange{Index: commit}})
		if term%20 == 0 {
			if err := s.CreateSnapshot(commit, testConfState, emptySnapData); err != nil {
				t.Fatal(err)
			}
			if err := s.Compact(commit - 5); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop()
}
