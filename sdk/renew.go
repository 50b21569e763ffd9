package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Renewal is a confirmed renewal.
type Renewal struct {
	Key   string
	Token uint64
	// Lease is the lock's lease after the renewal; a renewal never
	// shortens it.
	Lease time.Duration
	// Index is the raft log index of the Renew.
	Index uint64
	// Sent is when the successful renew request was sent (client clock,
	// monotonic), and Deadline is Sent plus Lease: the server re-armed the
	// lease no earlier than it received the request, so the lock is the
	// holder's until Deadline.
	Sent, Deadline time.Time
}

// Renew lengthens the lease of key, held with token, to run lease from
// now (0 keeps the lock's lease; a renewal never shortens the lease). It
// fails with ErrNotFound when key is not held with exactly token (it was
// released, expired, or the token is wrong; nothing changed), and with
// ErrIndeterminate when the reply was lost: then the lease may or may
// not have been renewed, so keep the earlier deadline. Renewing again is
// harmless, so a caller may simply retry. Like every request, only
// failures that certainly had no effect are retried automatically.
func (c *Client) Renew(ctx context.Context, key string, token uint64, lease time.Duration) (Renewal, error) {
	bad := func(format string, args ...any) (Renewal, error) {
		return Renewal{}, &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: "renew", Key: key}
	}
	if err := core.ValidateKey(key); err != nil {
		return bad("%s", detail(err))
	}
	if token == 0 {
		return bad("token must be positive")
	}
	lease = lease.Truncate(time.Millisecond)
	if lease != 0 && (lease < core.MinLease || lease > core.MaxLease) {
		return bad("lease %v is outside [%v, %v] (or 0 to keep the lock's)", lease, core.MinLease, core.MaxLease)
	}
	body, err := json.Marshal(protocol.RenewRequest{Key: key, Token: token, LeaseMS: lease.Milliseconds()})
	if err != nil {
		panic(err)
	}
	r := &request{op: "renew", key: key, subject: c.keyedSubject("renew", key)}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return Renewal{}, err
	}
	var rr protocol.RenewReply
	err = json.Unmarshal(rep.data, &rr)
	got := time.Duration(rr.LeaseMS) * time.Millisecond
	if err != nil || (rr.Key != "" && rr.Key != key) || (rr.Token != 0 && rr.Token != token) ||
		got < core.MinLease || got > core.MaxLease || (lease != 0 && got < lease) {
		// We cannot tell what the server did: keep the earlier deadline.
		return Renewal{}, c.indeterminate(r, fmt.Sprintf("invalid renew reply %.200q", rep.data), err)
	}
	return Renewal{Key: key, Token: token, Lease: got, Index: rr.Index, Sent: rep.sent, Deadline: rep.sent.Add(got)}, nil
}

// Renew renews the lock with its lease and, on success, moves Deadline to
// the renew request's send time plus the lease in the reply (never
// later, and never back). A failed or indeterminate renewal leaves
// Deadline where it was. A lock that has ended (Err is not nil) is not
// renewed: Renew returns Err.
func (l *Lock) Renew(ctx context.Context) error {
	if l.client == nil {
		return &Error{Code: protocol.CodeInvalidArgument, Message: "lock has no client", Op: "renew", Key: l.Key}
	}
	if err := l.Err(); err != nil {
		return err
	}
	if l.session != nil {
		return errSessionLock(l.Key)
	}
	rn, err := l.client.Renew(ctx, l.Key, l.Token, 0)
	if err != nil {
		return err
	}
	l.extend(rn)
	return nil
}

// extend records a confirmed renewal unless the lock has ended (a lost
// lock stays lost).
func (l *Lock) extend(rn Renewal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.life.err != nil || !rn.Deadline.After(l.deadline) {
		return
	}
	l.deadline, l.renewedAt, l.lease = rn.Deadline, rn.Sent, rn.Lease
	l.rearmLocked()
}
