package sdk

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/transports/protocol"
)

// A NATS server that refuses a client's publish or subscription (its
// permissions do not allow the subject) does not close the connection: it
// sends "-ERR 'Permissions Violation for ...'", which nats.go hands to the
// connection's asynchronous error handler. Without a look at that handler
// a refused request looks like a lost one: an acquire would end, a request
// timeout later, as indeterminate, and a read as "no reply". permWatch
// listens there and fails the attempts the refusal is about at once.
//
// Why a refused publish is permission_denied (nothing happened), not
// indeterminate: nats-server checks a client's publish permissions on
// each message before it routes it anywhere, and on a violation drops the
// message and answers the -ERR instead (server/client.go,
// processInboundClientMsg). So no ticketd node received the request. The
// permissions are those of the connection's user for that subject, so the
// refusal holds for every attempt of ours on the subject. The one way an
// attempt on that subject could have got through is a permission change
// (a server reload) between two of our publishes on it; then the earlier
// attempt is reported refused though it may have acted, and its effect
// ends as an indeterminate one does: a lock expires within its lease.
//
// A refused subscription is different: the request itself was published
// and may have acted, only its reply cannot come back. So before a
// request is sent the SDK makes sure the server accepted its reply
// subscription (confirmSubscription): the shared reply inbox of
// RequestWithContext once per Client, the own inbox of a waiting acquire
// per attempt. A refused inbox fails the request before anything is
// published, as permission_denied; a refusal noticed only after the
// publish (permissions changed on a reconnect) is indeterminate for the
// operations that change something.

// violationRe reads the server's permission errors (nats-server
// client.go: pubPermissionViolation, subPermissionViolation,
// replySubjectViolation).
var violationRe = regexp.MustCompile(`Permissions Violation for (Publish to|Subscription to|Publish with Reply of) "([^"]*)"`)

// violation is one refusal by the NATS server.
type violation struct {
	// what is "publish", "subscribe" or "reply" (a reply subject refused).
	what    string
	subject string
	err     error
}

func (v *violation) Error() string { return v.err.Error() }
func (v *violation) Unwrap() error { return v.err }

// parseViolation reads a permission violation from a NATS error, or
// returns nil.
func parseViolation(err error) *violation {
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	what := map[string]string{"Publish to": "publish", "Subscription to": "subscribe", "Publish with Reply of": "reply"}[m[1]]
	return &violation{what: what, subject: m[2], err: err}
}

// watched is one attempt (or subscription check) waiting on the server:
// pub is the subject it publishes to, inbox the subject it listens on (a
// wildcard "P.*" for the shared reply inbox); either may be empty. A
// violation that concerns it is kept in refused (under permWatch.mu) and
// passed to cancel, which ends the wait.
type watched struct {
	pub, inbox string
	cancel     func(cause error)
	refused    *violation
}

// concerns reports whether v refuses something w depends on.
func (w *watched) concerns(v *violation) bool {
	switch v.what {
	case "publish":
		return w.pub != "" && v.subject == w.pub
	case "subscribe":
		return w.inbox != "" && v.subject == w.inbox
	case "reply":
		if w.inbox == "" {
			return false
		}
		if p, ok := strings.CutSuffix(w.inbox, "*"); ok {
			return strings.HasPrefix(v.subject, p) && !strings.Contains(v.subject[len(p):], ".")
		}
		return v.subject == w.inbox
	}
	return false
}

// permWatch dispatches the permission violations NATS reports on the
// client's connection to the attempts they concern.
type permWatch struct {
	nc *nats.Conn

	// mu guards the fields below; the connection's callback goroutine
	// and the requesters share them.
	mu      sync.Mutex
	waiting map[*watched]struct{}
	closed  bool
	// muxOK: the server accepted a subscription to the shared reply inbox.
	muxOK bool
	mux   string
}

// newPermWatch wraps nc's asynchronous error handler: the handler set
// before keeps being called with every error.
func newPermWatch(nc *nats.Conn) *permWatch {
	p := &permWatch{nc: nc, waiting: map[*watched]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(conn *nats.Conn, sub *nats.Subscription, err error) {
		p.observe(err)
		if prev != nil {
			prev(conn, sub, err)
		}
	})
	return p
}

// observe cancels every attempt a violation concerns, with the violation
// as the cause.
func (p *permWatch) observe(err error) {
	v := parseViolation(err)
	if v == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for w := range p.waiting {
		if w.refused == nil && w.concerns(v) {
			w.refused = v
			w.cancel(v)
		}
	}
	if v.what == "subscribe" && v.subject == p.mux {
		p.muxOK = false // permissions changed (a reconnect): check again
	}
}

// watch registers an attempt until stop: cancel is called if the server
// refuses its publish or inbox.
func (p *permWatch) watch(pub, inbox string, cancel func(cause error)) *watched {
	w := &watched{pub: pub, inbox: inbox, cancel: cancel}
	p.mu.Lock()
	p.waiting[w] = struct{}{}
	p.mu.Unlock()
	return w
}

// stop unregisters w and returns the refusal that concerned it, if any.
func (p *permWatch) stop(w *watched) *violation {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.waiting, w)
	return w.refused
}

// close stops dispatching; the wrapped handler keeps being called.
func (p *permWatch) close() {
	p.mu.Lock()
	p.closed = true
	p.waiting = map[*watched]struct{}{}
	p.mu.Unlock()
}

// muxSubject is the subscription behind RequestWithContext's replies
// ("<inbox prefix>.<id>.*", fixed for the connection's life).
func (p *permWatch) muxSubject() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mux == "" {
		in := p.nc.NewRespInbox()
		p.mux = in[:strings.LastIndexByte(in, '.')+1] + "*"
	}
	return p.mux
}

// checkMux makes sure, once, that the server lets us subscribe to the
// shared reply inbox, before a request whose reply comes there is sent.
// It returns the violation if the server refused it; nil if it accepted,
// or if that could not be learnt (not connected, ctx done: the request
// then meets the usual failures).
func (p *permWatch) checkMux(ctx context.Context) *violation {
	p.mu.Lock()
	ok := p.muxOK
	p.mu.Unlock()
	if ok {
		return nil
	}
	subject := p.muxSubject()
	check := p.expect(ctx, subject)
	sub, err := p.nc.SubscribeSync(subject)
	if err != nil {
		check.abandon()
		return nil
	}
	v, err := check.confirm()
	_ = sub.Unsubscribe()
	if v == nil && err == nil {
		p.mu.Lock()
		p.muxOK = true
		p.mu.Unlock()
	}
	return v
}

// subCheck is a subscription being confirmed: expect before subscribing,
// confirm (or abandon) after.
type subCheck struct {
	p       *permWatch
	subject string
	// before is the connection's last error before the subscription.
	before error
	w      *watched
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// expect starts watching for a refusal of a subscription to subject that
// the caller is about to make; ctx bounds confirm.
func (p *permWatch) expect(ctx context.Context, subject string) *subCheck {
	c := &subCheck{p: p, subject: subject, before: p.nc.LastError()}
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	c.w = p.watch("", subject, c.cancel)
	return c
}

// abandon stops the check (the subscription was not made).
func (c *subCheck) abandon() {
	c.p.stop(c.w)
	c.cancel(nil)
}

// confirm waits until the server has processed our subscriptions so far
// (a flush: its PONG follows any -ERR about them on the same connection)
// and returns the violation if it refused the one to c.subject. err is
// set when the flush did not complete.
func (c *subCheck) confirm() (*violation, error) {
	defer c.cancel(nil)
	err := c.p.nc.FlushWithContext(c.ctx)
	if v := c.p.stop(c.w); v != nil {
		return v, nil
	}
	// nats.go records the -ERR as the connection's last error before it
	// reads the PONG; the handler above may run only later. A violation
	// is a fresh *fmt.wrapError each time, so comparing it with the last
	// error from before the subscription tells a new refusal from an old
	// one of the same subject.
	after := c.p.nc.LastError()
	if v := parseViolation(after); v != nil && v.what == "subscribe" && v.subject == c.subject && after != c.before {
		return v, nil
	}
	return nil, err
}

// inboxPrefix is the prefix of the connection's reply inboxes.
func inboxPrefix(nc *nats.Conn) string {
	if p := strings.TrimSuffix(nc.Opts.InboxPrefix, "."); p != "" {
		return p
	}
	return strings.TrimSuffix(nats.InboxPrefix, ".")
}

// deniedError is the error of a request the NATS server refused. A
// refused publish or reply subject, or a refused inbox found before the
// request was sent, is permission_denied: nothing reached ticketd. A
// refused inbox found after sending leaves the outcome of a request that
// changes something unknown: indeterminate.
func (c *Client) deniedError(r *request, v *violation, sent bool) *Error {
	var msg string
	switch v.what {
	case "publish":
		msg = fmt.Sprintf("this NATS user may not publish to %s; nothing was sent to ticketd", v.subject)
	case "reply":
		msg = fmt.Sprintf("the NATS server refused the reply subject %s; nothing was sent to ticketd", v.subject)
	default:
		msg = fmt.Sprintf("this NATS user may not subscribe to its reply inbox %s (inbox prefix %q): use a prefix it may subscribe under "+
			"(ticketd --nats-inbox-prefix, sdk.Auth.InboxPrefix) or allow this one", v.subject, inboxPrefix(c.nc))
		if !sent {
			msg += "; nothing was sent to ticketd"
		}
	}
	if v.what == "subscribe" && sent && !r.readOnly {
		return c.indeterminate(r, msg+"; the request was sent and may have taken effect", v.err)
	}
	return c.newError(r, protocol.CodePermissionDenied, msg, v.err)
}
