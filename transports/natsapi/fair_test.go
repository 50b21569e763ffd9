package natsapi

import (
	"context"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/transports/protocol"
)

// The sweep ends exactly the parked waits whose requesters are gone, and
// forgets nothing it did not end.
func TestParkSweep(t *testing.T) {
	var p parkedWaits
	ended := map[string]bool{}
	var removes []func()
	for _, reply := range []string{"_INBOX.here.1", "_INBOX.gone.1", "_R_.x.gone", "_INBOX.here.2"} {
		removes = append(removes, p.add(reply, func() { ended[reply] = true }))
	}
	var asked []string
	n := p.sweep(func(replies []string) []bool {
		asked = append(asked, replies...)
		out := make([]bool, len(replies))
		for i, r := range replies {
			out[i] = r == "_INBOX.here.1" || r == "_INBOX.here.2"
		}
		return out
	})
	if n != 2 || !ended["_INBOX.gone.1"] || !ended["_R_.x.gone"] || ended["_INBOX.here.1"] || ended["_INBOX.here.2"] || len(asked) != 4 {
		t.Fatalf("ended %d: %v (asked %v)", n, ended, asked)
	}
	for _, remove := range removes {
		remove()
	}
	if p.len() != 0 || p.sweep(func([]string) []bool { t.Fatal("asked with nothing parked"); return nil }) != 0 {
		t.Fatal("removed waits still parked")
	}
}

// admit: an identity over its share of requests in progress is refused
// with resource_exhausted, its releases too (each costs a raft entry);
// a follower's release of a grant it could not deliver never; leave gives
// its places back, once however often it is called.
func TestAdmitShares(t *testing.T) {
	srv := lockservice.New(lockservice.Config{Logger: testkit.QuietLogger(), Limits: lockservice.Limits{MaxInflightPerIdentity: 1}})
	defer srv.Close()
	s := &Service{cfg: Config{Locks: srv}, acqSem: make(chan struct{}, 2), sem: make(chan struct{}, 2), ctx: context.Background()}
	var refused *protocol.Error
	req := func(op, identity string) *request {
		return &request{op: op, identity: identity, fail: func(e *protocol.Error) error { refused = e; return nil }}
	}
	first := req("acquire", "A")
	if ok := s.admit(first); !ok {
		t.Fatalf("first request refused: %v", refused)
	}
	if ok := s.admit(req("get", "A")); ok || refused.Code != protocol.CodeResourceExhausted {
		t.Fatalf("A's second request: admitted %v, %v; want resource_exhausted", ok, refused)
	}
	if ok := s.admit(req("release", "A")); ok || refused.Code != protocol.CodeResourceExhausted {
		t.Fatalf("A's release over its share: admitted %v, %v; want resource_exhausted", ok, refused)
	}
	lost := req("release", "A")
	lost.nodeAuthority = true
	if ok := s.admit(lost); !ok {
		t.Fatalf("the cluster's own release for A refused: %v", refused)
	}
	b := req("acquire", "B")
	if ok := s.admit(b); !ok {
		t.Fatalf("B refused for A's request: %v", refused)
	}
	if ok := s.admit(req("acquire", "C")); ok || refused.Code != protocol.CodeUnavailable {
		t.Fatalf("beyond the node's acquire budget: admitted %v, %v; want unavailable", ok, refused)
	}
	first.leaveAdmission()
	first.leaveAdmission()
	b.leaveAdmission()
	lost.leaveAdmission()
	if len(s.acqSem) != 0 || len(s.sem) != 0 {
		t.Fatalf("places left taken: %d acquires, %d others", len(s.acqSem), len(s.sem))
	}
	done, err := srv.BeginRequest("A")
	if err != nil {
		t.Fatalf("A after leaving: %v", err)
	}
	done()
}
