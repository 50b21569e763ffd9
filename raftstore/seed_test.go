package raftstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// TestSeedStartsANodeFromASnapshot: a seeded store reads back the
// snapshot's state at its index, and a node opened on it leads at once
// as the snapshot's only voter, granting tokens above the snapshot's.
func TestSeedStartsANodeFromASnapshot(t *testing.T) {
	m := core.NewMachine()
	m.Apply(core.Grant("a", "alice", 60_000, 1))
	m.Apply(core.Grant("b", "", 60_000, 2))
	m.Apply(core.Release("a", 1))
	dir := filepath.Join(t.TempDir(), "raft")
	snap := raftpb.Snapshot{Data: m.Snapshot(), Metadata: raftpb.SnapshotMetadata{
		Index: 500, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{7}},
	}}
	if err := Seed(dir, snap, StoreOptions{NoSync: true, Logger: testkit.QuietLogger()}); err != nil {
		t.Fatal(err)
	}
	if err := Seed(dir, snap, StoreOptions{NoSync: true, Logger: testkit.QuietLogger()}); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("seeding a store twice: %v, want ErrNotEmpty", err)
	}

	s := openTestStore(t, dir)
	applied, got, cs, err := s.LoadMachine()
	if err != nil {
		t.Fatal(err)
	}
	if applied != 500 || got.Digest() != m.Digest() || len(cs.Voters) != 1 || cs.Voters[0] != 7 {
		t.Fatalf("loaded applied %d, voters %v, digest equal %v", applied, cs.Voters, got.Digest() == m.Digest())
	}
	hs, _, err := s.InitialState()
	if err != nil || hs.Term != 1 || hs.Commit != 500 {
		t.Fatalf("hard state %+v %v", hs, err)
	}

	n, err := NewNode(Config{ID: 7, Store: s, Logger: testkit.QuietLogger(), TickInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	t.Cleanup(n.Stop)
	testkit.Eventually(t, 10*time.Second, "the seeded node to lead", n.LeaderReady)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := n.Propose(ctx, core.Grant("c", "", 60_000, 3))
	if err != nil || a.Result.Token != m.LastToken()+1 || a.Index <= 500 {
		t.Fatalf("grant after seeding: %+v %v, want token %d above index 500", a, err, m.LastToken()+1)
	}
}

func TestSeedRejects(t *testing.T) {
	good := core.NewMachine().Snapshot()
	meta := raftpb.SnapshotMetadata{Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1}}}
	opts := StoreOptions{NoSync: true, Logger: testkit.QuietLogger()}
	busy := t.TempDir()
	if err := os.WriteFile(filepath.Join(busy, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		dir  string
		snap raftpb.Snapshot
		want error
	}{
		"not empty":  {busy, raftpb.Snapshot{Data: good, Metadata: meta}, ErrNotEmpty},
		"index 0":    {"", raftpb.Snapshot{Data: good, Metadata: raftpb.SnapshotMetadata{Term: 1, ConfState: meta.ConfState}}, ErrInvariant},
		"no voter":   {"", raftpb.Snapshot{Data: good, Metadata: raftpb.SnapshotMetadata{Index: 1, Term: 1}}, ErrInvariant},
		"bad data":   {"", raftpb.Snapshot{Data: []byte("TKS\x02junk"), Metadata: meta}, core.ErrMalformed},
		"empty data": {"", raftpb.Snapshot{Metadata: meta}, core.ErrMalformed},
	} {
		dir := tc.dir
		if dir == "" {
			dir = filepath.Join(t.TempDir(), "raft")
		}
		if err := Seed(dir, tc.snap, opts); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}
