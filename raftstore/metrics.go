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
	}
	if reg != nil {
		reg.MustRegister(m.ApplyLatency, m.ApplyEntries, m.FsyncLatency, m.FsyncEntries)
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
