package natsapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
)

// The NATS micro protocol ($SRV.PING, $SRV.INFO, $SRV.STATS), answered by
// ticketd itself with nats.go/micro's own types, so `nats micro ls|info|
// stats ticketd` works as for any micro service.
//
// Why not micro.AddService: micro counts a request, its error and its
// processing time when the handler returns, and its Request must not be
// touched afterwards. Each micro endpoint is one subscription whose
// messages micro handles one at a time, so a handler that waited for its
// reply would make every acquire queue behind one that waits for its key.
// ticketd therefore answers each request from its own goroutine (dispatch)
// and, with micro, its stats counted requests but never their errors or
// their time. Here every request is counted when its reply is written,
// with the time from its arrival and the error it carried.

// endpoint is one client-facing subject and the figures STATS reports for
// it. The figures are guarded by microService.mu.
type endpoint struct {
	info micro.EndpointInfo

	requests   int
	errors     int
	lastError  string
	processing time.Duration
}

// microService is the discovery side of the service: its identity, its
// endpoints and their figures, and the $SRV subscriptions.
type microService struct {
	nc          *nats.Conn
	identity    micro.ServiceIdentity
	description string

	mu        sync.Mutex // guards started and every endpoint's figures
	started   time.Time
	endpoints []*endpoint
	subs      []*nats.Subscription
}

func newMicroService(nc *nats.Conn, name, version, description string, metadata map[string]string) *microService {
	return &microService{
		nc:          nc,
		identity:    micro.ServiceIdentity{Name: name, ID: nuid.Next(), Version: version, Metadata: metadata},
		description: description,
		started:     time.Now().UTC(),
	}
}

// addEndpoint subscribes h to subject (in queue group queue, or alone
// when queue is "") and lists it under name.
func (m *microService) addEndpoint(name, subject, queue string, h func(*endpoint, *nats.Msg)) error {
	e := &endpoint{info: micro.EndpointInfo{Name: name, Subject: subject, QueueGroup: queue}}
	cb := func(msg *nats.Msg) { h(e, msg) }
	var sub *nats.Subscription
	var err error
	if queue != "" {
		sub, err = m.nc.QueueSubscribe(subject, queue, cb)
	} else {
		sub, err = m.nc.Subscribe(subject, cb)
	}
	if err != nil {
		return fmt.Errorf("natsapi: subscribe %s: %w", subject, err)
	}
	m.mu.Lock()
	m.endpoints = append(m.endpoints, e)
	m.subs = append(m.subs, sub)
	m.mu.Unlock()
	return nil
}

// startVerbs answers PING, INFO and STATS on the three subjects micro
// uses for each: all services, all ticketd instances, this instance.
func (m *microService) startVerbs() error {
	for verb, answer := range map[micro.Verb]func() any{
		micro.PingVerb:  func() any { return micro.Ping{ServiceIdentity: m.identity, Type: micro.PingResponseType} },
		micro.InfoVerb:  func() any { return m.info() },
		micro.StatsVerb: func() any { return m.stats() },
	} {
		for _, scope := range [][2]string{{"", ""}, {m.identity.Name, ""}, {m.identity.Name, m.identity.ID}} {
			subj, err := micro.ControlSubject(verb, scope[0], scope[1])
			if err != nil {
				return fmt.Errorf("natsapi: %s subject: %w", verb, err)
			}
			sub, err := m.nc.Subscribe(subj, func(msg *nats.Msg) {
				body, _ := json.Marshal(answer())
				_ = msg.Respond(body) // an asker that left needs nothing
			})
			if err != nil {
				return fmt.Errorf("natsapi: subscribe %s: %w", subj, err)
			}
			m.mu.Lock()
			m.subs = append(m.subs, sub)
			m.mu.Unlock()
		}
	}
	return nil
}

// record counts one answered request on e: the time since it arrived and,
// if the reply was an error or could not be written, that error. Called
// concurrently, once per request.
func (m *microService) record(e *endpoint, took time.Duration, errText string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.requests++
	e.processing += took
	if errText != "" {
		e.errors++
		e.lastError = errText
	}
}

func (m *microService) info() micro.Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := micro.Info{ServiceIdentity: m.identity, Type: micro.InfoResponseType, Description: m.description,
		Endpoints: make([]micro.EndpointInfo, 0, len(m.endpoints))}
	for _, e := range m.endpoints {
		out.Endpoints = append(out.Endpoints, e.info)
	}
	return out
}

func (m *microService) stats() micro.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := micro.Stats{ServiceIdentity: m.identity, Type: micro.StatsResponseType, Started: m.started,
		Endpoints: make([]*micro.EndpointStats, 0, len(m.endpoints))}
	for _, e := range m.endpoints {
		st := &micro.EndpointStats{
			Name: e.info.Name, Subject: e.info.Subject, QueueGroup: e.info.QueueGroup,
			NumRequests: e.requests, NumErrors: e.errors, LastError: e.lastError, ProcessingTime: e.processing,
		}
		if e.requests > 0 {
			st.AverageProcessingTime = e.processing / time.Duration(e.requests)
		}
		out.Endpoints = append(out.Endpoints, st)
	}
	return out
}

// stop unsubscribes everything; requests already dispatched still finish.
func (m *microService) stop() error {
	m.mu.Lock()
	subs := m.subs
	m.subs = nil
	m.mu.Unlock()
	var err error
	for _, sub := range subs {
		if uerr := sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) && !errors.Is(uerr, nats.ErrBadSubscription) {
			err = errors.Join(err, uerr)
		}
	}
	return err
}

// serviceErrorText is how micro words an error reply in last_error.
func serviceErrorText(code, description string) string { return code + ":" + description }
