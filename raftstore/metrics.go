package raftstore

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
)

// Metrics are the Prometheus collectors of the apply and persist path and
// of the node's lifecycle events. They are registered on the registry
// given to NewMetrics, never on a global one. A nil *Metrics records
// nothing. NodeCollector adds the node's raft state, read at scrape time.
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
	// LeaderChanges counts the leaders this node saw elected (a change of
	// the leader it knows to another, non-zero one).
	LeaderChanges prometheus.Counter
	// SnapshotsTaken and SnapshotFailures count the snapshots this node
	// recorded and the attempts that failed; SnapshotsRestored the
	// snapshots received from a leader that replaced its state.
	SnapshotsTaken    prometheus.Counter
	SnapshotFailures  prometheus.Counter
	SnapshotsRestored prometheus.Counter
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
		ApplyLatency:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_seconds", Help: "Time to apply and persist one Ready's committed entries.", Buckets: latency}),
		ApplyEntries:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_apply_batch_entries", Help: "Committed entries applied per Ready.", Buckets: counts}),
		FsyncLatency:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_seconds", Help: "Duration of one synced Pebble batch commit.", Buckets: latency}),
		FsyncEntries:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_fsync_entries", Help: "Raft entries carried by one synced batch.", Buckets: counts}),
		LeaderChanges:     prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_raft_leader_changes_total", Help: "Leaders this node saw elected."}),
		SnapshotsTaken:    prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_snapshots_taken_total", Help: "Snapshots this node recorded."}),
		SnapshotFailures:  prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_snapshot_failures_total", Help: "Snapshots this node failed to record or compact behind."}),
		SnapshotsRestored: prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_snapshots_restored_total", Help: "Snapshots from a leader that replaced this node's state."}),
		SnapshotLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_snapshot_seconds", Help: "Time to build, write and record one snapshot (off the raft loop).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16)}),
		SnapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_snapshot_bytes", Help: "Size of the latest snapshot this node built."}),
		TickGap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ticketd_raft_tick_gap_seconds", Help: "Time between two raft ticks handled by the node loop (the tick interval unless the loop stalls).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14)}),
		DiskFree:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_disk_free_bytes", Help: "Free bytes on the filesystem of the raft store."}),
		DiskAlarm: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ticketd_disk_alarm", Help: "1 while the store is low on space (grants refused with resource_exhausted)."}),
	}
	if reg != nil {
		reg.MustRegister(m.ApplyLatency, m.ApplyEntries, m.FsyncLatency, m.FsyncEntries,
			m.LeaderChanges, m.SnapshotsTaken, m.SnapshotFailures, m.SnapshotsRestored,
			m.SnapshotLatency, m.SnapshotBytes, m.TickGap, m.DiskFree, m.DiskAlarm)
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

// Lifecycle events, counted by the Ready loop.
func (m *Metrics) leaderElected() {
	if m != nil {
		m.LeaderChanges.Inc()
	}
}

func (m *Metrics) snapshotTaken() {
	if m != nil {
		m.SnapshotsTaken.Inc()
	}
}

func (m *Metrics) snapshotFailed() {
	if m != nil {
		m.SnapshotFailures.Inc()
	}
}

func (m *Metrics) snapshotRestored() {
	if m != nil {
		m.SnapshotsRestored.Inc()
	}
}

// nodeCollector exports a node's raft state, read when Prometheus scrapes.
type nodeCollector struct {
	n                                          *Node
	up, term, commit, applied, leader, hasLead *prometheus.Desc
	members, followerLag                       *prometheus.Desc
	readRounds, reads                          *prometheus.Desc
}

// NodeCollector returns a collector of n's raft state at scrape time:
// whether its loop runs, its term, commit and applied indexes, the leader
// it knows, its membership, and, on the leader, how far each follower's
// log is behind its own.
func NodeCollector(n *Node) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &nodeCollector{
		n:           n,
		up:          d("ticketd_raft_up", "1 while the raft loop runs, 0 once it stopped on an error."),
		term:        d("ticketd_raft_term", "Current raft term."),
		commit:      d("ticketd_raft_commit_index", "Highest log index this node knows committed."),
		applied:     d("ticketd_raft_applied_index", "Highest log index applied and durable on this node."),
		leader:      d("ticketd_raft_leader_id", "Raft id of the leader this node knows (0: none)."),
		hasLead:     d("ticketd_raft_has_leader", "1 when this node knows a leader."),
		members:     d("ticketd_raft_members", "Raft members by role.", "role"),
		followerLag: d("ticketd_raft_follower_lag_entries", "On the leader: entries its log is ahead of a follower's acknowledged log.", "follower"),
		readRounds:  d("ticketd_read_index_rounds_total", "Raft ReadIndex rounds this node issued (one heartbeat broadcast each)."),
		reads:       d("ticketd_read_index_reads_total", "Linearizable reads (gets, lists, session keepalives) that waited for a ReadIndex round on this node."),
	}
}

// Describe implements prometheus.Collector.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.term, c.commit, c.applied, c.leader, c.hasLead, c.members, c.followerLag, c.readRounds, c.reads} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Called concurrently by
// scrapes; it reads the node through its concurrency-safe accessors.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	n := c.n
	up := 1.0
	if n.Err() != nil {
		up = 0
	}
	gauge(c.up, up)
	st := n.Status()
	gauge(c.term, float64(st.Term))
	gauge(c.commit, float64(st.Commit))
	gauge(c.applied, float64(n.AppliedIndex()))
	gauge(c.leader, float64(st.Lead))
	hasLead := 0.0
	if st.Lead != 0 {
		hasLead = 1
	}
	gauge(c.hasLead, hasLead)
	cs := n.ConfState()
	gauge(c.members, float64(len(cs.Voters)), "voter")
	gauge(c.members, float64(len(cs.Learners)), "learner")
	rounds, reads := n.ReadIndexRounds()
	ch <- prometheus.MustNewConstMetric(c.readRounds, prometheus.CounterValue, float64(rounds))
	ch <- prometheus.MustNewConstMetric(c.reads, prometheus.CounterValue, float64(reads))
	if st.RaftState != raft.StateLeader {
		return
	}
	own := st.Progress[st.ID].Match
	for id, pr := range st.Progress {
		if id == st.ID {
			continue
		}
		lag := 0.0
		if own > pr.Match {
			lag = float64(own - pr.Match)
		}
		gauge(c.followerLag, lag, strconv.FormatUint(id, 10))
	}
}
