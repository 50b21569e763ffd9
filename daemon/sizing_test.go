package daemon_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/sdk"
)

// heap is the live Go heap after a full collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func dirSize(t *testing.T, dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSizing measures what docs/operations.md quotes: memory, disk and
// snapshot bytes per held lock on a single node with fsync on, and the size
// of one log entry. Opt-in, since it takes N grants:
//
//	TICKETD_SIZING_LOCKS=100000 go test -run TestSizing -v ./daemon/
//
// Keys are "sizing/%08d" (15 bytes) and owners "worker-%d" (8-9 bytes),
// leases one hour.
func TestSizing(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TICKETD_SIZING_LOCKS"))
	if n <= 0 {
		t.Skip("set TICKETD_SIZING_LOCKS=N to measure memory, disk and snapshot size at N held locks")
	}
	key := func(i int) string { return fmt.Sprintf("sizing/%08d", i) }
	owner := func(i int) string { return fmt.Sprintf("worker-%d", i%100) }

	// The lock table alone.
	before := heap()
	m := core.NewMachine()
	for i := 0; i < n; i++ {
		m.Apply(core.Grant(key(i), owner(i), 3_600_000, uint64(time.Now().UnixMilli())))
	}
	tableBytes := heap() - before
	runtime.KeepAlive(m)
	m = nil

	// One log entry as raft stores it.
	data := core.EncodeEntry(core.Entry{RequestID: 1 << 62, Command: core.Grant(key(1), owner(1), 3_600_000, uint64(time.Now().UnixMilli()))})
	ent := raftpb.Entry{Term: 5, Index: 123456, Type: raftpb.EntryNormal, Data: data}

	// A running node.
	dir := t.TempDir()
	base := heap()
	d := startNodeWith(t, dir, daemon.Options{}, func(*daemon.Config) {})
	started := heap()
	ctx := t.Context()
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := sdk.Connect(d.ClientURL())
			if err != nil {
				t.Error(err)
				return
			}
			defer cl.Close()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if _, err := cl.Acquire(ctx, key(i), sdk.WithLease(time.Hour), sdk.WithOwner(owner(i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	held := heap()
	var snap []byte
	snapStart := time.Now()
	d.Node().View(func(m *core.Machine) { snap = m.Snapshot() })
	snapTook := time.Since(snapStart)
	info := control.BackupInfo{LastToken: uint64(n), Locks: n, ClusterVersion: core.MaxClusterVersion}
	backup, err := control.EncodeBackup(info, snap, control.NewBackupKey("sizing-test-credential"))
	if err != nil {
		t.Fatal(err)
	}
	disk := dirSize(t, filepath.Join(dir, daemon.StoreDir))

	t.Logf("%d locks granted in %v (%.0f/s, 32 clients, fsync on)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	t.Logf("lock table alone (core.Machine): %d B per lock", tableBytes/uint64(n))
	t.Logf("node heap: %.1f MiB started, %.1f MiB at %d locks: %d B per lock",
		float64(started-base)/(1<<20), float64(held-base)/(1<<20), n, (held-started)/uint64(n))
	t.Logf("log entry: %d B command, %d B as a raft entry", len(data), ent.Size())
	t.Logf("store on disk: %.1f MiB at %d locks (%d B per lock; log compacted behind each snapshot)", float64(disk)/(1<<20), n, disk/int64(n))
	t.Logf("snapshot: %d B (%d B per lock), encoded in %v; backup file %d B", len(snap), len(snap)/n, snapTook.Round(time.Millisecond), len(backup))
}
