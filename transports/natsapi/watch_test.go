package natsapi

import (
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

func TestWatchEventOfApplied(t *testing.T) {
	tests := []struct {
		a    raftstore.Applied
		want string // "" for no event
	}{
		{raftstore.Applied{Command: core.Grant("k", "o", 1000, 0), Result: core.Result{Kind: core.ResultGranted, Token: 3}, LeaseMS: 1000}, protocol.EventGrant},
		{raftstore.Applied{Command: core.Renew("k", 3, 0), Result: core.Result{Kind: core.ResultRenewed, Token: 3}, LeaseMS: 1000}, protocol.EventRenew},
		{raftstore.Applied{Command: core.Release("k", 3), Result: core.Result{Kind: core.ResultReleased}}, protocol.EventRelease},
		{raftstore.Applied{Command: core.Expire("k", 3), Result: core.Result{Kind: core.ResultExpired, Existed: true}}, protocol.EventExpire},
		{raftstore.Applied{Command: core.Expire("k", 3), Result: core.Result{Kind: core.ResultExpired}}, ""},
		{raftstore.Applied{Command: core.Release("k", 4), Result: core.Result{Kind: core.ResultNotFound}}, ""},
		{raftstore.Applied{Command: core.Grant("k", "o", 1000, 0), Result: core.Result{Kind: core.ResultGrantRejected, Token: 3}}, ""},
	}
	for _, tc := range tests {
		ev, ok := watchEvent(tc.a)
		if (tc.want != "") != ok || ok && (ev.Type != tc.want || ev.Token != 3 || ev.Key != "k") {
			t.Errorf("%v → %+v %v, want %q with token 3", tc.a.Result, ev, ok, tc.want)
		}
	}
}

// A full buffer drops events and counts them; the raft loop never waits.
func TestWatchBufferDrops(t *testing.T) {
	w := NewWatchPublisher(WatchConfig{Node: 1, Buffer: 2})
	obs := w.Observer()
	for i := 0; i < 5; i++ {
		obs.OnApplied(raftstore.Applied{Index: uint64(i + 1), Command: core.Release("k", 1), Result: core.Result{Kind: core.ResultReleased}})
	}
	var m dto.Metric
	if err := w.dropped.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 3 {
		t.Fatalf("dropped %v, want 3", n)
	}
	w.Stop()
}
