package lockservice

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the lock service's Prometheus collectors (the apply and fsync
// ones are raftstore.Metrics). They are registered on the registry given
// to NewMetrics, never on a global one.
type Metrics struct {
	Proposals     *prometheus.CounterVec // by command kind
	ProposalFails *prometheus.CounterVec // by kind and failure class (failureClass)
	Grants        prometheus.Counter
	Releases      prometheus.Counter
	Renewals      prometheus.Counter
	Expiries      *prometheus.CounterVec // by existed=true|false
	Denied        prometheus.Counter
	Exhausted     *prometheus.CounterVec // requests refused by a limit, by resource (quota.go)
	// PermissionDenied counts requests the access list refused, by op.
	PermissionDenied *prometheus.CounterVec
	Abandoned        prometheus.Counter // grants released by the lost-reply path
	Waiters          prometheus.Gauge
	HeldLocks        prometheus.Gauge
	LeaderChanges    prometheus.Counter
	IsLeader         prometheus.Gauge
	ProposeTime      *prometheus.HistogramVec
	// ProposalQueue is the proposals waiting for a place in raft
	// (admission.go).
	ProposalQueue prometheus.Gauge
	// quota exports use and limit of the bounded resources (quotametrics.go).
	quota *quotaCollector

	kinds [256]atomic.Pointer[kindMetrics] // by core.Kind (kindmetrics.go)
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered, useful in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := prometheus.ExponentialBuckets(50e-6, 2, 18) // 50µs .. ~6.5s
	m := &Metrics{
		Proposals:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_proposals_total", Help: "Lock commands proposed by this node."}, []string{"kind"}),
		ProposalFails:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_proposal_failures_total", Help: "Proposals that did not apply as a result."}, []string{"kind", "code"}),
		Grants:           prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_total", Help: "Grants applied."}),
		Releases:         prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_releases_total", Help: "Releases applied."}),
		Renewals:         prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_renewals_total", Help: "Renews applied that found their lock."}),
		Expiries:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_expiries_total", Help: "Expires applied."}, []string{"existed"}),
		Denied:           prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_denied_total", Help: "Acquires denied by policy before proposing."}),
		PermissionDenied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_permission_denied_total", Help: "Requests the access list refused, by operation."}, []string{"op"}),
		Exhausted:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketd_resource_exhausted_total", Help: "Requests refused by a limit (nothing proposed), by resource."}, []string{"resource"}),
		Abandoned:        prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_grants_abandoned_total", Help: "Grants released because their reply could not reach the requester."}),
		Waiters:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_waiters", Help: "Acquires waiting in key queues on this leader."}),
		HeldLocks:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_locks_held", Help: "Locks in the applied table."}),
		LeaderChanges:    prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_leader_changes_total", Help: "Times this node became or stopped being leader."}),
		IsLeader:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_is_leader", Help: "1 when this node is the ready leader."}),
		ProposeTime:      prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ticketd_propose_seconds", Help: "Time from proposal to applied result.", Buckets: latency}, []string{"kind"}),
		ProposalQueue:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_proposal_queue", Help: "Proposals waiting for their identity's turn to enter raft."}),
	}
	m.quota = newQuotaCollector(m.HeldLocks, m.Waiters)
	if reg != nil {
		reg.MustRegister(m.quota)
		reg.MustRegister(m.Proposals, m.ProposalFails, m.Grants, m.Releases, m.Renewals, m.Expiries, m.Denied, m.PermissionDenied, m.Exhausted, m.Abandoned,
			m.Waiters, m.HeldLocks, m.LeaderChanges, m.IsLeader, m.ProposeTime, m.ProposalQueue)
	}
	return m
}
