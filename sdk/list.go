package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// Page is one page of held locks, in byte order of the key.
type Page struct {
	Locks []Holder
	// More reports that held locks after the last one exist: pass its key
	// as after (and NextAfterToken as afterToken, ListFrom) to read on.
	More bool
	// NextAfterToken is not 0 when the page ends inside the holders of its
	// last key (they did not fit one reply): it is the last lock's token,
	// and ListFrom with the last key and it reads the key's other holders.
	NextAfterToken uint64
	// Index is the applied index the page was read at.
	Index uint64
}

// List reads one page of the held locks whose keys start with prefix and
// sort after after ("" for the first page), at most limit of them (0:
// the server's default, protocol.DefaultListLimit; at most
// protocol.MaxListLimit). Each page is a linearizable read; pages read
// one after another are not one snapshot. It is read-only and retried
// like Get. A page may end inside a key's holders (NextAfterToken): read
// on with ListFrom, or use ListAll, which does.
func (c *Client) List(ctx context.Context, prefix, after string, limit int) (Page, error) {
	return c.ListFrom(ctx, prefix, after, 0, limit)
}

// ListFrom is List resuming inside key after: its holders with a token
// above afterToken come first (afterToken is the previous page's
// NextAfterToken; 0 starts after the whole key, as List does).
func (c *Client) ListFrom(ctx context.Context, prefix, after string, afterToken uint64, limit int) (Page, error) {
	req := protocol.ListRequest{Prefix: prefix, After: after, AfterToken: afterToken, Limit: limit}
	if _, err := req.Validate(); err != nil {
		return Page{}, &Error{Code: protocol.CodeInvalidArgument, Message: err.(*protocol.Error).Message, Op: "list", Key: prefix}
	}
	if c.cfg.partitioned {
		return c.listGroups(ctx, req)
	}
	lr, err := c.listOn(ctx, protocol.SubjectList, nil, req)
	if err != nil {
		return Page{}, err
	}
	p := Page{More: lr.More, NextAfterToken: lr.NextAfterToken, Index: lr.Index, Locks: make([]Holder, 0, len(lr.Locks))}
	for _, g := range lr.Locks {
		p.Locks = append(p.Locks, listed(g, nil))
	}
	return p, nil
}

// listOn asks for one page on subject (of group, if not nil) and checks
// it (checkPage).
func (c *Client) listOn(ctx context.Context, subject string, group *uint32, req protocol.ListRequest) (protocol.ListReply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		panic(err)
	}
	r := &request{op: "list", key: req.Prefix, subject: subject, group: group, readOnly: true}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return protocol.ListReply{}, err
	}
	var lr protocol.ListReply
	if err := json.Unmarshal(rep.data, &lr); err != nil {
		return protocol.ListReply{}, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("unreadable list reply: %v", err), nil)
	}
	if err := checkPage(&lr, req); err != nil {
		return protocol.ListReply{}, c.newError(r, protocol.CodeMalformed, "list reply: "+err.Error(), nil)
	}
	return lr, nil
}

// listed is a list entry as a Holder, held by definition, of group g (nil:
// unpartitioned).
func listed(gr protocol.GetReply, g *uint32) Holder {
	h := holderOf(gr.Key, gr)
	h.Held = true // a list shows held locks only
	h.Group = g
	return h
}

// checkPage refuses a page that breaks the protocol's promises, which a
// caller paging on would otherwise loop on or trust: keys in strictly
// increasing order (a key's holders together, in token order), after the
// request's cursor, under the prefix, within the limit, progress when More
// is set, and NextAfterToken only as the last lock's token of a page with
// more.
func checkPage(lr *protocol.ListReply, req protocol.ListRequest) error {
	limit := req.Limit
	if limit == 0 {
		limit = protocol.DefaultListLimit
	}
	if len(lr.Locks) > limit && lr.Locks[0].Key != lr.Locks[len(lr.Locks)-1].Key {
		// A page never splits a key's holders: only one key may exceed it.
		return fmt.Errorf("%d locks for a limit of %d", len(lr.Locks), limit)
	}
	if lr.More && len(lr.Locks) == 0 {
		return fmt.Errorf("more locks announced on an empty page")
	}
	if lr.NextAfterToken != 0 && (!lr.More || lr.Locks[len(lr.Locks)-1].Token != lr.NextAfterToken) {
		return fmt.Errorf("next_after_token %d is not the last lock's token of a page with more", lr.NextAfterToken)
	}
	// The cursor: the first lock may be a later holder of after itself.
	prev, prevToken, inKey := req.After, req.AfterToken, req.AfterToken != 0
	for i, g := range lr.Locks {
		if err := core.ValidateKey(g.Key); err != nil || !strings.HasPrefix(g.Key, req.Prefix) {
			return fmt.Errorf("key %.80q is not a key under the prefix", g.Key)
		}
		sameKey := inKey && g.Key == prev && g.Token > prevToken
		if (i > 0 || req.After != "") && g.Key <= prev && !sameKey {
			return fmt.Errorf("key %.80q is out of order", g.Key)
		}
		prev, prevToken, inKey = g.Key, g.Token, true
	}
	return nil
}

// ListAll pages through every held lock under prefix, pageSize at a time
// (0: the server's default), yielding each, or one error and stopping.
// Locks taken or released while it pages may or may not be seen; a lock
// held throughout is seen exactly once, even among thousands of holders
// of one key (pages cut inside a key resume there: NextAfterToken).
func (c *Client) ListAll(ctx context.Context, prefix string, pageSize int) iter.Seq2[Holder, error] {
	return listAll(ctx, prefix, pageSize, c.ListFrom)
}

// listPage reads one page after a cursor (ListFrom's signature).
type listPage func(ctx context.Context, prefix, after string, afterToken uint64, limit int) (Page, error)

// listAll pages through list.
func listAll(ctx context.Context, prefix string, pageSize int, list listPage) iter.Seq2[Holder, error] {
	return func(yield func(Holder, error) bool) {
		after, afterToken := "", uint64(0)
		for {
			p, err := list(ctx, prefix, after, afterToken, pageSize)
			if err != nil {
				yield(Holder{}, err)
				return
			}
			for _, h := range p.Locks {
				if !yield(h, nil) {
					return
				}
			}
			if !p.More {
				return
			}
			after, afterToken = p.Locks[len(p.Locks)-1].Key, p.NextAfterToken
		}
	}
}

// holderOf turns a get reply (or a list entry) into a Holder.
func holderOf(key string, gr protocol.GetReply) Holder {
	h := Holder{
		Key:       key,
		Held:      gr.Held,
		Token:     gr.Token,
		Owner:     gr.Owner,
		Lease:     time.Duration(gr.LeaseMS) * time.Millisecond,
		Remaining: time.Duration(gr.RemainingMS) * time.Millisecond,
		Session:   gr.Session,
	}
	if gr.GrantedAtMS > 0 {
		h.GrantedAt = time.UnixMilli(gr.GrantedAtMS)
	}
	h.Limit, h.Shared, h.HoldersMore = int(gr.Limit), gr.Mode == protocol.ModeShared, gr.HoldersMore
	for _, x := range gr.Holders {
		one := holderOf(key, protocol.GetReply{Key: key, Held: true, Token: x.Token, Owner: x.Owner, LeaseMS: x.LeaseMS,
			RemainingMS: x.RemainingMS, GrantedAtMS: x.GrantedAtMS, Session: x.Session, Limit: gr.Limit, Mode: gr.Mode})
		one.Group = h.Group
		h.Holders = append(h.Holders, one)
	}
	return h
}
