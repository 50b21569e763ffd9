package lockservice

import (
	"context"
	"fmt"

	"github.com/ticketd/ticketd/core"
)

// Page is one page of held locks (List).
type Page struct {
	Locks []Holder
	// More reports that locks after the last one returned exist.
	More bool
	// Index is the applied index the page was read at.
	Index uint64
}

// List returns up to limit held locks whose keys start with prefix and
// sort after `after`, in byte order, read linearizably: ReadIndex, then
// one page from the node's store (raftstore.Store.ScanLocks: a seek and at
// most limit+1 rows of Pebble's sorted lock rows; the state machine's lock
// is not taken, so a large table costs a list nothing more than a small
// one). afterToken, when not 0, resumes inside key `after`: its holders
// with a higher token come first. The access list is checked against the
// prefix (OpList).
func (s *Service) List(ctx context.Context, prefix, after string, afterToken uint64, limit int) (Page, error) {
	if limit <= 0 {
		return Page{}, &core.Error{Code: core.CodeInvalidArgument, Detail: fmt.Sprintf("list limit %d must be positive", limit)}
	}
	if err := s.authorize(ctx, OpList, prefix); err != nil {
		return Page{}, err
	}
	if !s.IsLeader() {
		return Page{}, s.notLeader()
	}
	if err := s.node.ReadIndex(ctx); err != nil {
		return Page{}, s.nodeErr(err)
	}
	p, err := s.node.ScanLocks(prefix, after, afterToken, limit)
	if err != nil {
		return Page{}, s.nodeErr(err)
	}
	out := Page{More: p.More, Index: p.Applied, Locks: make([]Holder, len(p.Locks))}
	now := s.cfg.Now()
	s.lead.mu.Lock()
	for i, l := range p.Locks {
		out.Locks[i] = Holder{Lock: l, Held: true, Remaining: s.remainingOf(l, now)}
	}
	s.lead.mu.Unlock()
	return out, nil
}
