package lockservice

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/internal/testkit"
)

// quotaSeries gathers ticketd_quota_used and _limit from reg as
// "name/resource" -> value.
func quotaSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ticketd_quota_used" && mf.GetName() != "ticketd_quota_limit" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "resource" {
					out[mf.GetName()+"/"+lp.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestQuotaMetrics: ticketd_quota_used and ticketd_quota_limit follow the
// table and the waiters against the configured limits, the series the
// alerting rules (examples/prometheus) compare.
func TestQuotaMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, _ := newLeader(t, Config{Metrics: NewMetrics(reg), Limits: Limits{MaxLocks: 10, MaxWaiters: 7}})
	for _, k := range []string{"a", "b", "c"} {
		if _, err := acquire(s, "", k, 0); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := acquire(s, "", "a", 5*time.Second); done <- err }()
	want := map[string]float64{
		"ticketd_quota_limit/locks": 10, "ticketd_quota_limit/waiters": 7,
		"ticketd_quota_used/locks": 3, "ticketd_quota_used/waiters": 1,
	}
	testkit.Eventually(t, 5*time.Second, "three locks and one waiter counted", func() bool {
		got := quotaSeries(t, reg)
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return len(got) == len(want)
	})
	s.Close()
	<-done
}
