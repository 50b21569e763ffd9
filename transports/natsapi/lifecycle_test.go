package natsapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestFitListPage: a page of locks whose keys and owners JSON must escape
// (control characters take six bytes each) is cut to fit the payload
// limit, in key order from the start, with More set; a page that fits is
// sent whole.
func TestFitListPage(t *testing.T) {
	var out protocol.ListReply
	for i := 0; i < protocol.MaxListLimit; i++ {
		key := string(rune('a'+i%26)) + strings.Repeat("\x01", core.MaxKeyLen-1)
		out.Locks = append(out.Locks, protocol.GetReply{Key: key, Held: true, Token: uint64(i + 1), Owner: strings.Repeat("\x02", core.MaxOwnerLen)})
	}
	const max = 1 << 20
	body, err := fitListPage(out, max)
	if err != nil || len(body) > max {
		t.Fatalf("page of %d bytes (limit %d): %v", len(body), max, err)
	}
	var got protocol.ListReply
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if !got.More || len(got.Locks) == 0 || len(got.Locks) >= len(out.Locks) || got.NextAfterToken != 0 {
		t.Fatalf("cut page: %d locks, more %v, next_after_token %d (every key is one lock)", len(got.Locks), got.More, got.NextAfterToken)
	}
	for i, l := range got.Locks {
		if l.Token != out.Locks[i].Token {
			t.Fatalf("lock %d has token %d, want the page's own order", i, l.Token)
		}
	}
	small := protocol.ListReply{Locks: out.Locks[:3]}
	if body, err := fitListPage(small, max); err != nil || strings.Contains(string(body), `"more"`) {
		t.Fatalf("a page that fits was changed: %s %v", body, err)
	}
}

// TestFitListPageInsideKey: a key whose holders do not fit one message is
// cut between its holders, with next_after_token the last one's token;
// pages read on from (last key, next_after_token) as ScanLocks resumes
// list every lock exactly once, in order. A cut that can fall between keys
// does, and says nothing more (a client that knows only after reads on).
func TestFitListPageInsideKey(t *testing.T) {
	long := func(c byte) string { return string(c) + strings.Repeat("\x01", core.MaxKeyLen-1) }
	var all []protocol.GetReply
	add := func(key string, token uint64) {
		all = append(all, protocol.GetReply{Key: key, Held: true, Token: token, Owner: strings.Repeat("\x02", core.MaxOwnerLen)})
	}
	add(long('a'), 1)
	for tok := uint64(2); tok < 302; tok++ {
		add(long('k'), tok)
	}
	add(long('z'), 400)
	const max = 1 << 20
	var got []protocol.GetReply
	after, afterToken, cuts := "", uint64(0), 0
	for page := 0; ; page++ {
		if page == 20 {
			t.Fatalf("still paging after %d pages", page)
		}
		var rest []protocol.GetReply // what ScanLocks gives after the cursor
		for _, l := range all {
			if page == 0 || l.Key > after || l.Key == after && afterToken != 0 && l.Token > afterToken {
				rest = append(rest, l)
			}
		}
		body, err := fitListPage(protocol.ListReply{Locks: rest}, max)
		if err != nil || len(body) > max {
			t.Fatalf("page of %d bytes (limit %d): %v", len(body), max, err)
		}
		var lr protocol.ListReply
		if err := json.Unmarshal(body, &lr); err != nil {
			t.Fatal(err)
		}
		got = append(got, lr.Locks...)
		if !lr.More {
			break
		}
		last := lr.Locks[len(lr.Locks)-1]
		cutInside := len(rest) > len(lr.Locks) && rest[len(lr.Locks)].Key == last.Key
		if cutInside != (lr.NextAfterToken != 0) || cutInside && lr.NextAfterToken != last.Token {
			t.Fatalf("page %d ends at token %d, inside the key %v, next_after_token %d", page, last.Token, cutInside, lr.NextAfterToken)
		}
		if cutInside {
			cuts++
		}
		after, afterToken = last.Key, lr.NextAfterToken
	}
	if cuts == 0 || len(got) != len(all) {
		t.Fatalf("read %d of %d locks, %d pages cut inside a key", len(got), len(all), cuts)
	}
	for i := range all {
		if got[i].Key != all[i].Key || got[i].Token != all[i].Token {
			t.Fatalf("lock %d is token %d, want %d", i, got[i].Token, all[i].Token)
		}
	}
}
