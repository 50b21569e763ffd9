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
	if !got.More || len(got.Locks) == 0 || len(got.Locks) >= len(out.Locks) {
		t.Fatalf("cut page: %d locks, more %v", len(got.Locks), got.More)
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
