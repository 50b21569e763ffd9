package natsapi

import (
	"encoding/json"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
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
		// A Settle names the request; the released token is in the result.
		{raftstore.Applied{Command: core.Settle("k", "id", "r1", 0), Result: core.Result{Kind: core.ResultReleased, Token: 3}}, protocol.EventRelease},
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

// A session's close or expiry gives one event per lock it ended, with the
// session and that lock's token (two slots of one key: two events); a grant in a session names it; a cleared delay is
// delay_end.
func TestWatchSessionEvents(t *testing.T) {
	w := NewWatchPublisher(WatchConfig{Node: 1, Buffer: 16})
	obs := w.Observer()
	obs.OnApplied(raftstore.Applied{Index: 5, Command: core.Grant("a", "o", 0, 0).InSession(7), Result: core.Result{Kind: core.ResultGranted, Token: 9}})
	obs.OnApplied(raftstore.Applied{Index: 6, Command: core.ExpireSession(7, 1), Result: core.Result{Kind: core.ResultSessionExpired, Existed: true, Count: 2},
		Keys: []string{"a", "b"}, Ended: []core.Lock{{Key: "a", Token: 9}, {Key: "b", Token: 4}}})
	obs.OnApplied(raftstore.Applied{Index: 7, Command: core.ExpireSession(8, 1), Result: core.Result{Kind: core.ResultSessionExpired}})
	obs.OnApplied(raftstore.Applied{Index: 8, Command: core.CloseSession(9, ""), Result: core.Result{Kind: core.ResultSessionClosed, Count: 2},
		Keys: []string{"c", "c"}, Ended: []core.Lock{{Key: "c", Token: 11}, {Key: "c", Token: 12}}})
	obs.OnApplied(raftstore.Applied{Index: 9, Command: core.ClearDelay("a", 1), Result: core.Result{Kind: core.ResultDelayCleared}})
	want := []protocol.WatchEvent{
		{Key: "a", Type: protocol.EventGrant, Token: 9, Owner: "o", Session: "7", Index: 5, Node: 1},
		{Key: "a", Type: protocol.EventExpire, Token: 9, Session: "7", Index: 6, Node: 1},
		{Key: "b", Type: protocol.EventExpire, Token: 4, Session: "7", Index: 6, Node: 1},
		{Key: "c", Type: protocol.EventRelease, Token: 11, Session: "9", Index: 8, Node: 1},
		{Key: "c", Type: protocol.EventRelease, Token: 12, Session: "9", Index: 8, Node: 1},
		{Key: "a", Type: protocol.EventDelayEnd, Index: 9, Node: 1},
	}
	for i, wv := range want {
		select {
		case got := <-w.events:
			if got != wv {
				t.Errorf("event %d = %+v, want %+v", i, got, wv)
			}
		default:
			t.Fatalf("event %d missing", i)
		}
	}
	if len(w.events) != 0 {
		t.Fatalf("%d more events, want none", len(w.events))
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

// With an interest check, events on subjects nobody subscribes to are
// counted as skipped and never reach the server; the others are published.
func TestWatchSkipsSubjectsWithoutInterest(t *testing.T) {
	ns := testkit.NATSServer(t)
	pub := testkit.Connect(t, ns.ClientURL())
	sub := testkit.Connect(t, ns.ClientURL())
	all, err := sub.SubscribeSync(protocol.SubjectWatchPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	watched := protocol.WatchSubject("watched")
	w := NewWatchPublisher(WatchConfig{Node: 1})
	w.Start(pub, func(subject string) bool { return subject == watched })
	obs := w.Observer()
	for i, key := range []string{"other", "watched", "other", "watched"} {
		obs.OnApplied(raftstore.Applied{Index: uint64(i + 1), Command: core.Release(key, 1), Result: core.Result{Kind: core.ResultReleased}})
	}
	for _, want := range []uint64{2, 4} {
		m, err := all.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var ev protocol.WatchEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if m.Subject != watched || ev.Index != want {
			t.Fatalf("got %s index %d, want %s index %d", m.Subject, ev.Index, watched, want)
		}
	}
	w.Stop() // the publisher has counted every event it took
	var m dto.Metric
	if err := w.skipped.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 2 {
		t.Fatalf("skipped %v, want 2", n)
	}
	if err := w.published.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n != 2 {
		t.Fatalf("published %v, want 2", n)
	}
}

// Every event of a semaphore holder or a shared hold names its kind, as
// the node read it when it applied (raftstore.Applied's Limit and Mode);
// a session's close or expiry names each ended holder's; a mutex's events
// name none.
func TestWatchEventKinds(t *testing.T) {
	for _, tc := range []struct {
		a         raftstore.Applied
		wantLimit uint32
		wantMode  string
	}{
		{raftstore.Applied{Command: core.Grant("k", "o", 1000, 0), Result: core.Result{Kind: core.ResultGranted, Token: 3}}, 0, ""},
		{raftstore.Applied{Command: core.Grant("k", "o", 1000, 0).WithKind(3, core.ModeExclusive), Result: core.Result{Kind: core.ResultGranted, Token: 3}, Limit: 3}, 3, ""},
		{raftstore.Applied{Command: core.Grant("k", "o", 1000, 0).WithKind(0, core.ModeShared), Result: core.Result{Kind: core.ResultGranted, Token: 3}, Mode: core.ModeShared}, 0, protocol.ModeShared},
		{raftstore.Applied{Command: core.Renew("k", 3, 0), Result: core.Result{Kind: core.ResultRenewed, Token: 3}, Limit: 3}, 3, ""},
		{raftstore.Applied{Command: core.Release("k", 3), Result: core.Result{Kind: core.ResultReleased}, Limit: 5}, 5, ""},
		{raftstore.Applied{Command: core.Expire("k", 3), Result: core.Result{Kind: core.ResultExpired, Existed: true}, Mode: core.ModeShared}, 0, protocol.ModeShared},
		{raftstore.Applied{Command: core.ClearDelay("k", 1), Result: core.Result{Kind: core.ResultDelayCleared}, Mode: core.ModeShared}, 0, protocol.ModeShared},
	} {
		ev, ok := watchEvent(tc.a)
		if !ok || ev.Limit != tc.wantLimit || ev.Mode != tc.wantMode {
			t.Errorf("%v %v → %+v, want limit %d mode %q", tc.a.Command, tc.a.Result, ev, tc.wantLimit, tc.wantMode)
		}
	}
	w := NewWatchPublisher(WatchConfig{Node: 1, Buffer: 4})
	w.Observer().OnApplied(raftstore.Applied{Index: 8, Command: core.CloseSession(9, ""), Result: core.Result{Kind: core.ResultSessionClosed, Count: 2},
		Keys: []string{"c", "d"}, Ended: []core.Lock{{Key: "c", Token: 11, Limit: 4}, {Key: "d", Token: 12, Mode: core.ModeShared}}})
	for _, want := range []protocol.WatchEvent{
		{Key: "c", Type: protocol.EventRelease, Token: 11, Session: "9", Limit: 4, Index: 8, Node: 1},
		{Key: "d", Type: protocol.EventRelease, Token: 12, Session: "9", Mode: protocol.ModeShared, Index: 8, Node: 1},
	} {
		if got := <-w.events; got != want {
			t.Errorf("session close: %+v, want %+v", got, want)
		}
	}
}
