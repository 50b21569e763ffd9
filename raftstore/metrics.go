package raftstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors of the apply and persist path. They
// are registered on the registry given to NewMetrics, never on a global
// one. A nil *Metrics records nothing.
type Metrics struct {
	// ApplyLatency and ApplyEntries observe every Ready that carries
	// committed entries: the time from applying them to their batch being
	// durable, and how many there were.
	ApplyLatency prometheus.Histogram
	ApplyEntries prometheus.Histogram
	// FsyncLatency and FsyncEntries observe every synced batch commit of
	// Store.Write (every commit with StoreOptions.NoSync) and the raft
	// entries it carried.
	FsyncLatency prometheus.Histogram
	FsyncEntries prometheus.Histogram
	// SnapshotLatency and SnapshotBytes observe every snapshot built in
	// the background: the time to encode, write and record it, and its
	// size.
	SnapshotLatency prometheus.Histogram
	SnapshotBytes   prometheus.Gauge
	// TickGap observes the time between two ticks handled by the raft
	// loop: it stays at the tick interval unless the loop stalls (and
	// with it heartbeats and elections).
	TickGap prometheus.Histogram
	// DiskFree and DiskAlarm are the DiskGuard's view: free bytes of the
	// store's filesystem, and 1 while the low-space alarm is on.
	DiskFree  prometheus.Gauge
	DiskAlarm prometheus.Gauge
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered, useful in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := prometheus.ExponentialBuckets(50e-6, 2, 18) // 50µs .. ~6.5s
	counts := prometheus.ExponentialBuckets(1, 2, 12)      // 1 .. 2048
	m := &Metrics{
		ApplyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_seconds", Help: "Time to apply and persist one Ready's committed entries.", Buckets: latency}),
		ApplyEntries: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_entries", Help: "Committed entries applied per Ready.", Buckets: counts}),
		FsyncLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_seconds", Help: "Duration of one synced Pebble batch commit.", Buckets: latency}),
		FsyncEntries: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_entries", Help: "Raft entries carried by one synced batch.", Buckets: counts}),
		SnapshotLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_snapshot_seconds", Help: "Time to build, write and record one snapshot (off the raft loop).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16)}),
		SnapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_snapshot_bytes", Help: "Size of the latest snapshot this node built."}),
		TickGap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_raft_tick_gap_seconds", Help: "Time between two raft ticks handled by the node loop (the tick interval unless the loop stalls).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14)}),
		DiskFree:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_disk_free_bytes", Help: "Free bytes on the filesystem of the raft store."}),
		DiskAlarm: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_disk_alarm", Help: "1 while the store is low on space (grants refused with resource_exhausted)."}),
	}
	if reg != nil {
		reg.MustRegister(m.ApplyLatency, m.ApplyEntries, m.FsyncLatency, m.FsyncEntries, m.SnapshotLatency, m.SnapshotBytes, m.TickGap, m.DiskFree, m.DiskAlarm)
	}
	return m
}

// observeApply records one Ready's apply-and-persist time. Called serially
// by the Ready loop.
func (m *Metrics) observeApply(d time.Duration, entries int) {
	if m == nil {
		return
	}
	m.ApplyLatency.Observe(d.Seconds())
	m.ApplyEntries.Observe(float64(entries))
}

// observeFsync records one synced batch commit. Called by Store writers,
// which are serialised.
func (m *Metrics) observeFsync(d time.Duration, entries int) {
	if m == nil {
		return
	}
	m.FsyncLatency.Observe(d.Seconds())
	m.FsyncEntries.Observe(float64(entries))
}

// observeSnapshot records one background snapshot. Called by the one
// background snapshot goroutine.
func (m *Metrics) observeSnapshot(d time.Duration, bytes int) {
	if m == nil {
		return
	}
	m.SnapshotLatency.Observe(d.Seconds())
	m.SnapshotBytes.Set(float64(bytes))
}

// observeTickGap records the time between two ticks. Called serially by
// the raft loop.
func (m *Metrics) observeTickGap(d time.Duration) {
	if m == nil {
		return
	}
	m.TickGap.Observe(d.Seconds())
}

// observeDisk records a DiskGuard check. Called by the guard's goroutine
// and by the OnDiskFull callback, which Pebble serialises with it only
// loosely; gauges are safe for that.
func (m *Metrics) observeDisk(free uint64, alarm bool) {
	if m == nil {
		return
	}
	m.DiskFree.Set(float64(free))
	if alarm {
		m.DiskAlarm.Set(1)
	} else {
		m.DiskAlarm.Set(0)
	}
}
