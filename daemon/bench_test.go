package daemon_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/sdk"
)

// BenchmarkAcquireRelease measures one acquire+release cycle through NATS
// and the SDK on a single node with fsync on. -cpu sets the parallelism of
// RunParallel (goroutines = GOMAXPROCS × 8 clients).
func BenchmarkAcquireRelease(b *testing.B) {
	d := startNode(b, b.TempDir(), daemon.Options{})
	defer d.Close()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		_, cl := connect(b, d)
		ctx := context.Background()
		id := next.Add(1)
		i := 0
		for pb.Next() {
			key := fmt.Sprintf("bench/%d/%d", id, i%64)
			i++
			l, err := cl.Acquire(ctx, key, sdk.WithLease(10*time.Second))
			if err != nil {
				b.Error(err)
				return
			}
			if err := cl.Release(ctx, key, l.Token); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if b.N > 0 {
		b.ReportMetric(histogramMean(b, d, "ticketd_fsync_entries"), "entries/fsync")
	}
}
