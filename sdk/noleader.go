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
	if strings.HasPrefix(r.subject, protocol.SubjectPrefix+".") && strings.Contains(r.subject, ".lock.") {
		if lc.at.IsZero() || time.Since(lc.at) >= leaderCheckEvery {
			lc.at, lc.msg = time.Now(), c.askLeader(ctx, r)
		}
		if lc.msg != "" {
			msg = lc.msg
		}
	}
	return c.newError(r, protocol.CodeUnavailable, msg, cause)
}

// askLeader asks a node whether it knows a leader and says what that
// means for a lock request nobody received; "" when no answer came. In a
// partitioned deployment it asks a node of the request's group, found
// from any node's status.
func (c *Client) askLeader(ctx context.Context, r *request) string {
	ctx, cancel := context.WithTimeout(ctx, min(c.cfg.requestTimeout, leaderCheckTimeout))
	defer cancel()
	st, err := c.askStatus(ctx, cancel, protocol.SubjectStatus)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return "no ticketd node answered (no responders), not even to status: no node is connected to this NATS (or this account does not import ticketd.v1.status)"
	case err != nil:
		return ""
	}
	switch {
	case c.cfg.partitioned && st.Groups == 0:
		return fmt.Sprintf("no ticketd node answered (no responders) on the partitioned subjects: node %d is a single cluster, not a group of a partitioned deployment; connect without WithPartitioned (ticketd: without --partitioned)", st.ID)
	case !c.cfg.partitioned && st.Groups > 0:
		return fmt.Sprintf("no ticketd node answered (no responders) on the single-cluster subjects: node %d%s is one of %d groups of a partitioned deployment; connect WithPartitioned (ticketd: --partitioned)", st.ID, inGroup(st), st.Groups)
	}
	if c.cfg.partitioned && st.Groups <= protocol.MaxGroups {
		g := protocol.GroupOf(r.key, st.Groups)
		if r.group != nil {
			g = *r.group
		}
		st, err = c.askStatus(ctx, cancel, protocol.GroupStatusSubject(g))
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return fmt.Sprintf("no node of group %d answered (no responders), not even to status: the whole group is down or cut off from this NATS; the other groups serve their keys", g)
		case err != nil:
			return ""
		}
	}
	if st.Leader == 0 {
		return fmt.Sprintf("no leader: node %d%s knows of no leader (quorum lost, or an election under way); nothing was received", st.ID, inGroup(st))
	}
	return fmt.Sprintf("no ticketd node answered (no responders); node %d%s names leader %d, which does not serve yet (the leadership is starting or moving)", st.ID, inGroup(st), st.Leader)
}

// askStatus makes one status request on subject.
// A refusal by the NATS server calls cancel, ending it at once.
func (c *Client) askStatus(ctx context.Context, cancel context.CancelFunc, subject string) (*protocol.StatusReply, error) {
	w := c.perms.watch(subject, c.perms.muxSubject(), func(error) { cancel() })
	m, err := c.nc.RequestWithContext(ctx, subject, []byte("{}"))
	c.perms.stop(w)
	if err != nil {
		return nil, err
	}
	var st protocol.StatusReply
	if err := protocol.ParseReply(m.Data, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// inGroup names st's group, when it has one.
func inGroup(st *protocol.StatusReply) string {
	if st.Group == nil {
		return ""
	}
	return fmt.Sprintf(" of group %d", *st.Group)
}
