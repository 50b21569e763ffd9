package lockservice

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the lock service's Prometheus collectors. They are registered on
// the registry given to NewMetrics, never on a global one.
type Metrics struct {
	Proposals     *prometheus.CounterVec // by command kind
	ProposalFails *prometheus.CounterVec // by kind and failure class (failureClass)
	Grants        prometheus.Counter
	Releases      prometheus.Counter
	Expiries      *prometheus.CounterVec // by existed=true|false
	Denied        prometheus.Counter
	Abandoned     prometheus.Counter // grants released by the lost-reply path
	Waiters       prometheus.Gauge
	HeldLocks     prometheus.Gauge
	LeaderChanges prometheus.Counter
	IsLeader      prometheus.Gauge
	ApplyLatency  prometheus.Histogram // per Ready batch
	ApplyEntries  prometheus.Histogram // entries per Ready batch
	FsyncLatency  prometheus.Histogram
	FsyncEntries  prometheus.Histogram // raft entries carried by one fsync
	ProposeTime   *prometheus.HistogramVec
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered, useful in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := prometheus.ExponentialBuckets(50e-6, 2, 18) // 50µs .. ~6.5s
	counts := prometheus.ExponentialBuckets(1, 2, 12)      // 1 .. 2048
	m := &Metrics{
		Proposals:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_proposals_total", Help: "Lock commands proposed by this node."}, []string{"kind"}),
		ProposalFails: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_proposal_failures_total", Help: "Proposals that did not apply as a result."}, []string{"kind", "code"}),
		Grants:        prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_total", Help: "Grants applied."}),
		Releases:      prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_releases_total", Help: "Releases applied."}),
		Expiries:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_expiries_total", Help: "Expires applied."}, []string{"existed"}),
		Denied:        prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_denied_total", Help: "Acquires denied by policy before proposing."}),
		Abandoned:     prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_abandoned_total", Help: "Grants released because their reply could not reach the requester."}),
		Waiters:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_waiters", Help: "Acquires waiting in key queues on this leader."}),
		HeldLocks:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_locks_held", Help: "Locks in the applied table."}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_leader_changes_total", Help: "Times this node became or stopped being leader."}),
		IsLeader:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_is_leader", Help: "1 when this node is the ready leader."}),
		ApplyLatency:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_seconds", Help: "Time to apply and persist one Ready's committed entries.", Buckets: latency}),
		ApplyEntries:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_entries", Help: "Committed entries applied per Ready.", Buckets: counts}),
		FsyncLatency:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_seconds", Help: "Duration of one synced Pebble batch commit.", Buckets: latency}),
		FsyncEntries:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_entries", Help: "Raft entries carried by one synced batch.", Buckets: counts}),
		ProposeTime:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ticketd_propose_seconds", Help: "Time from proposal to applied result.", Buckets: latency}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.Proposals, m.ProposalFails, m.Grants, m.Releases, m.Expiries, m.Denied, m.Abandoned,
			m.Waiters, m.HeldLocks, m.LeaderChanges, m.IsLeader, m.ApplyLatency, m.ApplyEntries,
			m.FsyncLatency, m.FsyncEntries, m.ProposeTime)
	}
	return m
}
