package peer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// statsCollector exports Transport.Stats at scrape time.
type statsCollector struct {
	t                                               *Transport
	connected, sent, dropped, received              *prometheus.Desc
	snapsSent, snapsFailed, handshakeFail, rejected *prometheus.Desc
}

// Collector returns a Prometheus collector of t's counters, read when
// Prometheus scrapes: per peer, whether the connection is up, messages
// sent, dropped and received, and snapshots sent and failed; and the
// handshakes and messages refused.
func Collector(t *Transport) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &statsCollector{
		t:             t,
		connected:     d("ticketd_peer_connected", "1 while the outbound connection to the peer is authenticated and up.", "peer"),
		sent:          d("ticketd_peer_messages_sent_total", "Raft messages written to the peer.", "peer"),
		dropped:       d("ticketd_peer_messages_dropped_total", "Raft messages to the peer given up (queue full, not connected, write failed).", "peer"),
		received:      d("ticketd_peer_messages_received_total", "Raft messages from the peer delivered to raft.", "peer"),
		snapsSent:     d("ticketd_peer_snapshots_sent_total", "Snapshots sent to the peer and acknowledged.", "peer"),
		snapsFailed:   d("ticketd_peer_snapshot_failures_total", "Snapshots to the peer that failed.", "peer"),
		handshakeFail: d("ticketd_peer_handshake_failures_total", "Inbound connections refused before or during authentication."),
		rejected:      d("ticketd_peer_rejected_total", "Inbound messages refused after authentication."),
	}
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.connected, c.sent, c.dropped, c.received, c.snapsSent, c.snapsFailed, c.handshakeFail, c.rejected} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; Stats is safe to call
// concurrently.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.t.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for id, p := range st.Peers {
		peer := strconv.FormatUint(id, 10)
		up := 0.0
		if p.Connected {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up, peer)
		counter(c.sent, p.Sent, peer)
		counter(c.dropped, p.Dropped, peer)
		counter(c.received, p.Received, peer)
		counter(c.snapsSent, p.SnapshotsSent, peer)
		counter(c.snapsFailed, p.SnapshotsFailed, peer)
	}
	counter(c.handshakeFail, st.HandshakeFailures)
	counter(c.rejected, st.Rejected)
}
