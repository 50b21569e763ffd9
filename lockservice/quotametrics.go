package lockservice

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// quotaCollector exports ticketd_quota_used and ticketd_quota_limit by
// resource ("locks": the lock table against MaxLocks; "waiters": this
// node's waiters against MaxWaiters), the series the alerting rules in
// examples/prometheus compare. Used values are read from the held-locks
// and waiters gauges at scrape time, so the hot paths update one gauge as
// before; limits are set once by New.
type quotaCollector struct {
	held, waiters prometheus.Gauge
	maxLocks      atomic.Int64
	maxWaiters    atomic.Int64
	used, limit   *prometheus.Desc
}

func newQuotaCollector(held, waiters prometheus.Gauge) *quotaCollector {
	return &quotaCollector{
		held: held, waiters: waiters,
		used:  prometheus.NewDesc("ticketd_quota_used", "Use of a bounded resource, by resource (locks: held locks; waiters: this node's waiting acquires).", []string{"resource"}, nil),
		limit: prometheus.NewDesc("ticketd_quota_limit", "Limit of a bounded resource, by resource (--max-locks, --max-waiters).", []string{"resource"}, nil),
	}
}

func (c *quotaCollector) setLimits(l Limits) {
	c.maxLocks.Store(int64(l.MaxLocks))
	c.maxWaiters.Store(int64(l.MaxWaiters))
}

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.used
	ch <- c.limit
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range []struct {
		name  string
		used  prometheus.Gauge
		limit int64
	}{
		{ResourceLocks, c.held, c.maxLocks.Load()},
		{ResourceWaiters, c.waiters, c.maxWaiters.Load()},
	} {
		ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, gaugeValue(r.used), r.name)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(r.limit), r.name)
	}
}

// gaugeValue reads a gauge's current value.
func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil || m.Gauge == nil {
		return 0
	}
	return m.Gauge.GetValue()
}
