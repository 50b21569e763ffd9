package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
)

// Defaults.
const (
	// QueueDefault bounds applied commands waiting for audit plugins;
	// beyond it events are dropped and counted, because the raft loop must
	// never wait for a plugin.
	QueueDefault = 1 << 16
	// SubjectPrefix is where audit events are published:
	// ticketd.v1.audit.<event type>.
	SubjectPrefix = "ticketd.v1.audit"
	// CallTimeoutDefault bounds one on_applied call set.
	CallTimeoutDefault = time.Second
)

// Event is the JSON body published for every plugin event.
type Event struct {
	Index  uint64          `json:"index"`
	Node   uint64          `json:"node"`
	Plugin string          `json:"plugin"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data"`
}

// Config configures a Publisher.
type Config struct {
	// Auditor runs the audit hooks (a *plugins.Set).
	Auditor plugins.Auditor
	// Node is this node's raft id, carried in every event.
	Node uint64
	// IDKey keys the events' Nats-Msg-Id (msgid.go): every node of a
	// cluster must have the same, and no client may know it.
	// KeyFromSecret derives one from the peer secret, LoadOrCreateKey
	// keeps one for a node without peers. At least MinIDKeySize bytes.
	IDKey  []byte
	Logger *slog.Logger
	// Registerer, if set, gets the ticketd_audit_* counters.
	Registerer prometheus.Registerer
	// QueueSize bounds the queue; 0 means QueueDefault.
	QueueSize int
}

// Publisher runs audit plugins off the raft loop and publishes their
// events. Every node publishes the events of the entries it applies, so
// none are lost across a leader change; subscribers de-duplicate on the
// Nats-Msg-Id header (a keyed MAC of index, plugin and position: the same
// on every node, unpredictable to clients, msgid.go), which JetStream does
// by itself within its duplicate window (EnsureStream).
type Publisher struct {
	auditor plugins.Auditor
	node    uint64
	idKey   []byte
	log     *slog.Logger
	queue   chan raftstore.Applied
	dropped prometheus.Counter
	failed  prometheus.Counter
	events  prometheus.Counter
	nc      *nats.Conn // set by Start, read by run
	wg      sync.WaitGroup
	stop    chan struct{}
	once    sync.Once
}

// NewPublisher returns a Publisher that queues from now on and publishes
// once started. It refuses an IDKey shorter than MinIDKeySize: without a
// secret key a client could predict an event's Nats-Msg-Id and, publishing
// first, make JetStream drop the real event as a duplicate.
func NewPublisher(cfg Config) (*Publisher, error) {
	if len(cfg.IDKey) < MinIDKeySize {
		return nil, fmt.Errorf("audit: IDKey is %d bytes, need at least %d", len(cfg.IDKey), MinIDKeySize)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	size := cfg.QueueSize
	if size <= 0 {
		size = QueueDefault
	}
	p := &Publisher{
		auditor: cfg.Auditor,
		node:    cfg.Node,
		idKey:   append([]byte(nil), cfg.IDKey...),
		log:     log,
		queue:   make(chan raftstore.Applied, size),
		stop:    make(chan struct{}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_dropped_total", Help: "Applied commands not audited because the audit queue was full."}),
		failed:  prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_plugin_failures_total", Help: "on_applied calls that failed."}),
		events:  prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_audit_events_total", Help: "Audit events published."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(p.dropped, p.failed, p.events)
	}
	return p, nil
}

// Offer queues an applied command. It never blocks: it is called on the
// raft loop, and a full queue drops the command (counted in
// ticketd_audit_dropped_total).
func (p *Publisher) Offer(ap raftstore.Applied) {
	select {
	case p.queue <- ap:
	default:
		p.dropped.Inc()
	}
}

// Start runs the plugins on queued commands and publishes their events on
// nc. Call it at most once.
func (p *Publisher) Start(nc *nats.Conn) {
	p.nc = nc
	p.wg.Add(1)
	go p.run()
}

// Close stops publishing; commands still queued are not audited. It is
// safe to call more than once and on a Publisher never started.
func (p *Publisher) Close() {
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
	})
}

func (p *Publisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case ap := <-p.queue:
			p.audit(ap)
		}
	}
}

func (p *Publisher) audit(ap raftstore.Applied) {
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeoutDefault)
	defer cancel()
	cmd := ap.Command
	if cmd.Kind != core.KindGrant && cmd.Kind != core.KindControl {
		// A Renew, Release, Settle, Expire or ClearDelay names no kind: plugins
		// (ABI version 2) see the holder's, which the node read when it
		// applied the command (raftstore.Applied).
		cmd.Limit, cmd.Mode = ap.Limit, ap.Mode
	}
	evs, err := p.auditor.OnApplied(ctx, ap.Index, cmd, ap.Result)
	if err != nil {
		p.failed.Inc()
		p.log.Warn("audit plugin failed", "index", ap.Index, "err", err)
	}
	for i, ev := range evs {
		body, err := json.Marshal(Event{Index: ev.Index, Node: p.node, Plugin: ev.Plugin, Type: ev.Type, Data: ev.Data})
		if err != nil {
			continue
		}
		m := nats.NewMsg(SubjectPrefix + "." + ev.Type)
		m.Data = body
		m.Header.Set(nats.MsgIdHdr, msgID(p.idKey, ev, i))
		if err := p.nc.PublishMsg(m); err != nil {
			p.log.Warn("publish audit event", "index", ev.Index, "err", err)
			continue
		}
		p.events.Inc()
	}
}
