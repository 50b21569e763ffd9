package sdk

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"slices"
	"sync"

	"github.com/ticketd/ticketd/transports/protocol"
)

// A partitioned deployment (docs/scaling.md) is many ticketd clusters,
// one Raft group each, behind one NATS system. A client configured
// WithPartitioned sends each keyed request on the key's hashed subject
// (protocol.KeyedSubject), which the NATS subject mapping delivers to the
// key's group; it needs to know nothing of the groups for that. A list
// names no key: the client learns the number of groups from any node's
// status, asks every group for the page and merges the pages.

// listFanout bounds the list requests one List has in flight at once.
const listFanout = 16

// WithPartitioned makes the client talk to a partitioned deployment
// (docs/scaling.md): acquire, release, get, renew and withdraw go on the
// key's hashed subject, ticketd.v1.p.<hash>.lock.<op>, and List asks every
// group. Without it the client uses the classic subjects of a single
// cluster, ticketd.v1.lock.<op>, which a partitioned deployment does not
// serve.
func WithPartitioned() Option {
	return func(c *config) { c.partitioned = true }
}

// GroupStatus asks one node of group g of a partitioned deployment
// (whichever the queue group picks) for its view of its group. It is
// read-only and retried like Get.
func (c *Client) GroupStatus(ctx context.Context, g uint32) (*Status, error) {
	return c.status(ctx, &request{op: "status", subject: protocol.GroupStatusSubject(g), group: &g, readOnly: true})
}

// GroupNodeStatus asks node id of group g for its own view, in one
// attempt, as NodeStatus does in a single cluster (raft ids repeat across
// groups).
func (c *Client) GroupNodeStatus(ctx context.Context, g uint32, id uint64) (*Status, error) {
	return c.status(ctx, &request{op: "status", subject: protocol.GroupNodeStatusSubject(g, id), group: &g, readOnly: true, once: true})
}

// ListGroup reads one page of the held locks of group g alone, like List
// (each lock's Group is g). It serves an operator who moves keys to new
// groups (docs/scaling.md, "Adding groups"): it needs no group count, so
// it works while the nodes disagree on it.
func (c *Client) ListGroup(ctx context.Context, g uint32, prefix, after string, limit int) (Page, error) {
	return c.ListGroupFrom(ctx, g, prefix, after, 0, limit)
}

// ListGroupFrom is ListGroup resuming inside key after, as ListFrom.
func (c *Client) ListGroupFrom(ctx context.Context, g uint32, prefix, after string, afterToken uint64, limit int) (Page, error) {
	req := protocol.ListRequest{Prefix: prefix, After: after, AfterToken: afterToken, Limit: limit}
	if _, err := req.Validate(); err != nil {
		return Page{}, &Error{Code: protocol.CodeInvalidArgument, Message: err.(*protocol.Error).Message, Op: "list", Key: prefix}
	}
	lr, err := c.listOn(ctx, protocol.GroupSubject(g, "list"), &g, req)
	if err != nil {
		return Page{}, groupError(g, err)
	}
	p := Page{More: lr.More, NextAfterToken: lr.NextAfterToken, Index: lr.Index, Locks: make([]Holder, 0, len(lr.Locks))}
	for _, l := range lr.Locks {
		p.Locks = append(p.Locks, listed(l, &g))
	}
	return p, nil
}

// ListGroupAll pages through group g's held locks under prefix, as
// ListAll does across the deployment.
func (c *Client) ListGroupAll(ctx context.Context, g uint32, prefix string, pageSize int) iter.Seq2[Holder, error] {
	return listAll(ctx, prefix, pageSize, func(ctx context.Context, prefix, after string, afterToken uint64, limit int) (Page, error) {
		return c.ListGroupFrom(ctx, g, prefix, after, afterToken, limit)
	})
}

// keyedSubject is where op on key is sent.
func (c *Client) keyedSubject(op, key string) string {
	if c.cfg.partitioned {
		return protocol.KeyedSubject(key, op)
	}
	return protocol.SubjectPrefix + ".lock." + op
}

// groups asks any node how many groups the deployment has.
func (c *Client) groups(ctx context.Context, op, key string) (uint32, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	switch {
	case st.Groups == 0:
		return 0, &Error{Code: protocol.CodeInvalidArgument, Op: op, Key: key,
			Message: fmt.Sprintf("the client is partitioned but node %d is not: connect without WithPartitioned (ticketd --partitioned)", st.ID)}
	case st.Groups > protocol.MaxGroups:
		return 0, &Error{Code: protocol.CodeMalformed, Op: op, Key: key,
			Message: fmt.Sprintf("node %d reports %d groups, more than %d", st.ID, st.Groups, protocol.MaxGroups)}
	}
	return st.Groups, nil
}

// listGroups reads one page of held locks across every group: each
// group's page after the request's cursor, merged in key order. A group
// may answer a short page with more set (its page did not fit a NATS
// message); its locks after its last one are unseen, so the merged page
// stops at the smallest last lock of the groups with more. A group that does not answer
// fails the whole list (its error names the group): a page without it
// would silently miss its locks.
func (c *Client) listGroups(ctx context.Context, req protocol.ListRequest) (Page, error) {
	n, err := c.groups(ctx, "list", req.Prefix)
	if err != nil {
		return Page{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make([]protocol.ListReply, n)
	errs := make([]error, n)
	sem := make(chan struct{}, listFanout)
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			pages[g], errs[g] = c.listOn(ctx, protocol.GroupSubject(g, "list"), &g, req)
			if errs[g] != nil {
				cancel() // the list fails anyway: spare the other groups
			}
		}()
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			return Page{}, groupError(uint32(g), err)
		}
	}
	return mergePages(pages, req.Limit), nil
}

// groupError names group g in err's message.
func groupError(g uint32, err error) error {
	if e, ok := err.(*Error); ok {
		named := *e
		named.Message = fmt.Sprintf("group %d: %s", g, e.Message)
		return &named
	}
	return fmt.Errorf("group %d: %w", g, err)
}

// mergePages merges the checked pages of every group (index = group)
// into one page of at most limit locks (0: protocol.DefaultListLimit),
// setting NextAfterToken when it ends inside a key's holders.
func mergePages(pages []protocol.ListReply, limit int) Page {
	if limit == 0 {
		limit = protocol.DefaultListLimit
	}
	var out Page
	// The smallest last lock of a page with more: its key, and its token
	// when that page ended inside the key (0: the whole key is in it).
	cutKey, cutToken, bounded := "", uint64(0), false
	for g, p := range pages {
		group := uint32(g)
		for _, l := range p.Locks {
			out.Locks = append(out.Locks, listed(l, &group))
		}
		if p.More {
			out.More = true
			last := p.Locks[len(p.Locks)-1].Key
			if !bounded || last < cutKey || last == cutKey && p.NextAfterToken != 0 && (cutToken == 0 || p.NextAfterToken < cutToken) {
				cutKey, cutToken, bounded = last, p.NextAfterToken, true
			}
		}
	}
	// A key lives in one group, so its holders stay in token order.
	slices.SortFunc(out.Locks, func(a, b Holder) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(*a.Group, *b.Group), cmp.Compare(a.Token, b.Token))
	})
	if bounded {
		i, _ := slices.BinarySearchFunc(out.Locks, cutKey, func(h Holder, k string) int {
			if h.Key < k || h.Key == k && (cutToken == 0 || h.Token <= cutToken) {
				return -1
			}
			return 1
		})
		out.Locks = out.Locks[:i]
		if cutToken != 0 && i > 0 && out.Locks[i-1].Key == cutKey {
			out.NextAfterToken = cutToken
		}
	}
	if len(out.Locks) > limit {
		out.NextAfterToken = 0
		if out.Locks[limit-1].Key == out.Locks[limit].Key {
			out.NextAfterToken = out.Locks[limit-1].Token
		}
		out.Locks, out.More = out.Locks[:limit], true
	}
	return out
}
