package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	dto "github.com/prometheus/client_model/go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// fakeDisk is the real filesystem with a free-space figure the test sets,
// and, while full is on, ENOSPC on every write of a file other than the
// ballast until the ballast is gone: a disk that filled up, where deleting
// the ballast makes room again.
type fakeDisk struct {
	*errorfs.FS
	avail atomic.Uint64
	full  atomic.Bool
	// enospc counts the writes that met the full disk.
	enospc  atomic.Int64
	ballast string
}

func newFakeDisk(dir string) *fakeDisk {
	d := &fakeDisk{ballast: vfs.Default.PathJoin(dir, "BALLAST")}
	d.avail.Store(10 << 30)
	ballast := d.ballast
	d.FS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !d.full.Load() || op.Path == ballast || op.Kind != errorfs.OpFileWrite && op.Kind != errorfs.OpFileWriteAt {
			return nil
		}
		if _, err := vfs.Default.Stat(ballast); err != nil {
			return nil // the ballast is gone: there is room again
		}
		d.enospc.Add(1)
		return fmt.Errorf("write %s: %w", op.Path, syscall.ENOSPC)
	}))
	return d
}

func (d *fakeDisk) GetDiskUsage(string) (vfs.DiskUsage, error) {
	a := d.avail.Load()
	if d.full.Load() {
		// Full: nothing free but what the ballast gave back.
		a = 0
		if _, err := vfs.Default.Stat(d.ballast); err != nil {
			a = uint64(diskTestOptions.BallastBytes)
		}
	}
	return vfs.DiskUsage{AvailBytes: a, TotalBytes: 100 << 30, UsedBytes: 100<<30 - a}, nil
}

var diskTestOptions = DiskOptions{AlarmBytes: 100 << 20, BallastBytes: 1 << 20, CheckInterval: 5 * time.Millisecond}

// The alarm follows the free space, and its state is what Err says.
func TestDiskAlarmFollowsFreeSpace(t *testing.T) {
	dir := t.TempDir()
	disk := newFakeDisk(dir)
	st, err := Open(dir, StoreOptions{NoSync: true, Logger: testkit.QuietLogger(), FS: disk, Disk: diskTestOptions, Metrics: NewMetrics(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := st.Disk()
	if err := g.Err(); err != nil || !g.hasBallast() {
		t.Fatalf("fresh store: alarm %v, ballast %v", err, g.hasBallast())
	}
	disk.avail.Store(50 << 20)
	testkit.Eventually(t, 5*time.Second, "the alarm below 100 MiB free", func() bool { return errors.Is(g.Err(), ErrNoSpace) })
	if !strings.Contains(g.Err().Error(), "50 MiB free") || testutilGauge(st.metrics) != 1 {
		t.Fatalf("alarm %q, gauge %v", g.Err(), testutilGauge(st.metrics))
	}
	disk.avail.Store(10 << 30)
	testkit.Eventually(t, 5*time.Second, "the alarm clears", func() bool { return g.Err() == nil })
}

// A write that meets a full disk spends the ballast and succeeds; the node
// goes on (releases apply) with the alarm on instead of stopping, and the
// alarm clears once there is room for a ballast again.
func TestDiskFullSpendsBallastNotTheNode(t *testing.T) {
	dir := t.TempDir()
	disk := newFakeDisk(dir)
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
	disk.full.Store(true)
	if _, err := n.Propose(ctx, core.Release("k", a.Result.Token)); err != nil {
		t.Fatalf("release on a full disk: %v (node: %v)", err, n.Err())
	}
	if disk.enospc.Load() == 0 {
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
	disk.full.Store(false)
	testkit.Eventually(t, 5*time.Second, "the alarm clears with a new ballast", func() bool { return st.Disk().Err() == nil })
	if !st.Disk().hasBallast() {
		t.Fatal("no ballast after the alarm cleared")
	}
}

// Open refuses a disk with less than a quarter of the alarm level free,
// at once and with a message that says what to do.
func TestOpenRefusesFullDisk(t *testing.T) {
	dir := t.TempDir()
	disk := newFakeDisk(dir)
	disk.avail.Store(10 << 20)
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
	var failSync atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failSync.Load() && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) && strings.HasSuffix(op.Path, ".log") {
			return errors.New("injected: fsync failed (EIO)")
		}
		return nil
	}))
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	st, err := Open(dir, StoreOptions{Logger: logger, FS: fs, Disk: DiskOptions{BallastBytes: -1}})
	if err != nil {
		t.Fatal(err)
	}
	n := startSingle(t, st, Config{Logger: logger})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	failSync.Store(true)
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
	if len(lines) != 1 || !strings.Contains(lines[0], "fsync failed") {
		t.Fatalf("want one storage-failure line naming the cause, got %q", lines)
	}
	// The store is not closed: Pebble's commit pipeline is broken past a
	// failed WAL sync, as the process would be in production (it exits).
}
