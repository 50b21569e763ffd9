package natsapi

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Delivery of grants to requesters that waited (SPEC §4.4).
//
// A requester that waited in a key's queue may be gone by the time its
// Grant applies (its process died, its connection dropped). Publishing to
// an inbox nobody subscribes to does not fail, so the grant would stay
// held for its whole lease. Instead, such a grant is published with a
// reply subject on this node's one delivery subscription. nats-server
// answers a publish that reached no subscriber at all with an empty
// message carrying the status "503" (no responders) on that reply subject,
// provided the publisher subscribes to it; the node then releases the
// grant with its exact token at once.
//
// Why this is safe: the server sends 503 only when the publish was
// delivered to nobody: no local subscriber, no route or gateway with
// interest (nats-server client.go, processInboundClientMsg: `!didDeliver`).
// A grant that reached a client's inbox, or a route towards it, never gets
// a 503, so a grant a client may hold is never released this way. The
// converse is not promised: a requester that vanished on another server
// whose interest had not yet left the routes gets no 503; its grant
// expires with its lease, as before. The last token of each reply subject
// is random (crypto/rand, 128 bits), so a client that saw one grant's
// reply subject cannot guess another's and forge a 503 for it; only the
// recipient of a grant sees its subject, and it may release its own lock
// anyway.
//
// Cost: one map entry and one timer per grant to a requester that waited,
// for DeliveryWatchDefault; immediate grants keep the plain publish.

// DeliveryWatchDefault is how long a node waits for NATS's no-responders
// answer to a grant it published. The answer comes from the node's own
// NATS server right after the publish, so this bounds only how long an
// entry is kept.
const DeliveryWatchDefault = 2 * time.Second

// MaxWatchedDeliveries bounds the grants watched at once; beyond it a
// grant is published without a watch (it then expires with its lease if
// its requester is gone).
const MaxWatchedDeliveries = 10000

// HeaderQueued marks a leader's grant reply to a follower as one whose
// requester waited, so the follower relays it with a delivery watch too.
// It is removed before the reply reaches the client.
const HeaderQueued = "Ticketd-Queued"

// deliveryWatch publishes messages with a reply subject on one shared
// wildcard subscription and runs a callback when NATS answers one with
// "no responders".
type deliveryWatch struct {
	nc      *nats.Conn
	log     *slog.Logger
	prefix  string
	sub     *nats.Subscription
	timeout time.Duration
	// lost runs each callback (not on the subscription's goroutine).
	lost func(f func())

	mu      sync.Mutex // guards pending and onLost
	pending map[string]*time.Timer
	onLost  map[string]func()
}

func newDeliveryWatch(nc *nats.Conn, log *slog.Logger, lost func(func())) (*deliveryWatch, error) {
	d := &deliveryWatch{nc: nc, log: log, prefix: nc.NewInbox(), timeout: DeliveryWatchDefault, lost: lost,
		pending: make(map[string]*time.Timer), onLost: make(map[string]func())}
	sub, err := nc.Subscribe(d.prefix+".*", d.handle)
	if err != nil {
		return nil, fmt.Errorf("natsapi: subscribe delivery inbox: %w", err)
	}
	d.sub = sub
	return d, nil
}

// publish sends m and calls onLost (once, from the lost runner) if NATS
// reports that nobody received it. Beyond MaxWatchedDeliveries it is a
// plain publish.
func (d *deliveryWatch) publish(m *nats.Msg, onLost func()) error {
	d.mu.Lock()
	if len(d.pending) >= MaxWatchedDeliveries {
		d.mu.Unlock()
		return d.nc.PublishMsg(m)
	}
	id := deliveryID()
	d.onLost[id] = onLost
	d.pending[id] = time.AfterFunc(d.timeout, func() { d.take(id) })
	d.mu.Unlock()
	m.Reply = d.prefix + "." + id
	err := d.nc.PublishMsg(m)
	if err != nil {
		d.take(id)
	}
	return err
}

// take removes id's watch and returns its callback (nil if gone).
func (d *deliveryWatch) take(id string) func() {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.onLost[id]
	if t := d.pending[id]; t != nil {
		t.Stop()
	}
	delete(d.pending, id)
	delete(d.onLost, id)
	return f
}

// handle receives NATS's answers on the delivery inbox: only an empty
// "503" status means nobody received the message.
func (d *deliveryWatch) handle(m *nats.Msg) {
	if len(m.Data) != 0 || m.Header.Get("Status") != "503" {
		return
	}
	if f := d.take(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]); f != nil {
		d.log.Debug("no responders for a delivered grant", "to", m.Header.Get("Nats-Subject"))
		d.lost(f)
	}
}

// stop ends the subscription and forgets every watch.
func (d *deliveryWatch) stop() error {
	err := d.sub.Unsubscribe()
	d.mu.Lock()
	for id, t := range d.pending {
		t.Stop()
		delete(d.pending, id)
		delete(d.onLost, id)
	}
	d.mu.Unlock()
	if errors.Is(err, nats.ErrConnectionClosed) {
		return nil
	}
	return err
}

// deliveryID is a fresh unguessable id for one watched delivery.
func deliveryID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
