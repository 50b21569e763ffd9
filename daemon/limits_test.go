package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

// startNodeWith starts a single node with data in dir, its config changed
// by tweak, and waits until it leads at the newest cluster version.
func startNodeWith(t testing.TB, dir string, opts daemon.Options, tweak func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	cfg := daemon.Defaults()
	cfg.Data = dir
	cfg.NATSListen = "127.0.0.1:0"
	cfg.TickMS = testkit.TickMS
	tweak(&cfg)
	if opts.Logger == nil {
		opts.Logger = testkit.QuietLogger()
	}
	d, err := daemon.Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(d.Close)
	testkit.Eventually(t, 10*time.Second, "node leads at the newest cluster version", func() bool { return testcluster.Settled(d) })
	return d
}

// TestQuotaReachedChangesNothing: at --max-locks an acquire gets
// resource_exhausted through the SDK and nothing is proposed; a release
// still works at the quota and makes room.
func TestQuotaReachedChangesNothing(t *testing.T) {
	d := startNodeWith(t, t.TempDir(), daemon.Options{}, func(c *daemon.Config) { c.MaxLocks = 3 })
	_, cl := connect(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var locks []*sdk.Lock
	for i := 0; i < 3; i++ {
		l, err := cl.Acquire(ctx, fmt.Sprintf("k%d", i), sdk.WithLease(time.Minute))
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		locks = append(locks, l)
	}
	before := testcluster.StateOf(d)
	for _, wait := range []time.Duration{0, time.Second} {
		_, err := cl.Acquire(ctx, "k3", sdk.WithLease(time.Minute), sdk.WithWait(wait))
		if !errors.Is(err, sdk.ErrResourceExhausted) || sdk.IsIndeterminate(err) {
			t.Fatalf("acquire over quota (wait %v): %v, want resource_exhausted", wait, err)
		}
	}
	if after := testcluster.StateOf(d); after != before {
		t.Fatalf("a refused acquire changed the state: %+v -> %+v", before, after)
	}
	if err := locks[0].Release(ctx); err != nil {
		t.Fatalf("release at quota: %v", err)
	}
	if _, err := cl.Acquire(ctx, "k3", sdk.WithLease(time.Minute)); err != nil {
		t.Fatalf("acquire after a release: %v", err)
	}
}

// TestLowDiskLeaderHandsOver: a leader whose disk goes below the alarm
// refuses grants, and hands leadership to a follower with room, so the
// cluster keeps granting; the alarm shows in its status.
func TestLowDiskLeaderHandsOver(t *testing.T) {
	disks := []*testkit.FaultFS{testkit.NewFaultFS(), testkit.NewFaultFS(), testkit.NewFaultFS()}
	c := testcluster.New(t, 3, testcluster.WithOptions(func(i int, o *daemon.Options) {
		o.Logger, o.FS = testkit.QuietLogger(), disks[i]
	}))
	leader := c.Leader(10 * time.Second)
	_, cl := connect(t, c.Node(leader))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cl.Acquire(ctx, "before", sdk.WithLease(time.Minute)); err != nil {
		t.Fatal(err)
	}
	disks[leader].SetFree(10 << 20) // below the 256 MiB alarm
	testkit.Eventually(t, 10*time.Second, "the low-disk leader hands leadership over", func() bool {
		l := c.Leader(time.Second)
		return l >= 0 && l != leader
	})
	if err := c.Node(leader).Store().Disk().Err(); err == nil {
		t.Fatal("no alarm on the low disk")
	}
	if _, err := cl.Acquire(ctx, "after", sdk.WithLease(time.Minute)); err != nil {
		t.Fatalf("acquire after the hand-over: %v", err)
	}
}
