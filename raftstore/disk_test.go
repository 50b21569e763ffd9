package raftstore

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	dto "github.com/prometheus/client_model/go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

var diskTestOptions = DiskOptions{AlarmBytes: 100 << 20, BallastBytes: 1 << 20, CheckInterval: 5 * time.Millisecond}

// The alarm follows the free space, and its state is what Err says.
func TestDiskAlarmFollowsFreeSpace(t *testing.T) {
	dir := t.TempDir()
	disk := testkit.NewFaultFS()
	disk.SetFree(10 << 30)
	st, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), FS: disk, Disk: diskTestOptions, Metrics: NewMetrics(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := st.Disk()
	if err := g.Err(); err != nil || !g.hasBallast() {
		t.Fatalf("fresh store: alarm %v, ballast %v", err, g.hasBallast())
	}
	disk.SetFree(50 << 20)
	testkit.Eventually(t, 5*time.Second, "the alarm below 100 MiB free", func() bool { return errors.Is(g.Err(), ErrNoSpace) })
	if !strings.Contains(g.Err().Error(), "50 MiB free") || testutilGauge(st.metrics) != 1 {
		t.Fatalf("alarm %q, gauge %v", g.Err(), testutilGauge(st.metrics))
	}
	disk.SetFree(10 << 30)
	testkit.Eventually(t, 5*time.Second, "the alarm clears", func() bool { return g.Err() == nil })
}

// A write that meets a full disk spends the ballast and succeeds; the node
// goes on (releases apply) with the alarm on instead of stopping, and the
// alarm clears once there is room for a ballast again.
func TestDiskFullSpendsBallastNotTheNode(t *testing.T) {
	dir := t.TempDir()
	disk := testkit.NewFaultFS()
	disk.SetFree(10 << 30)
	st, err := Open(dir, StoreOptions{Logger: testkit.QuietLogger(), FS: disk, Disk: diskTestOptions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	n := startSingle(t, st, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := n.Propose(ctx, core.Grant("k", "", 60000, 0))
	if err != nil {
		t.Fatal(err)
	}
	disk.SetFull(true)
	if _, err := n.Propose(ctx, core.Release("k", a.Result.Token)); err != nil {
		t.Fatalf("release on a full disk: %v (node: %v)", err, n.Err())
	}
	if disk.ENOSPCs() == 0 {
		t.Fatal("no write met the full disk; the test did not test anything")
	}
	if err := n.Err(); err != nil {
		t.Fatalf("the node stopped: %v", err)
	}
	var ns *NoSpaceError
	if !errors.As(st.Disk().Err(), &ns) || !ns.Full {
		t.Fatalf("alarm %v, want a full-disk alarm", st.Disk().Err())
	}
	// Room again: the ballast is made again and the alarm clears.
	disk.SetFull(false)
	testkit.Eventually(t, 5*time.Second, "the alarm clears with a new ballast", func() bool { return st.Disk().Err() == nil })
	if !st.Disk().hasBallast() {
		t.Fatal("no ballast after the alarm cleared")
	}
}

// Open refuses a disk with less than a quarter of the alarm level free,
// at once and with a message that says what to do.
func TestOpenRefusesFullDisk(t *testing.T) {
	dir := t.TempDir()
	disk := testkit.NewFaultFS()
	disk.SetFree(10 << 20)
	start := time.Now()
	_, err := Open(dir, StoreOptions{Logger: testkit.QuietLogger(), FS: disk, Disk: diskTestOptions})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "free space") {
		t.Fatalf("Open on a full disk: %v, want ErrNoSpace with advice", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusing took %v", d)
	}
}

func testutilGauge(m *Metrics) float64 {
	var out dto.Metric
	if err := m.DiskAlarm.Write(&out); err != nil {
		return -1
	}
	return out.GetGauge().GetValue()
}

// A failed fsync of the log is a hard storage error: the node stops
// (fail-stop) with one clear log line, and the entry it was writing is
// never acknowledged.
func TestFailedFsyncStopsNode(t *testing.T) {
	dir := t.TempDir()
	fs := testkit.NewFaultFS()
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	st, err := Open(dir, StoreOptions{Logger: logger, FS: fs, Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatal(err)
	}
	n := startSingle(t, st, Config{Logger: logger})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fs.SetFailSync(true)
	if _, err := n.Propose(ctx, core.Grant("k", "", 60000, 0)); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("a grant whose log write failed: %v, want indeterminate", err)
	}
	select {
	case <-n.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not stop on a failed fsync")
	}
	var sf *StorageFailure
	if !errors.As(n.Err(), &sf) {
		t.Fatalf("Err() = %v, want a StorageFailure", n.Err())
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "storage failure: stopping the node") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "input/output error") {
		t.Fatalf("want one storage-failure line naming the cause, got %q", lines)
	}
	// The store is not closed: Pebble's commit pipeline is broken past a
	// failed WAL sync, as the process would be in production (it exits).
}

// A snapshot file that fails part-way through its write (the snapshot is
// encoded into it a chunk at a time) is a storage failure like any other:
// the node stops, no snapshot is recorded, and the partial file is gone.
func TestSnapshotWriteFailureStopsNodeAndLeavesNoFile(t *testing.T) {
	dir := t.TempDir()
	prefill(t, dir, 60_000) // about 2 MB of snapshot: more than one chunk
	var armed atomic.Bool
	var writes atomic.Int64
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, snapSuffix+tmpSuffix) && armed.Load() && writes.Add(1) == 2 {
			return errDiskGone
		}
		return nil
	}))
	st, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), FS: fs, Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	n := startSingle(t, st, Config{SnapshotEntries: 1 << 62})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	armed.Store(true)
	n.RequestSnapshot()
	if _, err := n.Propose(ctx, core.Grant("snap/trigger", "", 60000, 0)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	case <-ctx.Done():
		t.Fatal("the node did not stop when its snapshot file could not be written")
	}
	if !errors.Is(n.Err(), errDiskGone) || !strings.Contains(n.Err().Error(), "write snapshot file") {
		t.Fatalf("Err() = %v, want the failed snapshot write", n.Err())
	}
	if writes.Load() < 2 {
		t.Fatalf("%d writes to the snapshot file: the failure was not part-way", writes.Load())
	}
	names, err := vfs.Default.List(filepath.Join(dir, snapDirName))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasSuffix(name, tmpSuffix) || strings.HasSuffix(name, snapSuffix) {
			t.Fatalf("%s left in the snapshot directory", name)
		}
	}
	if snap, err := st.Snapshot(); err != nil || snap.Metadata.Index != 0 {
		t.Fatalf("Snapshot() = index %d, %v; want none recorded", snap.Metadata.Index, err)
	}
}

var errDiskGone = errors.New("disk gone")
