package raftstore

import (
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

func TestScanLocks(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	keys := []string{"a", "a/1", "a/2", "a/3", "a0", "b/1", "é/x"}
	var locks []core.Lock
	for i, k := range keys {
		locks = append(locks, core.Lock{Key: k, Token: uint64(i + 1), LeaseMS: 1000})
	}
	cs := raftpb.ConfState{Voters: []uint64{1}}
	mustWrite(t, s, ReadyWrite{Entries: []raftpb.Entry{{Term: 1, Index: 1}}, HardState: raftpb.HardState{Term: 1, Vote: 1, Commit: 1},
		State: &StateChange{Index: 1, LastToken: uint64(len(keys)), Put: locks, ConfState: &cs}})
	tests := []struct {
		prefix, after string
		limit         int
		want          []string
		more          bool
	}{
		{"", "", 100, keys, false},
		{"", "", 3, []string{"a", "a/1", "a/2"}, true},
		{"a/", "", 100, []string{"a/1", "a/2", "a/3"}, false},
		{"a/", "a/1", 1, []string{"a/2"}, true},
		{"a/", "a/2", 1, []string{"a/3"}, false},
		{"a/", "a/3", 10, nil, false},
		{"a/", "b", 10, nil, false},               // after beyond the prefix
		{"a/", "", 0, nil, true},                  // limit 0 reads nothing
		{"b/", "a/9", 10, []string{"b/1"}, false}, // after before the prefix
		{"é", "", 10, []string{"é/x"}, false},
		{"z", "", 10, nil, false},
	}
	for _, tc := range tests {
		p, err := s.ScanLocks(tc.prefix, tc.after, 0, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, l := range p.Locks {
			got = append(got, l.Key)
		}
		if !slices.Equal(got, tc.want) || p.More != tc.more || p.Applied != 1 {
			t.Errorf("scan(%q, %q, %d) = %q more=%v applied=%d; want %q more=%v", tc.prefix, tc.after, tc.limit, got, p.More, p.Applied, tc.want, tc.more)
		}
	}
	if p, _ := s.ScanLocks("a/2", "", 0, 10); len(p.Locks) != 1 || p.Locks[0].Token != 3 {
		t.Errorf("lock record not decoded: %+v", p.Locks)
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{{"", "", false}, {"a", "b", true}, {"a\xff", "b", true}, {"\xff\xff", "", false}} {
		if got, ok := prefixEnd(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("prefixEnd(%q) = %q %v", tc.in, got, ok)
		}
	}
}

// The holders of a multi-holder key come in the page with the locks, in
// key order, together and in token order; a page never splits a key, and
// a key of delayed slots only lists nothing.
func TestScanLocksHolders(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	m := v5Ref(t, s)
	run := []core.Command{
		core.Grant("a", "", 1000, 1),                                                   // 1
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive),                   // 2
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive),                   // 3
		core.Grant("c", "", 1000, 1).WithKind(0, core.ModeShared),                      // 4
		core.Grant("d", "", 1000, 1).WithKind(2, core.ModeExclusive).WithLockDelay(10), // 5
		core.Expire("d", 5),
		core.Grant("e", "", 1000, 1), // 6
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive), // 7
	}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 9}, State: applyRun(m, 9, run...)})
	for _, tc := range []struct {
		after string
		limit int
		want  []uint64
		more  bool
	}{
		{"", 100, []uint64{1, 2, 3, 7, 4, 6}, false},
		{"", 1, []uint64{1}, true},
		{"", 2, []uint64{1}, true},
		{"", 4, []uint64{1, 2, 3, 7}, true},
		{"a", 1, []uint64{2, 3, 7}, true}, // one key alone above the limit
		{"b", 1, []uint64{4}, true},
		{"c", 10, []uint64{6}, false}, // d has only a delayed slot
		{"a", 0, nil, true},
	} {
		p, err := s.ScanLocks("", tc.after, 0, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, l := range p.Locks {
			got = append(got, l.Token)
			if h, ok := m.Holder(l.Key, l.Token); !ok || h != l {
				t.Fatalf("scanned %+v, the machine has %+v", l, h)
			}
		}
		if !slices.Equal(got, tc.want) || p.More != tc.more {
			t.Errorf("scan(after %q, %d) = %v more=%v; want %v more=%v", tc.after, tc.limit, got, p.More, tc.want, tc.more)
		}
	}
}

// TestScanLocksResumeInsideKey: a scan resumed at (key, token) lists
// exactly what a whole listing has after that holder: the key's holders
// with a higher token, then the keys after it, for a cursor at every
// listed holder, under a prefix, and at keys and tokens that are not held.
func TestScanLocksResumeInsideKey(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	m := v5Ref(t, s)
	run := []core.Command{
		core.Grant("a", "", 1000, 1),                                 // 1
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive), // 2
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive), // 3
		core.Grant("c", "", 1000, 1).WithKind(0, core.ModeShared),    // 4
		core.Grant("b", "", 1000, 1).WithKind(3, core.ModeExclusive), // 5
		core.Grant("c", "", 1000, 1).WithKind(0, core.ModeShared),    // 6
		core.Grant("c/x", "", 1000, 1),                               // 7
		core.Release("b", 3),                                         // b holds 2 and 5
		core.Grant("c", "", 1000, 1).WithKind(0, core.ModeShared),    // 8
	}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 10}, State: applyRun(m, 10, run...)})
	tokens := func(p LockPage) []uint64 {
		var got []uint64
		for _, l := range p.Locks {
			got = append(got, l.Token)
		}
		return got
	}
	whole, err := s.ScanLocks("", "", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tokens(whole), []uint64{1, 2, 5, 4, 6, 8, 7}; !slices.Equal(got, want) {
		t.Fatalf("whole listing %v, want %v", got, want)
	}
	for i, l := range whole.Locks {
		p, err := s.ScanLocks("", l.Key, l.Token, 100)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := tokens(p), tokens(LockPage{Locks: whole.Locks[i+1:]}); !slices.Equal(got, want) || p.More {
			t.Errorf("resume at (%q, %d) = %v more=%v; want %v", l.Key, l.Token, got, p.More, want)
		}
	}
	for _, tc := range []struct {
		prefix, after string
		afterToken    uint64
		limit         int
		want          []uint64
		more          bool
	}{
		{"", "b", 1, 100, []uint64{2, 5, 4, 6, 8, 7}, false}, // a token below every holder: the whole key
		{"", "b", 3, 100, []uint64{5, 4, 6, 8, 7}, false},    // a released holder's token
		{"", "b", 9, 100, []uint64{4, 6, 8, 7}, false},       // above every holder: none of the key
		{"", "c", 4, 1, []uint64{6, 8}, true},                // the rest of a key is never split
		{"", "c", 8, 1, []uint64{7}, false},
		{"", "bb", 1, 100, []uint64{4, 6, 8, 7}, false}, // a key not held
		{"c", "c", 6, 100, []uint64{8, 7}, false},       // inside the prefix
		{"c/", "c", 6, 100, []uint64{7}, false},         // after before the prefix
		{"b", "b", 2, 0, nil, true},                     // limit 0 reads nothing
	} {
		p, err := s.ScanLocks(tc.prefix, tc.after, tc.afterToken, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		if got := tokens(p); !slices.Equal(got, tc.want) || p.More != tc.more {
			t.Errorf("scan(%q, after (%q, %d), %d) = %v more=%v; want %v more=%v", tc.prefix, tc.after, tc.afterToken, tc.limit, got, p.More, tc.want, tc.more)
		}
	}
}
