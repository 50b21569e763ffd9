package natsapi

import (
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Watch events (docs/protocol.md, watch): every node publishes a
// protocol.WatchEvent on protocol.WatchSubject(key) for each Grant,
// Release, Expire that removed a lock, and Renew it applies, for each lock
// a session's close or expiry ended, and for each key whose lock-delay
// ended (ClearDelay), after the
// apply, with the entry's index and the lock's token (and, for a holder of
// a semaphore or a shared hold, its limit and mode). A watcher therefore
// sees each event up to once per node and drops repeats by index.
//
// The raft loop never waits for NATS: the observer only offers each event
// to a bounded buffer, and one goroutine publishes them. When the buffer
// is full (NATS slower than the apply rate, or disconnected) events are
// dropped and counted in ticketd_watch_events_dropped_total; watchers
// detect the gap by index and read the key again with get.
//
// With an Interest function (the daemon gives one for its embedded
// server, see Start), an event nobody could receive is not encoded or published: on
// a cluster without watchers that is a JSON encoding and a trip through
// the NATS server per applied change on every node, all of it dropped.

// WatchBufferDefault bounds the events waiting to be published.
const WatchBufferDefault = 8192

// WatchConfig configures a WatchPublisher.
type WatchConfig struct {
	// Node is this node's raft id, carried in every event.
	Node   uint64
	Logger *slog.Logger
	// Registerer, if set, receives the publisher's counters.
	Registerer prometheus.Registerer
	// Buffer bounds the events waiting to be published
	// (WatchBufferDefault).
	Buffer int
}

// Interest reports whether a message published on subject now would reach
// any subscriber. It must answer as the NATS server would route the
// message (local, route, leafnode and import interest) and must not block.
type Interest func(subject string) bool

// WatchPublisher publishes the watch events of one node.
type WatchPublisher struct {
	node      uint64
	log       *slog.Logger
	events    chan protocol.WatchEvent
	published prometheus.Counter
	dropped   prometheus.Counter
	skipped   prometheus.Counter

	startOnce, stopOnce sync.Once
	stop                chan struct{}
	done                chan struct{}
}

// NewWatchPublisher creates a publisher; register Observer on the raft
// node, then Start it once NATS is connected. Events applied before Start
// wait in the buffer.
func NewWatchPublisher(cfg WatchConfig) *WatchPublisher {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = WatchBufferDefault
	}
	w := &WatchPublisher{
		node:      cfg.Node,
		log:       cfg.Logger,
		events:    make(chan protocol.WatchEvent, cfg.Buffer),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_watch_events_published_total", Help: "Watch events this node published."}),
		dropped:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_watch_events_dropped_total", Help: "Watch events dropped because the publish buffer was full or the publish failed."}),
		skipped:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketd_watch_events_skipped_total", Help: "Watch events not published because no subscriber could receive them."}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(w.published, w.dropped, w.skipped)
	}
	return w
}

// Observer is the raft observer that feeds the publisher.
func (w *WatchPublisher) Observer() raftstore.Observer {
	return raftstore.ObserverFuncs{Applied: w.offer}
}

// offer queues a's event, if it has one, without blocking (called
// serially, from the raft loop).
func (w *WatchPublisher) offer(a raftstore.Applied) {
	if ev, ok := watchEvent(a); ok {
		w.offerOne(ev)
		return
	}
	// A session's close or expiry ends every lock of it in one command:
	// one event per lock it ended (a.Ended), each with the session and
	// the ended lock's token, so that a watcher can tell which holder of
	// the key ended without reading it.
	typ := ""
	switch {
	case a.Result.Kind == core.ResultSessionClosed:
		typ = protocol.EventRelease
	case a.Result.Kind == core.ResultSessionExpired && a.Result.Existed:
		typ = protocol.EventExpire
	default:
		return
	}
	session := protocol.FormatSessionID(a.Command.SessionID)
	for _, l := range a.Ended {
		w.offerOne(protocol.WatchEvent{Key: l.Key, Type: typ, Token: l.Token, Session: session, Index: a.Index,
			Limit: l.Limit, Mode: protocol.ModeName(l.Mode)})
	}
}

func (w *WatchPublisher) offerOne(ev protocol.WatchEvent) {
	ev.Node = w.node
	select {
	case w.events <- ev:
	default:
		w.dropped.Inc()
	}
}

// watchEvent is the event of an applied command; ok is false for a
// command that changed no lock.
func watchEvent(a raftstore.Applied) (protocol.WatchEvent, bool) {
	c := a.Command
	ev := protocol.WatchEvent{Key: c.Key, Index: a.Index, Token: c.Token}
	switch a.Result.Kind {
	case core.ResultGranted:
		ev.Type, ev.Token, ev.Owner, ev.LeaseMS = protocol.EventGrant, a.Result.Token, c.Owner, int64(a.LeaseMS)
		if c.SessionID != 0 {
			ev.Session = protocol.FormatSessionID(c.SessionID)
		}
	case core.ResultDelayCleared:
		ev.Type = protocol.EventDelayEnd
	case core.ResultRenewed:
		ev.Type, ev.LeaseMS = protocol.EventRenew, int64(a.LeaseMS)
	case core.ResultReleased:
		ev.Type = protocol.EventRelease
		if c.Kind == core.KindSettle {
			ev.Token = a.Result.Token // a Settle names the request, not the token
		}
	case core.ResultExpired:
		if !a.Result.Existed {
			return ev, false
		}
		ev.Type = protocol.EventExpire
	default:
		return ev, false
	}
	// The holder's kind, on every event of a semaphore or shared key: a
	// watcher of such a key sees several holders come and go and tells
	// them apart by token, and their kind by these.
	ev.Limit, ev.Mode = a.Limit, protocol.ModeName(a.Mode)
	return ev, true
}

// Start publishes the queued events on nc until Stop. With interest, an
// event on a subject nobody subscribes to is skipped (counted in
// ticketd_watch_events_skipped_total); nil publishes every event.
func (w *WatchPublisher) Start(nc *nats.Conn, interest Interest) {
	w.startOnce.Do(func() { go w.run(nc, interest) })
}

func (w *WatchPublisher) run(nc *nats.Conn, interest Interest) {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case ev := <-w.events:
			subject := protocol.WatchSubject(ev.Key)
			if interest != nil && !interest(subject) {
				w.skipped.Inc()
				continue
			}
			body, _ := json.Marshal(ev)
			if err := nc.Publish(subject, body); err != nil {
				w.dropped.Inc()
				w.log.Debug("watch event not published", "key", ev.Key, "index", ev.Index, "err", err)
				continue
			}
			w.published.Inc()
		}
	}
}

// Stop ends publishing (events still queued are dropped) and waits for
// the publisher if it was started.
func (w *WatchPublisher) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	started := true
	w.startOnce.Do(func() { started = false })
	if started {
		<-w.done
	}
}
