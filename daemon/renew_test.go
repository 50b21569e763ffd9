package daemon_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestRenewKeepsLockPastItsLease: a lock with a 300 ms lease renewed every
// 100 ms is still held with the same token after 1.5 s (five leases), and
// expires by a committed Expire once renewals stop.
func TestRenewKeepsLockPastItsLease(t *testing.T) {
	d := startNode(t, t.TempDir(), daemon.Options{})
	defer d.Close()
	nc, _ := connect(t, d)
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"job","lease_ms":300}`, &g); e != nil {
		t.Fatal(e)
	}
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < 1500*time.Millisecond {
		<-tick.C
		var r protocol.RenewReply
		if e := rawRequest(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":"job","token":%d}`, g.Token), &r); e != nil {
			t.Fatalf("renew after %v: %v", time.Since(start), e)
		}
		if r.LeaseMS != 300 || r.Token != g.Token || r.Index <= g.Index {
			t.Fatalf("renew reply %+v", r)
		}
	}
	var h protocol.GetReply
	if e := rawRequest(t, nc, protocol.SubjectGet, `{"key":"job"}`, &h); e != nil || !h.Held || h.Token != g.Token {
		t.Fatalf("after 5 leases of renewals: %+v %v", h, e)
	}
	if n := counterValue(t, d, "ticketd_renewals_total", "", ""); n < 10 {
		t.Fatalf("ticketd_renewals_total = %v, want >= 10", n)
	}
	testkit.Eventually(t, 5*time.Second, "lease expired after the renewals stopped", func() bool {
		return counterValue(t, d, "ticketd_expiries_total", "existed", "true") == 1
	})
	var r protocol.RenewReply
	if e := rawRequest(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":"job","token":%d}`, g.Token), &r); e == nil || e.Code != protocol.CodeNotFound {
		t.Fatalf("renew of an expired lock: %+v %v, want not_found", r, e)
	}
}

// TestRenewAcrossLeaderChange: renewals sent through a follower; a wrong
// token is not_found; a shorter lease never shortens; and after the leader
// dies the new leader re-arms the renewed (longer) lease, not the granted
// one.
func TestRenewAcrossLeaderChange(t *testing.T) {
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster version raised", func() bool { return testcluster.Settled(c.Node(lead)) })
	fol := c.Follower(lead)
	nc := testkit.Connect(t, c.ClientURL(fol))
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"job","lease_ms":1000}`, &g); e != nil {
		t.Fatal(e)
	}
	renew := func(body string) (protocol.RenewReply, *protocol.Error) {
		var r protocol.RenewReply
		e := rawRequest(t, nc, protocol.SubjectRenew, body, &r)
		return r, e
	}
	tests := []struct {
		name      string
		body      string
		wantCode  protocol.Code
		wantLease int64
	}{
		{"longer", fmt.Sprintf(`{"key":"job","token":%d,"lease_ms":30000}`, g.Token), "", 30000},
		{"shorter keeps the longer", fmt.Sprintf(`{"key":"job","token":%d,"lease_ms":500}`, g.Token), "", 30000},
		{"wrong token", fmt.Sprintf(`{"key":"job","token":%d}`, g.Token+100), protocol.CodeNotFound, 0},
		{"no such key", `{"key":"nope","token":1}`, protocol.CodeNotFound, 0},
		{"token zero", `{"key":"job","token":0}`, protocol.CodeInvalidArgument, 0},
		{"lease too long", fmt.Sprintf(`{"key":"job","token":%d,"lease_ms":999999999}`, g.Token), protocol.CodeInvalidArgument, 0},
		{"unknown field", fmt.Sprintf(`{"key":"job","token":%d,"ttl":1}`, g.Token), protocol.CodeMalformed, 0},
	}
	for _, tc := range tests {
		r, e := renew(tc.body)
		switch {
		case tc.wantCode == "" && e != nil:
			t.Fatalf("%s: %v", tc.name, e)
		case tc.wantCode != "" && (e == nil || e.Code != tc.wantCode):
			t.Fatalf("%s: got %+v %v, want %s", tc.name, r, e, tc.wantCode)
		case tc.wantCode == "" && r.LeaseMS != tc.wantLease:
			t.Fatalf("%s: lease %d, want %d", tc.name, r.LeaseMS, tc.wantLease)
		}
	}
	c.Converged(10 * time.Second)
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	newLead := c.Leader(10 * time.Second)
	var h protocol.GetReply
	nc2 := testkit.Connect(t, c.ClientURL(newLead))
	if e := rawRequest(t, nc2, protocol.SubjectGet, `{"key":"job"}`, &h); e != nil {
		t.Fatal(e)
	}
	// Granted with 1 s; renewed to 30 s: the new leader arms 30 s.
	if !h.Held || h.Token != g.Token || h.LeaseMS != 30000 || h.RemainingMS < 20000 {
		t.Fatalf("on the new leader: %+v, want token %d with lease 30000 re-armed in full", h, g.Token)
	}
	if _, e := renew(fmt.Sprintf(`{"key":"job","token":%d}`, g.Token)); e != nil {
		t.Fatalf("renew on the new leader: %v", e)
	}
}
