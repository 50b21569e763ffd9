package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// WatchEvent is one applied change of a key: Type is protocol.EventGrant,
// EventRelease, EventExpire, EventRenew or EventDelayEnd (a newer server
// may add types), with the lock's token and the raft log index of the
// change. A release or expire made by a session's close or expiry names
// the Session and carries the ended lock's token (older servers sent
// Token 0).
type WatchEvent = protocol.WatchEvent

// Watch bounds.
const (
	// WatchBuffer is how many events a watch holds for a slow reader (and
	// how many messages NATS holds for it); beyond that events are dropped
	// (see Watch).
	WatchBuffer = 256
	// maxEventSize bounds an event the SDK decodes: a key and an owner at
	// their limits fit well within it.
	maxEventSize = 16 << 10
)

// Watch delivers the events of key, in the order they arrive, until ctx
// ends; then it closes the channel. Every node publishes each event it
// applies, so Watch drops repeats: an event whose index is not above the
// last one delivered. It also drops events of other keys (keys that are
// not valid NATS subjects share hashed subjects) and anything
// unreadable.
//
// Events are not guaranteed: those published while this client was
// disconnected, or dropped because the reader fell WatchBuffer behind,
// are missed. Indexes are log indexes across all keys, so a gap is not
// visible from them alone; a reader that must not miss a change reads the
// key with Get after subscribing and whenever an event does not follow
// from what it knew (a grant of a token it never saw released, say).
func (c *Client) Watch(ctx context.Context, key string) (<-chan WatchEvent, error) {
	if err := core.ValidateKey(key); err != nil {
		return nil, &Error{Code: protocol.CodeInvalidArgument, Message: detail(err), Op: "watch", Key: key}
	}
	// NATS drops what does not fit in msgs (a slow consumer), which
	// bounds the memory a watch holds.
	msgs := make(chan *nats.Msg, WatchBuffer)
	subject := protocol.WatchSubject(key)
	fctx, cancel := context.WithTimeout(ctx, c.cfg.requestTimeout)
	defer cancel()
	check := c.perms.expect(fctx, subject)
	sub, err := c.nc.ChanSubscribe(subject, msgs)
	if err != nil {
		check.abandon()
		return nil, &Error{Code: protocol.CodeUnavailable, Message: "cannot subscribe", Op: "watch", Key: key, Err: err}
	}
	// Once the server has the subscription, every event published after
	// Watch returns reaches it; or it refused it (permissions.go).
	v, err := check.confirm()
	if v != nil {
		_ = sub.Unsubscribe()
		return nil, &Error{Code: protocol.CodePermissionDenied, Op: "watch", Key: key, Err: v.err,
			Message: fmt.Sprintf("this NATS user may not subscribe to %s", subject)}
	}
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, &Error{Code: protocol.CodeUnavailable, Message: "subscription not confirmed", Op: "watch", Key: key, Err: err}
	}
	out := make(chan WatchEvent, WatchBuffer)
	go func() {
		defer close(out)
		defer func() { _ = sub.Unsubscribe() }()
		var last uint64
		for {
			var m *nats.Msg
			select {
			case <-ctx.Done():
				return
			case m = <-msgs:
			}
			ev, ok := decodeEvent(m.Data, key)
			if !ok || ev.Index <= last {
				continue
			}
			last = ev.Index
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// decodeEvent reads an event of key, or reports false.
func decodeEvent(data []byte, key string) (WatchEvent, bool) {
	if len(data) > maxEventSize {
		return WatchEvent{}, false
	}
	var ev WatchEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return WatchEvent{}, false
	}
	return ev, ev.Key == key && ev.Index > 0 && ev.Type != ""
}

// eventLease is an event's lease as a duration.
func eventLease(ev WatchEvent) time.Duration { return time.Duration(ev.LeaseMS) * time.Millisecond }
