package lockservice

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/core"
)

// kindMetrics are one command kind's children of Proposals and
// ProposeTime: looked up by label once per kind, not on every proposal
// (the label hash and map lookup sat on every acquire's and release's path).
type kindMetrics struct {
	proposals prometheus.Counter
	time      prometheus.Observer
}

// forKind returns k's children, creating them on first use. Racing first
// uses are harmless: WithLabelValues returns the same child to each.
func (m *Metrics) forKind(k core.Kind) *kindMetrics {
	slot := &m.kinds[uint8(k)]
	if km := slot.Load(); km != nil {
		return km
	}
	kind := k.String()
	km := &kindMetrics{proposals: m.Proposals.WithLabelValues(kind), time: m.ProposeTime.WithLabelValues(kind)}
	slot.Store(km)
	return km
}
