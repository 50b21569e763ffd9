package sdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/transports/protocol"
)

// NATS answers "no responders" when nobody is subscribed to a subject.
// Every node serves status, but only a ready leader serves the lock
// subjects, so "no responders" on a lock subject has two different causes
// an operator acts on differently: no ticketd node is connected to this
// NATS at all, or the nodes are there and none leads (quorum lost, or an
// election under way). A status request tells them apart.
const (
	// leaderCheckEvery bounds how often one operation asks, while its
	// retries keep meeting "no responders".
	leaderCheckEvery = time.Second
	// leaderCheckTimeout bounds one status request of the check.
	leaderCheckTimeout = time.Second
)

// leaderCheck is the last check of one operation.
type leaderCheck struct {
	at  time.Time
	msg string // what it found; "" when it learnt nothing
}

// noResponders is the error of an attempt on r.subject that met "no
// responders": retryable unavailable, saying why when status can tell.
// Nobody received the request either way.
func (c *Client) noResponders(ctx context.Context, r *request, cause error, lc *leaderCheck) *Error {
	msg := "no ticketd node answered (no responders)"
	if strings.HasPrefix(r.subject, protocol.SubjectPrefix+".lock.") {
		if lc.at.IsZero() || time.Since(lc.at) >= leaderCheckEvery {
			lc.at, lc.msg = time.Now(), c.askLeader(ctx)
		}
		if lc.msg != "" {
			msg = lc.msg
		}
	}
	return c.newError(r, protocol.CodeUnavailable, msg, cause)
}

// askLeader asks any node whether it knows a leader and says what that
// means for a lock request nobody received; "" when no answer came.
func (c *Client) askLeader(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, min(c.cfg.requestTimeout, leaderCheckTimeout))
	defer cancel()
	w := c.perms.watch(protocol.SubjectStatus, c.perms.muxSubject(), func(error) { cancel() }) // a refusal ends it at once
	m, err := c.nc.RequestWithContext(ctx, protocol.SubjectStatus, []byte("{}"))
	c.perms.stop(w)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return "no ticketd node answered (no responders), not even to status: no node is connected to this NATS (or this account does not import ticketd.v1.status)"
	case err != nil:
		return ""
	}
	var st protocol.StatusReply
	if protocol.ParseReply(m.Data, &st) != nil {
		return ""
	}
	if st.Leader == 0 {
		return fmt.Sprintf("no leader: node %d knows of no leader (quorum lost, or an election under way); nothing was received", st.ID)
	}
	return fmt.Sprintf("no ticketd node answered (no responders); node %d names leader %d, which does not serve yet (the leadership is starting or moving)", st.ID, st.Leader)
}
