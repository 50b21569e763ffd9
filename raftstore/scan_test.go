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
		p, err := s.ScanLocks(tc.prefix, tc.after, tc.limit)
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
	if p, _ := s.ScanLocks("a/2", "", 10); len(p.Locks) != 1 || p.Locks[0].Token != 3 {
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
