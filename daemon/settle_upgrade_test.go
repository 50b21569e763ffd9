package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestMixedVersionSettle: in a 3-node cluster whose third member acts as
// a binary of cluster version 5 (daemon.Options.MaxClusterVersion,
// test-only), a withdraw by request_id behaves as before the fix: an
// unknown request is answered not_granted and nothing is recorded (a
// later attempt with that id is granted), and no Settle entry (v6) is
// proposed, which would stop the old member. Once that member runs the
// newest binary the cluster reaches version 6 and the same withdraw
// settles the request: a later attempt is refused (grant_ended, no
// token) and the key stays free.
func TestMixedVersionSettle(t *testing.T) {
	const oldNode = 2
	c, oldVersion := startMixedVersion(t, oldNode, 5)
	allAt := func(v uint64) func() bool { return allAtVersion(c, v) }
	c.Leader(10 * time.Second)
	testkit.Eventually(t, 15*time.Second, "every node at cluster version 5", allAt(5))
	nc, err := nats.Connect(c.ClientURL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	call := func(subject, body string, v any) *protocol.Error {
		t.Helper()
		// Poll through a leader change (not_leader, unavailable).
		var perr *protocol.Error
		testkit.Eventually(t, 10*time.Second, subject+" answered", func() bool {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := nc.RequestWithContext(rctx, subject, []byte(body))
			rcancel()
			if err != nil {
				return false
			}
			perr = nil
			if err := protocol.ParseReply(m.Data, v); err != nil {
				if !errors.As(err, &perr) {
					t.Fatalf("unparseable reply %q: %v", m.Data, err)
				}
				return !perr.Code.Retryable()
			}
			return true
		})
		return perr
	}
	withdraw := func(key, id string) protocol.WithdrawReply {
		t.Helper()
		var wr protocol.WithdrawReply
		if e := call(protocol.SubjectWithdraw, `{"key":"`+key+`","request_id":"`+id+`"}`, &wr); e != nil {
			t.Fatalf("withdraw: %v", e)
		}
		return wr
	}
	acquire := func(key, id string) (protocol.AcquireReply, *protocol.Error) {
		t.Helper()
		var ar protocol.AcquireReply
		e := call(protocol.SubjectAcquire, `{"key":"`+key+`","lease_ms":5000,"request_id":"`+id+`"}`, &ar)
		return ar, e
	}

	// Version 5: today's behaviour.
	if wr := withdraw("mixed/k", "old-request-0123456789"); !wr.NotGranted {
		t.Fatalf("withdraw of an unknown request at version 5: %+v, want not_granted", wr)
	}
	if ar, e := acquire("mixed/k", "old-request-0123456789"); e != nil || ar.Token == 0 {
		t.Fatalf("a later attempt at version 5: %+v %v, want granted (nothing was recorded)", ar, e)
	}
	for i, v := range clusterVersions(c) {
		if v != 5 {
			t.Fatalf("node %d at cluster version %d, want 5", i+1, v)
		}
	}

	// Upgrade: the old member restarts as the newest binary.
	oldVersion.Store(0)
	if err := c.Stop(oldNode); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(oldNode); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "every node at cluster version 6", allAt(6))
	if wr := withdraw("mixed/j", "new-request-0123456789"); !wr.NotGranted {
		t.Fatalf("withdraw of an unknown request at version 6: %+v, want not_granted", wr)
	}
	ar, e := acquire("mixed/j", "new-request-0123456789")
	if e == nil || e.Code != protocol.CodeGrantEnded || e.Token != 0 {
		t.Fatalf("a later attempt of a settled request: %+v %+v, want grant_ended without a token", ar, e)
	}
	// Every replica applied the same: the old member too.
	testkit.Eventually(t, 10*time.Second, "replicas agree", func() bool {
		var first [32]byte
		for i, d := range c.Nodes() {
			var dg [32]byte
			d.Node().View(func(m *core.Machine) { dg = m.Digest() })
			if i == 0 {
				first = dg
			} else if dg != first {
				return false
			}
		}
		return true
	})
}
