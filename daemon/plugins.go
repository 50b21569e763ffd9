package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Audit defaults.
const (
	// AuditQueueDefault bounds applied commands waiting for audit plugins;
	// beyond it events are dropped and counted, because the raft loop must
	// never wait for a plugin.
	AuditQueueDefault = 1 << 16
	// AuditSubjectPrefix is where audit events are published:
	// ticketd.v1.audit.<event type>.
	AuditSubjectPrefix = protocol.SubjectPrefix + ".audit"
	// AuditCallTimeoutDefault bounds one on_applied call set.
	AuditCallTimeoutDefault = time.Second
)

// AuditEvent is the JSON body published for every plugin event.
type AuditEvent struct {
	Index  uint64          `json:"index"`
	Node   uint64          `json:"node"`
	Plugin string          `json:"plugin"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data"`
}

// AuditDuplicateWindowDefault is how long the audit stream remembers
// Nats-Msg-Id values: every node publishes each event, the stream keeps one.
const AuditDuplicateWindowDefault = 2 * time.Minute

// ensureAuditStream creates or updates the JetStream stream that captures
// audit events published on plain NATS.
func (d *Daemon) ensureAuditStream(ctx context.Context) error {
	js, err := jetstream.New(d.nc)
	if err != nil {
		return fmt.Errorf("daemon: jetstream: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, StartTimeoutDefault)
	defer cancel()
	_, err = js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{
		Name:       d.cfg.AuditStream,
		Subjects:   []string{AuditSubjectPrefix + ".>"},
		Duplicates: AuditDuplicateWindowDefault,
		Storage:    jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("daemon: audit stream %s: %w", d.cfg.AuditStream, err)
	}
	return nil
}

// loadPlugins reads and compiles every module named in cfg.Plugins.
func loadPlugins(ctx context.Context, cfg Config, log *slog.Logger) (*plugins.Set, error) {
	var loaded []*plugins.Plugin
	for _, path := range strings.Split(cfg.Plugins, ",") {
		path = strings.TrimSpace(path)
		if path == "" {
			continue
		}
		wasm, err := os.ReadFile(path)
		if err != nil {
			closeAll(ctx, loaded)
			return nil, configErr("plugin %s: %v", path, err)
		}
		p, err := plugins.Load(ctx, wasm, plugins.Config{
			Name:             strings.TrimSuffix(filepath.Base(path), ".wasm"),
			MemoryLimitPages: cfg.PluginMemoryPages,
			CallTimeout:      time.Duration(cfg.PluginCallTimeoutMS) * time.Millisecond,
			Logger:           log.With("plugin", filepath.Base(path)),
		})
		if err != nil {
			closeAll(ctx, loaded)
			return nil, fmt.Errorf("daemon: load plugin %s: %w", path, err)
		}
		log.Info("plugin loaded", "plugin", p.Name(), "sha256", p.SHA256(), "policy", p.HasPolicy(), "audit", p.HasAudit())
		loaded = append(loaded, p)
	}
	if len(loaded) == 0 {
		return nil, nil
	}
	return plugins.NewSet(loaded...), nil
}

func closeAll(ctx context.Context, ps []*plugins.Plugin) {
	for _, p := range ps {
		_ = p.Close(ctx)
	}
}

// auditor runs audit plugins off the raft loop and publishes their events.
// Every node publishes the events of the entries it applies, so none are
// lost across a leader change; subscribers de-duplicate on the
// Nats-Msg-Id header (index, plugin, position), which JetStream does by
// itself within its duplicate window.
type auditor struct {
	set     *plugins.Set
	nc      *nats.Conn
	node    uint64
	log     *slog.Logger
	queue   chan raftstore.Applied
	dropped prometheus.Counter
	failed  prometheus.Counter
	events  prometheus.Counter
	wg      sync.WaitGroup
	stop    chan struct{}
}

func newAuditor(set *plugins.Set, node uint64, log *slog.Logger, reg prometheus.Registerer) *auditor {
	a := &auditor{
		set:     set,
		node:    node,
		log:     log,
		queue:   make(chan raftstore.Applied, AuditQueueDefault),
		stop:    make(chan struct{}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_dropped_total", Help: "Applied commands not audited because the audit queue was full."}),
		failed:  prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_plugin_failures_total", Help: "on_applied calls that failed."}),
		events:  prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_events_total", Help: "Audit events published."}),
	}
	reg.MustRegister(a.dropped, a.failed, a.events)
	return a
}

// offer queues an applied command; it never blocks the raft loop.
func (a *auditor) offer(ap raftstore.Applied) {
	select {
	case a.queue <- ap:
	default:
		a.dropped.Inc()
	}
}

func (a *auditor) start(nc *nats.Conn) {
	a.nc = nc
	a.wg.Add(1)
	go a.run()
}

func (a *auditor) run() {
	defer a.wg.Done()
	for {
		select {
		case <-a.stop:
			return
		case ap := <-a.queue:
			a.audit(ap)
		}
	}
}

func (a *auditor) audit(ap raftstore.Applied) {
	ctx, cancel := context.WithTimeout(context.Background(), AuditCallTimeoutDefault)
	defer cancel()
	evs, err := a.set.OnApplied(ctx, ap.Index, ap.Command, ap.Result)
	if err != nil {
		a.failed.Inc()
		a.log.Warn("audit plugin failed", "index", ap.Index, "err", err)
	}
	for i, ev := range evs {
		body, err := json.Marshal(AuditEvent{Index: ev.Index, Node: a.node, Plugin: ev.Plugin, Type: ev.Type, Data: ev.Data})
		if err != nil {
			continue
		}
		m := nats.NewMsg(AuditSubjectPrefix + "." + ev.Type)
		m.Data = body
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("%d-%s-%d", ev.Index, ev.Plugin, i))
		if err := a.nc.PublishMsg(m); err != nil {
			a.log.Warn("publish audit event", "index", ev.Index, "err", err)
			continue
		}
		a.events.Inc()
	}
}

func (a *auditor) close() {
	close(a.stop)
	a.wg.Wait()
}
