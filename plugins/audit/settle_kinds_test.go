package audit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/plugins"
	"github.com/ticketd/ticketd/raftstore"
)

// TestSettleShowsTheHoldersKind: on a real one-voter node at cluster
// version 6, a withdraw by request id that releases a semaphore slot or a
// shared hold is one Settle, and the publisher shows plugins that Settle
// with the holder's kind (limit or mode, read by the node before it
// applied the command), exactly as it shows a Release of a holder of the
// same kind; a Settle of a mutex shows none, as a Release does. The
// released token is the Settle's result's (a Settle names the request).
func TestSettleShowsTheHoldersKind(t *testing.T) {
	log := testkit.QuietLogger()
	a := &resultAuditor{}
	p := newPublisher(t, Config{Auditor: a, Logger: log})
	p.Start(runNATS(t, false))
	defer p.Close()

	st, err := raftstore.Open(t.TempDir(), raftstore.StoreOptions{NoSync: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := lockservice.New(lockservice.Config{Logger: log})
	pub := raftstore.ObserverFuncs{Applied: p.Offer} // as the daemon wires it
	n, err := raftstore.NewNode(raftstore.Config{ID: 1, Peers: []uint64{1}, Store: st, Observers: []raftstore.Observer{srv, pub}, Logger: log, TickInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.Attach(n)
	n.Start()
	t.Cleanup(func() { srv.Close(); n.Stop(); _ = st.Close() })
	testkit.Eventually(t, 10*time.Second, "a leader", srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for v := uint64(2); v <= 6; v++ {
		if ap, err := n.Propose(ctx, core.SetClusterVersion(v)); err != nil || ap.Result.Kind != core.ResultControlApplied {
			t.Fatalf("SetClusterVersion(%d): %v %v", v, ap.Result, err)
		}
	}
	ctxA := lockservice.WithIdentity(ctx, "A")

	type shown struct {
		key   string
		token uint64
		limit uint32
		mode  core.Mode
	}
	// end releases one holder of key and returns how plugins were shown
	// the command that did.
	end := func(key string, limit uint32, mode core.Mode, settle bool) shown {
		t.Helper()
		// A second holder keeps a multi-holder key one after the end.
		if limit > 1 || mode == core.ModeShared {
			if _, err := srv.Acquire(ctxA, lockservice.AcquireParams{Key: key, Lease: time.Minute, Timeout: 5 * time.Second, Limit: limit, Mode: mode}); err != nil {
				t.Fatal(err)
			}
		}
		rid := fmt.Sprintf("r-%s-%v", key, settle)
		g, err := srv.Acquire(ctxA, lockservice.AcquireParams{Key: key, Lease: time.Minute, Timeout: 5 * time.Second, Limit: limit, Mode: mode, RequestID: rid})
		if err != nil {
			t.Fatal(err)
		}
		if settle {
			w, err := srv.Withdraw(ctxA, key, "", rid)
			if err != nil || w.ReleasedToken != g.Token {
				t.Fatalf("withdraw: %+v %v, want token %d released", w, err, g.Token)
			}
		} else if err := srv.Release(ctxA, key, g.Token); err != nil {
			t.Fatal(err)
		}
		var c core.Command
		var r core.Result
		testkit.Eventually(t, 5*time.Second, "the release audited", func() bool {
			c, r = a.last()
			return c.Key == key && r.Kind == core.ResultReleased && (c.Token == g.Token || r.Token == g.Token)
		})
		tok := c.Token
		if c.Kind == core.KindSettle {
			tok = r.Token
		}
		return shown{c.Key, tok, c.Limit, c.Mode}
	}
	for _, k := range []struct {
		name  string
		limit uint32
		mode  core.Mode
	}{
		{"semaphore slot", 3, core.ModeExclusive},
		{"shared hold", 0, core.ModeShared},
		{"mutex", 0, core.ModeExclusive},
	} {
		t.Run(k.name, func(t *testing.T) {
			key := "k-" + k.name
			rel := end(key, k.limit, k.mode, false)
			set := end(key, k.limit, k.mode, true)
			wantLimit := k.limit
			if rel.limit != wantLimit || rel.mode != k.mode || set.limit != rel.limit || set.mode != rel.mode || set.key != rel.key || set.token == 0 {
				t.Fatalf("a Release was shown as %+v, a Settle as %+v; want both limit %d mode %v", rel, set, wantLimit, k.mode)
			}
		})
	}
}

// resultAuditor records the last command shown and its result.
type resultAuditor struct {
	mu  sync.Mutex
	cmd core.Command
	res core.Result
}

func (a *resultAuditor) OnApplied(_ context.Context, _ uint64, cmd core.Command, res core.Result) ([]plugins.Event, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cmd, a.res = cmd, res
	return nil, nil
}

func (a *resultAuditor) last() (core.Command, core.Result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cmd, a.res
}
