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
	// as after to read on.
	More bool
	// Index is the applied index the page was read at.
	Index uint64
}

// List reads one page of the held locks whose keys start with prefix and
// sort after after ("" for the first page), at most limit of them (0:
// the server's default, protocol.DefaultListLimit; at most
// protocol.MaxListLimit). Each page is a linearizable read; pages read
// one after another are not one snapshot. It is read-only and retried
// like Get.
func (c *Client) List(ctx context.Context, prefix, after string, limit int) (Page, error) {
	req := protocol.ListRequest{Prefix: prefix, After: after, Limit: limit}
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
	p := Page{More: lr.More, Index: lr.Index, Locks: make([]Holder, 0, len(lr.Locks))}
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
	if err := checkPage(&lr, req.Prefix, req.After, req.Limit); err != nil {
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
// increasing order, after after, under the prefix, within the limit, and
// progress when More is set.
func checkPage(lr *protocol.ListReply, prefix, after string, limit int) error {
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
	prev, prevToken := after, uint64(0)
	for i, g := range lr.Locks {
		if err := core.ValidateKey(g.Key); err != nil || !strings.HasPrefix(g.Key, prefix) {
			return fmt.Errorf("key %.80q is not a key under the prefix", g.Key)
		}
		// The holders of a semaphore or a shared key come together, in
		// token order.
		sameKey := i > 0 && g.Key == prev && g.Token > prevToken
		if (i > 0 || after != "") && g.Key <= prev && !sameKey {
			return fmt.Errorf("key %.80q is out of order", g.Key)
		}
		prev, prevToken = g.Key, g.Token
	}
	return nil
}

// ListAll pages through every held lock under prefix, pageSize at a time
// (0: the server's default), yielding each, or one error and stopping.
// Locks taken or released while it pages may or may not be seen; a lock
// held throughout is seen exactly once.
func (c *Client) ListAll(ctx context.Context, prefix string, pageSize int) iter.Seq2[Holder, error] {
	return listAll(ctx, prefix, pageSize, c.List)
}

// listAll pages through list.
func listAll(ctx context.Context, prefix string, pageSize int, list func(ctx context.Context, prefix, after string, limit int) (Page, error)) iter.Seq2[Holder, error] {
	return func(yield func(Holder, error) bool) {
		after := ""
		for {
			p, err := list(ctx, prefix, after, pageSize)
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
			after = p.Locks[len(p.Locks)-1].Key
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
