package control_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/sdk"
)

const admin = "restore-test-admin-credential"

// TestRestoreStaticCluster is etcdutl's flow for a static cluster: a
// backup of a running three-node cluster, restored into every member of
// a new static cluster from the same file; the new cluster elects a
// leader, holds the backed-up locks, and issues tokens above the bump.
func TestRestoreStaticCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("two three-node clusters skipped in -short mode")
	}
	withControl := testcluster.WithConfig(func(i int, cfg *daemon.Config) {
		cfg.ControlListen = testkit.FreeAddr(t)
		cfg.ControlCredential = admin
	})
	old := testcluster.New(t, 3, withControl)
	old.Leader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := sdk.New(testkit.Connect(t, old.ClientURL(0)))
	if err != nil {
		t.Fatal(err)
	}
	kept, err := cl.Acquire(ctx, "kept", sdk.WithLease(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := 0; i < 3; i++ {
		urls = append(urls, "http://"+old.Config(i).ControlListen)
	}
	b, _, err := control.SaveBackup(ctx, urls, admin)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
	oldID := storeClusterID(t, old.Config(0).Data)
	newID := control.RestoredClusterID("restore-test", b.Info.SHA256, []uint64{1, 2, 3})
	if oldID == 0 || newID == oldID {
		t.Fatalf("old cluster id %016x, restored %016x: want both set and different", oldID, newID)
	}

	nu := testcluster.New(t, 3, withControl, testcluster.Unstarted())
	for i := 0; i < 3; i++ {
		cfg := nu.Config(i)
		res, err := control.Restore(b, control.RestoreOptions{
			DataDir: cfg.Data, StoreDir: filepath.Join(cfg.Data, daemon.StoreDir),
			ID: cfg.ID, Voters: []uint64{1, 2, 3}, BumpTokens: 1000, Logger: testkit.QuietLogger(), ClusterID: newID,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Mode != control.RestoreStatic || res.FirstToken != b.Info.LastToken+1001 {
			t.Fatalf("restored %+v", res)
		}
		if got := storeClusterID(t, cfg.Data); got != newID {
			t.Fatalf("restored store records cluster id %016x, want %016x", got, newID)
		}
		if err := nu.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	nu.Leader(10 * time.Second)
	ncl, err := sdk.New(testkit.Connect(t, nu.ClientURL(1)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := ncl.Get(ctx, "kept")
	if err != nil || !h.Held || h.Token != kept.Token {
		t.Fatalf("kept after restore: %+v %v", h, err)
	}
	l, err := ncl.Acquire(ctx, "new", sdk.WithLease(time.Second))
	if err != nil || l.Token != b.Info.LastToken+1001 {
		t.Fatalf("first grant of the new cluster: %+v %v, want token %d", l, err, b.Info.LastToken+1001)
	}
	nu.Converged(10 * time.Second)
}

// storeClusterID reads the cluster ID recorded in a stopped node's store.
func storeClusterID(t *testing.T, data string) uint64 {
	t.Helper()
	s, err := raftstore.Open(filepath.Join(data, daemon.StoreDir), raftstore.StoreOptions{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id, _, err := s.ClusterID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}
