package natsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// keyOf returns a key of group g among groups.
func keyOf(t *testing.T, g, groups uint32) string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if k := fmt.Sprintf("key-%d", i); protocol.GroupOf(k, groups) == g {
			return k
		}
	}
	t.Fatalf("no key of group %d of %d", g, groups)
	return ""
}

// TestGroupServesOnlyItsKeys: a group's leader grants, renews and reads
// only the keys that hash to its group, whatever subject the request came
// on (a client may publish on another key's subject, or on the group's
// subject directly), answers wrong_group for the others having changed
// nothing, names its group in the grant, and still releases what it holds.
func TestGroupServesOnlyItsKeys(t *testing.T) {
	srv := singleNode(t)
	p := protocol.Partition{Group: 0, Groups: 2}
	s := &Service{cfg: Config{Locks: srv, Now: time.Now, Partition: p}, log: testkit.QuietLogger(), ctx: context.Background()}
	call := func(op, body string) (okBody []byte, fail *protocol.Error) {
		req := &request{op: op, data: []byte(body), reply: "_INBOX.x", received: time.Now(), receivedLease: time.Now(),
			ok:   func(b []byte) error { okBody = b; return nil },
			fail: func(e *protocol.Error) error { fail = e; return nil }}
		switch op {
		case "acquire":
			s.acquire(req)
		case "renew":
			s.renew(req)
		case "get":
			s.get(req)
		case "check":
			s.check(req)
		case "release":
			s.release(req)
		}
		return okBody, fail
	}
	own, other := keyOf(t, 0, 2), keyOf(t, 1, 2)

	body, fail := call("acquire", fmt.Sprintf(`{"key":%q,"lease_ms":60000}`, own))
	if fail != nil {
		t.Fatalf("acquire of the group's own key: %v", fail)
	}
	var ar protocol.AcquireReply
	if err := json.Unmarshal(body, &ar); err != nil || ar.Group == nil || *ar.Group != 0 {
		t.Fatalf("grant %s does not name group 0 (%v)", body, err)
	}
	for _, op := range []string{"acquire", "renew", "get", "check"} {
		_, fail := call(op, requestFor(op, other))
		if fail == nil || fail.Code != protocol.CodeWrongGroup {
			t.Fatalf("%s of group 1's key on group 0: %v, want wrong_group", op, fail)
		}
	}
	if h, err := srv.Get(context.Background(), other); err != nil || h.Held {
		t.Fatalf("group 0 holds group 1's key after refusing it: %+v %v", h, err)
	}
	if _, fail := call("release", fmt.Sprintf(`{"key":%q,"token":%d}`, own, ar.Token)); fail != nil {
		t.Fatalf("release: %v", fail)
	}
}

func requestFor(op, key string) string {
	switch op {
	case "acquire":
		return fmt.Sprintf(`{"key":%q,"lease_ms":60000}`, key)
	case "renew", "check":
		return fmt.Sprintf(`{"key":%q,"token":1}`, key)
	}
	return fmt.Sprintf(`{"key":%q}`, key)
}
