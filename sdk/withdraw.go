package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ticketd/ticketd/transports/protocol"
)

// withdrawTimeout bounds the withdrawal of an abandoned wait, and the
// release of a grant that raced it. It is the SDK's own: the caller's
// context is already done when they run.
const withdrawTimeout = 2 * time.Second

// withdrawAttempt bounds one attempt of a withdrawal that may be sent
// again (it carries a request id), so that several fit in withdrawTimeout
// whatever the request timeout: an attempt can be lost without a trace
// (NATS routes it to a paused leader's subscription until that route is
// found stale), and a second one is the only way to an answer.
const withdrawAttempt = withdrawTimeout / 4

// newWaitID names one waiting acquire: 22 random base-62 characters, well
// within protocol.MaxWaitIDLen.
func newWaitID() string { return nuid.Next() }

// waiter is one attempt of a waiting acquire. It listens on an inbox of
// its own rather than through RequestWithContext, whose shared reply mux
// drops a reply that arrives after the attempt gave up: a grant that
// raced our withdrawal must reach us so that we release it.
type waiter struct {
	c       *Client
	r       *request
	waitID  string
	replies chan *nats.Msg // the first reply, while nobody gave up

	// mu guards the fields below; the subscription's goroutine and the
	// requester share them.
	mu            sync.Mutex
	got           bool
	abandoned     bool
	releasedToken uint64    // a grant of ours known to be released
	late          *nats.Msg // the first reply after abandoning that is no grant
	freed         bool      // a grant arrived after abandoning and is gone
}

// waitExchange sends one attempt of a waiting acquire (request.exchange).
func (c *Client) waitExchange(r *request, waitID string) func(context.Context, string, []byte) (*nats.Msg, error) {
	return func(ctx context.Context, subject string, body []byte) (*nats.Msg, error) {
		w := &waiter{c: c, r: r, waitID: waitID, replies: make(chan *nats.Msg, 1)}
		inbox := c.nc.NewInbox()
		check := c.perms.expect(ctx, inbox)
		sub, err := c.nc.Subscribe(inbox, w.handle)
		if err != nil {
			check.abandon()
			return nil, &settled{c.newError(r, protocol.CodeUnavailable, "cannot listen for the reply", err)}
		}
		// The reply can come only here: before sending, make sure the
		// server accepted the subscription (permissions.go). One
		// connection keeps order, so the server has our SUB before the
		// request and the reply cannot miss it.
		if v, _ := check.confirm(); v != nil {
			_ = sub.Unsubscribe()
			return nil, &settled{c.deniedError(r, v, false)}
		}
		// A refusal of the publish or of the inbox ends the wait at once,
		// with the violation as ctx's cause.
		ctx, refused := context.WithCancelCause(ctx)
		defer refused(nil)
		pw := c.perms.watch(subject, sub.Subject, refused)
		if err := c.nc.PublishRequest(subject, sub.Subject, body); err != nil {
			c.perms.stop(pw)
			_ = sub.Unsubscribe()
			return nil, err
		}
		select {
		case m := <-w.replies:
			c.perms.stop(pw)
			_ = sub.Unsubscribe()
			if isNoResponders(m) {
				return nil, nats.ErrNoResponders
			}
			return m, nil
		case <-ctx.Done():
		}
		// A refused publish reached nobody: there is no wait to withdraw.
		// A refused inbox (a reconnect changed the permissions) is
		// abandoned like a timeout: the wait may exist.
		if v := c.perms.stop(pw); v != nil && v.what != "subscribe" {
			_ = sub.Unsubscribe()
			return nil, &settled{c.deniedError(r, v, true)}
		}
		return w.abandon(ctx, sub)
	}
}

// isNoResponders reports whether m is the NATS server's 503 status: no
// subscriber received the request.
func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// handle receives every message on the attempt's inbox: the reply while
// someone waits for it, and afterwards whatever still arrives.
func (w *waiter) handle(m *nats.Msg) {
	w.mu.Lock()
	if !w.abandoned && !w.got {
		w.got = true
		w.mu.Unlock()
		w.replies <- m
		return
	}
	w.mu.Unlock()
	w.afterAbandon(m)
}

// afterAbandon releases a grant that arrived after the attempt was
// abandoned, and keeps the first other reply (a timeout, say), which
// settles the outcome as well.
func (w *waiter) afterAbandon(m *nats.Msg) {
	if grantToken(m) > 0 {
		if w.releaseStray(m) {
			w.mu.Lock()
			w.freed = true
			w.mu.Unlock()
		}
		return
	}
	w.mu.Lock()
	if w.late == nil {
		w.late = m
	}
	w.mu.Unlock()
}

// abandon withdraws the wait after ctx ended without a reply. It returns
// a definite reply that raced the withdrawal (a timeout, say), a settled
// context error when nothing can be held (the wait was withdrawn, or its
// grant was released), and otherwise ctx's error, which do reports as
// indeterminate.
func (w *waiter) abandon(ctx context.Context, sub *nats.Subscription) (*nats.Msg, error) {
	w.mu.Lock()
	w.abandoned = true
	w.mu.Unlock()
	select {
	case m := <-w.replies:
		w.afterAbandon(m)
	default:
	}
	// Withdraw while still subscribed: a grant sent meanwhile reaches
	// handle, which releases it.
	wr, werr := w.c.withdraw(w.r.key, w.waitID, w.r.settleID)
	if werr == nil && wr.ReleasedToken > 0 {
		w.mu.Lock()
		w.releasedToken = wr.ReleasedToken
		w.mu.Unlock()
	}
	// Drain removes our interest and still hands handle what the server
	// routed to us before; wait until it has. A grant sent after that
	// meets "no responders", and the leader releases it with its token.
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	if sub.Drain() == nil {
		t := time.NewTimer(2 * withdrawTimeout)
		select {
		case <-closed:
		case <-t.C:
		}
		t.Stop()
	}
	w.mu.Lock()
	late, freed := w.late, w.freed
	w.mu.Unlock()
	key, why := w.r.key, context.Cause(ctx)
	gaveUp := func(what string) error {
		return &settled{fmt.Errorf("ticketd: acquire %q: gave up waiting; %s: %w", key, what, why)}
	}
	switch {
	case late != nil && isNoResponders(late):
		return nil, gaveUp("no node had received the request")
	case late != nil && definiteFailure(late):
		// Typically the server's answer to the withdrawn wait.
		return nil, gaveUp("the server answered that nothing was granted")
	case late != nil:
		return late, nil
	case freed:
		return nil, gaveUp("the grant that raced it was released")
	case werr == nil && wr.Withdrawn:
		return nil, gaveUp("wait withdrawn")
	case werr == nil && wr.ReleasedToken > 0:
		return nil, gaveUp(fmt.Sprintf("its grant (token %d) was released", wr.ReleasedToken))
	case werr == nil && wr.EndedToken > 0:
		return nil, gaveUp(fmt.Sprintf("its grant (token %d), whose reply never arrived, had ended", wr.EndedToken))
	case werr == nil && wr.NotGranted:
		return nil, gaveUp("the cluster says nothing was granted")
	case werr != nil:
		return nil, fmt.Errorf("%w (withdraw failed: %v)", why, werr)
	}
	w.r.settleAsked = w.r.settleID != ""
	return nil, fmt.Errorf("%w (the wait was not found to withdraw; a grant may still be on its way)", why)
}

// definiteFailure reports whether m is an error reply that says the
// request changed nothing.
func definiteFailure(m *nats.Msg) bool {
	perr, bad := parseReply(m)
	return bad == nil && perr != nil && perr.Code != protocol.CodeIndeterminate && perr.Code != protocol.CodeInternal
}

// grantToken is the token of a grant reply, or 0 if m is not one.
func grantToken(m *nats.Msg) uint64 {
	if perr, bad := parseReply(m); perr != nil || bad != nil {
		return 0
	}
	var ar protocol.AcquireReply
	if json.Unmarshal(m.Data, &ar) != nil {
		return 0
	}
	return ar.Token
}

// releaseStray releases the grant m carries, if it is one; it reports
// whether the lock is certainly gone (released now or before).
func (w *waiter) releaseStray(m *nats.Msg) bool {
	token := grantToken(m)
	if token == 0 {
		return false
	}
	w.mu.Lock()
	done := w.releasedToken == token
	w.mu.Unlock()
	if done {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	err := w.c.Release(ctx, w.r.key, token)
	w.c.cfg.logger.Debug("ticketd: released a grant that arrived after its wait was abandoned", "key", w.r.key, "token", token, "err", err)
	return err == nil || errors.Is(err, ErrNotFound)
}

// withdraw takes the wait waitID out of key's queue (or, with requestID,
// settles that request: lock.go), within withdrawTimeout.
func (c *Client) withdraw(key, waitID, requestID string) (protocol.WithdrawReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	body, err := json.Marshal(protocol.WithdrawRequest{Key: key, WaitID: waitID, RequestID: requestID})
	if err != nil {
		panic(err)
	}
	// With a request id it is sent again after a lost reply, within
	// withdrawTimeout: settling a request is idempotent (a second Settle
	// finds the first one's outcome), and the first attempt may have gone
	// to a node that is paused or cut off.
	r := &request{op: "withdraw", key: key, subject: c.keyedSubject("withdraw", key), retrySafe: requestID != ""}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		if r.retrySafe {
			w = min(w, withdrawAttempt)
		}
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return protocol.WithdrawReply{}, err
	}
	var wr protocol.WithdrawReply
	if err := json.Unmarshal(rep.data, &wr); err != nil || (wr.Key != "" && wr.Key != key) {
		return protocol.WithdrawReply{}, c.indeterminate(r, fmt.Sprintf("invalid withdraw reply %.200q", rep.data), err)
	}
	return wr, nil
}
