package sdk

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/transports/protocol"
)

func TestMergePages(t *testing.T) {
	page := func(more bool, keys ...string) protocol.ListReply {
		p := protocol.ListReply{More: more}
		for _, k := range keys {
			p.Locks = append(p.Locks, protocol.GetReply{Key: k, Held: true, Token: 1})
		}
		return p
	}
	cases := []struct {
		name  string
		pages []protocol.ListReply
		limit int
		want  []string // key@group
		more  bool
	}{
		{"empty", []protocol.ListReply{page(false), page(false)}, 10, nil, false},
		{"interleaved", []protocol.ListReply{page(false, "a", "c"), page(false, "b", "d")}, 10, []string{"a@0", "b@1", "c@0", "d@1"}, false},
		{"cut at the limit", []protocol.ListReply{page(false, "a", "c"), page(false, "b", "d")}, 3, []string{"a@0", "b@1", "c@0"}, true},
		// Group 0's page stopped at "b" with more: its locks after "b" are
		// unseen, so group 1's "c" must wait for the next page.
		{"short page with more", []protocol.ListReply{page(true, "a", "b"), page(false, "c", "d")}, 10, []string{"a@0", "b@0"}, true},
		{"smallest cut wins", []protocol.ListReply{page(true, "a", "e"), page(true, "b", "c"), page(false, "d")}, 10, []string{"a@0", "b@1", "c@1"}, true},
		{"default limit", []protocol.ListReply{page(false, "a")}, 0, []string{"a@0"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := mergePages(c.pages, c.limit)
			var got []string
			for _, h := range p.Locks {
				if !h.Held || h.Group == nil {
					t.Fatalf("lock %+v: not held or no group", h)
				}
				got = append(got, fmt.Sprintf("%s@%d", h.Key, *h.Group))
			}
			if !slices.Equal(got, c.want) || p.More != c.more {
				t.Fatalf("got %v more=%v, want %v more=%v", got, p.More, c.want, c.more)
			}
		})
	}
}

// TestMergePagesInsideKey: holders of one key (key:token) stay in token
// order, a group page that ended inside a key cuts the merged page after
// its last holder, and a merged page cut inside a key (by a group or by
// the limit) says where to resume (NextAfterToken).
func TestMergePagesInsideKey(t *testing.T) {
	page := func(more bool, next uint64, locks ...string) protocol.ListReply {
		p := protocol.ListReply{More: more, NextAfterToken: next}
		for _, l := range locks {
			k, tok, _ := strings.Cut(l, ":")
			n, _ := strconv.ParseUint(tok, 10, 64)
			p.Locks = append(p.Locks, protocol.GetReply{Key: k, Held: true, Token: n})
		}
		return p
	}
	cases := []struct {
		name  string
		pages []protocol.ListReply
		limit int
		want  []string // key:token
		more  bool
		next  uint64
	}{
		{"holders in token order", []protocol.ListReply{page(false, 0, "a:1", "c:2", "c:5", "c:9"), page(false, 0, "b:3", "d:4")}, 10,
			[]string{"a:1", "b:3", "c:2", "c:5", "c:9", "d:4"}, false, 0},
		{"a group cut inside a key", []protocol.ListReply{page(true, 5, "a:1", "c:2", "c:5"), page(false, 0, "b:3", "d:4")}, 10,
			[]string{"a:1", "b:3", "c:2", "c:5"}, true, 5},
		{"a group cut before another's key", []protocol.ListReply{page(true, 5, "c:2", "c:5"), page(true, 0, "b:3")}, 10,
			[]string{"b:3"}, true, 0},
		{"the limit cuts inside a key", []protocol.ListReply{page(false, 0, "a:1", "c:2", "c:5", "c:9"), page(false, 0, "b:3")}, 4,
			[]string{"a:1", "b:3", "c:2", "c:5"}, true, 5},
		{"the limit cuts between keys", []protocol.ListReply{page(true, 9, "a:1", "c:2", "c:5", "c:9"), page(false, 0, "b:3")}, 2,
			[]string{"a:1", "b:3"}, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := mergePages(c.pages, c.limit)
			var got []string
			for _, h := range p.Locks {
				got = append(got, fmt.Sprintf("%s:%d", h.Key, h.Token))
			}
			if !slices.Equal(got, c.want) || p.More != c.more || p.NextAfterToken != c.next {
				t.Fatalf("got %v more=%v next=%d, want %v more=%v next=%d", got, p.More, p.NextAfterToken, c.want, c.more, c.next)
			}
		})
	}
}

func TestKeyedSubject(t *testing.T) {
	c := &Client{}
	if got := c.keyedSubject("acquire", "orders/42"); got != protocol.SubjectAcquire {
		t.Fatalf("unpartitioned: %s", got)
	}
	WithPartitioned()(&c.cfg)
	if got := c.keyedSubject("renew", "orders/42"); got != protocol.KeyedSubject("orders/42", "renew") {
		t.Fatalf("partitioned: %s", got)
	}
}
