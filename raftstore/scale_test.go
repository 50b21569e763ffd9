package raftstore

import (
	"bytes"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"

	"github.com/ticketd/ticketd/internal/testkit"
)

// The load paths of a large table (issue 26), at a million locks:
// go test -run xxx -bench 'LoadMachine1M|InstallSnapshot1M' -benchmem ./raftstore

// BenchmarkLoadMachine1M is a restart's load of 1M lock rows, sized from
// the latest snapshot as on a real node.
func BenchmarkLoadMachine1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	prefill(b, dir, n)
	st := openTestStore(b, dir)
	v, err := st.viewState()
	if err != nil {
		b.Fatal(err)
	}
	data, err := encodeSnapshot(v, n, 0, nil)
	_ = v.snap.Close()
	if err != nil {
		b.Fatal(err)
	}
	if err := st.CreateSnapshot(1, raftpb.ConfState{Voters: []uint64{1}}, data); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, m, _, err := st.LoadMachine()
		if err != nil || m.Len() != n {
			b.Fatal(err)
		}
	}
}

// BenchmarkInstallSnapshot1M is a new follower's install of a 1M-lock
// snapshot: the machine restored from it and the store's Write of it
// (rows, data file, metadata; no fsync in the benchmark).
func BenchmarkInstallSnapshot1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	prefill(b, dir, n)
	src := openTestStore(b, dir)
	v, err := src.viewState()
	if err != nil {
		b.Fatal(err)
	}
	data, err := encodeSnapshot(v, n, 0, nil)
	_ = v.snap.Close()
	if err != nil {
		b.Fatal(err)
	}
	snap := raftpb.Snapshot{Data: data, Metadata: raftpb.SnapshotMetadata{Index: 10, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}}}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st, err := Open(b.TempDir(), StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		m := core.NewMachine()
		if err := m.Restore(data); err != nil {
			b.Fatal(err)
		}
		if err := st.Write(ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 2, Commit: 10}}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = st.Close()
		b.StartTimer()
	}
}

// encodeSnapshot is encodeSnapshotTo into memory, for the tests that
// compare a snapshot's bytes: count locks (the machine's count at
// v.applied), in about sizeHint bytes (0: unknown). stop ends it early.
func encodeSnapshot(v *stateView, count, sizeHint int, stop <-chan struct{}) ([]byte, error) {
	if sizeHint <= 0 {
		sizeHint = 48 * count
	}
	var buf bytes.Buffer
	buf.Grow(sizeHint)
	if _, err := encodeSnapshotTo(&buf, v, count, stop); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
