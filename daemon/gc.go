package daemon

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The garbage collector's headroom.
//
// With the default GOGC=100 the Go heap may grow to twice what is live
// before the next collection, and the process keeps those pages: at a
// million locks the lock table and the leader's lease timers are about
// 150 MB live, so the node's RSS would carry another 150 MB of headroom
// (docs/benchmarks.md). Both are pointer-free (core/table.go,
// lockservice/leases.go), so a collection never scans them: its work is
// the rest of the heap, which does not grow with the table. tuneGC
// therefore bounds the headroom instead of letting it grow with the table:
// it sets GOGC to 100 × GCHeadroom / live heap, at most 100 (small nodes
// keep the default) and at least minGCPercent. A node then collects as
// often as one with GCHeadroom of live heap would, however large its
// table, and its RSS grows by about the table's own size.
//
// It runs only where the process is the node's own (`ticketd serve` sets
// Options.TuneGC): the GC percent belongs to the whole process, and
// in-process test nodes share theirs. A GOGC set in the environment is the
// operator's choice and is left alone.
const (
	// GCHeadroom is the heap a node lets grow past its live heap between
	// collections once that is above it.
	GCHeadroom = 64 << 20
	// minGCPercent bounds how far down GOGC goes (a 640-MB live heap).
	minGCPercent = 10
	// gcTuneInterval is how often the live heap is looked at.
	gcTuneInterval = time.Second
)

// gcPercentFor is the GOGC that gives live bytes of heap the headroom.
func gcPercentFor(live, headroom uint64) int {
	if live <= headroom {
		return 100
	}
	return max(minGCPercent, int(100*headroom/live))
}

// tuneGC adjusts GOGC to the live heap, for the given headroom, every
// interval until ctx ends, then restores the setting it found.
func tuneGC(ctx context.Context, interval time.Duration, headroom uint64) {
	if os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	current := 100
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return // a runtime without the metric: leave GOGC as it is
		}
		if pct := gcPercentFor(sample[0].Value.Uint64(), headroom); pct != current {
			debug.SetGCPercent(pct)
			current = pct
		}
	}
}
