package core

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"
)

// check verifies the table's invariants: every live record is found
// through the index under its own key, the index names exactly the live
// records, the counts agree, identity references match the records, and
// the dead-byte count matches the arena.
func (t *lockTable) check(tb testing.TB) {
	tb.Helper()
	live, liveBytes := 0, 0
	refs := map[uint32]int{}
	for i := range t.recs {
		r := &t.recs[i]
		if r.keyLen == 0 {
			continue
		}
		live++
		liveBytes += r.size()
		refs[r.identity]++
		if j, _ := t.find(t.keyOf(r)); j != i {
			tb.Fatalf("record %d (%q) found as %d", i, t.keyOf(r), j)
		}
	}
	inIndex := 0
	for _, e := range t.index {
		if e != 0 {
			inIndex++
		}
	}
	if live != t.n || inIndex != t.n || live+len(t.free) != len(t.recs) {
		tb.Fatalf("%d live records, n %d, %d in the index, %d free of %d", live, t.n, inIndex, len(t.free), len(t.recs))
	}
	if liveBytes+t.dead != len(t.arena) {
		tb.Fatalf("arena %d bytes: %d live + %d dead", len(t.arena), liveBytes, t.dead)
	}
	t.idents.Each(func(id uint32, name string, n int) {
		if n != refs[id] {
			tb.Fatalf("identity %d (%q): %d refs, %d records", id, name, n, refs[id])
		}
	})
}

// TestLockTableAgainstMap runs random puts (new locks, renewals, owner and
// identity changes) and deletions on the table and on a map[string]Lock
// and compares them (request ids set, changed and cleared too), with the
// table's invariants checked as it goes. The
// keys are few and varied in length, so deletions shift probe runs back,
// the index grows, and the arena is compacted many times. Strings handed
// out earlier must keep their bytes through all of it.
func TestLockTableAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tab := newLockTable(0)
	model := map[string]Lock{}
	keys := make([]string, 4000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k/%d/%s", i, strings.Repeat("é", i%60))
	}
	owners := []string{"", "w", "worker-17", strings.Repeat("o", MaxOwnerLen)}
	idents := []string{"", "A", "B/user", strings.Repeat("i", MaxIdentityLen)}
	reqIDs := []string{"", "", "r-1", strings.Repeat("q", MaxRequestIDLen)}
	type held struct {
		s, want string
	}
	var kept []held // strings handed out earlier, and what they said
	steps := 60000
	if testing.Short() {
		steps = 15000
	}
	token := uint64(0)
	for step := 0; step < steps; step++ {
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(10); {
		case op < 5:
			l, ok := model[key]
			if !ok || rng.IntN(3) == 0 {
				token++
				l = Lock{Key: key, Token: token, GrantedAtMS: uint64(step)}
			}
			l.Owner = owners[rng.IntN(len(owners))]
			l.Identity = idents[rng.IntN(len(idents))]
			l.RequestID = reqIDs[rng.IntN(len(reqIDs))]
			l.LeaseMS = uint64(100 + rng.IntN(1000))
			old, replaced := tab.put(l)
			if prev, ok := model[key]; ok != replaced || ok && old != prev {
				t.Fatalf("step %d: put(%q) replaced %v %+v, model %v %+v", step, key, replaced, old, ok, prev)
			}
			model[key] = l
		case op < 9:
			old, ok := tab.del(key)
			if prev, was := model[key]; was != ok || was && old != prev {
				t.Fatalf("step %d: del(%q) = %+v %v, model %+v %v", step, key, old, ok, prev, was)
			}
			delete(model, key)
		default:
			got, ok := tab.get(key)
			if prev, was := model[key]; was != ok || got != prev {
				t.Fatalf("step %d: get(%q) = %+v %v, model %+v %v", step, key, got, ok, prev, was)
			}
			if ok && len(kept) < 2000 {
				kept = append(kept, held{got.Key, strings.Clone(got.Key)}, held{got.Owner, strings.Clone(got.Owner)},
					held{got.RequestID, strings.Clone(got.RequestID)})
			}
		}
		if step%4999 == 0 || step == steps-1 {
			tab.check(t)
			seen := 0
			tab.forEach(func(l Lock) {
				seen++
				if model[l.Key] != l {
					t.Fatalf("step %d: forEach gave %+v, model %+v", step, l, model[l.Key])
				}
			})
			if seen != len(model) || tab.len() != len(model) {
				t.Fatalf("step %d: %d locks, model %d", step, seen, len(model))
			}
			for _, h := range kept {
				if h.s != h.want {
					t.Fatalf("a string handed out earlier changed: %q, was %q", h.s, h.want)
				}
			}
		}
	}
}

// TestLockTableMemory: about 70 bytes a lock with short keys and owners,
// in a fixed number of pointer-free blocks.
func TestLockTableMemory(t *testing.T) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("lock/%07d", i)
	}
	var tab *lockTable
	fill := func() {
		tab = newLockTable(n)
		for i, k := range keys {
			tab.put(Lock{Key: k, Token: uint64(i + 1), Owner: "owner-42", LeaseMS: 60_000})
		}
	}
	if allocs := testing.AllocsPerRun(2, fill); allocs > 20 {
		t.Fatalf("filling %d locks made %.0f allocations", n, allocs)
	}
	bytes := int(unsafe.Sizeof(lockRec{}))*cap(tab.recs) + 4*len(tab.index) + cap(tab.arena)
	t.Logf("%d bytes per lock (12-byte keys, 8-byte owners)", bytes/n)
	if bytes/n > 90 {
		t.Fatalf("%d bytes per lock", bytes/n)
	}
}

// benchSnapshot1M is a snapshot of a million locks with the big test's
// key and owner shapes.
func benchSnapshot1M(b *testing.B) []byte {
	locks := make([]Lock, 1_000_000)
	for i := range locks {
		locks[i] = Lock{Key: fmt.Sprintf("lock/%07d", i), Token: uint64(i + 1), Owner: fmt.Sprintf("owner-%d", i%1000),
			LeaseMS: 86_400_000, GrantedAtMS: 1767225600000}
	}
	return EncodeSnapshot(uint64(len(locks)), locks)
}

// BenchmarkRestore1M is a follower's restore of a 1M-lock snapshot into
// its machine (core/load.go).
func BenchmarkRestore1M(b *testing.B) {
	data := benchSnapshot1M(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := NewMachine().Restore(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRestoreState1M is the same through DecodeSnapshotState and
// RestoreState: a []Lock and two strings per lock on the way.
func BenchmarkRestoreState1M(b *testing.B) {
	data := benchSnapshot1M(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		s, err := DecodeSnapshotState(data)
		if err != nil {
			b.Fatal(err)
		}
		NewMachine().RestoreState(s)
	}
}
