package lockservice

import (
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// appliedLog records every applied command before the service sees it,
// as an observer of the raft loop would.
type appliedLog struct {
	raftstore.Observer
	mu  sync.Mutex
	all []raftstore.Applied
}

func (l *appliedLog) OnApplied(a raftstore.Applied) {
	l.mu.Lock()
	l.all = append(l.all, a)
	l.mu.Unlock()
	l.Observer.OnApplied(a)
}

// find returns the applied commands of kind k that match.
func (l *appliedLog) find(k core.Kind, match func(raftstore.Applied) bool) []raftstore.Applied {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []raftstore.Applied
	for _, a := range l.all {
		if a.Command.Kind == k && (match == nil || match(a)) {
			out = append(out, a)
		}
	}
	return out
}

// newSettleLeader is a leader at cluster version 6 (sessions, kinds,
// Settle) on a settable clock, whose applied commands are logged.
func newSettleLeader(t *testing.T, cfg Config) (*Service, *fakeNode, *clockAt, *appliedLog) {
	t.Helper()
	clk := &clockAt{}
	cfg.Now = clk.now
	cfg.Logger = testkit.QuietLogger()
	s := New(cfg)
	log := &appliedLog{Observer: s}
	f := &fakeNode{m: core.NewMachine(), obs: log}
	for v := uint64(2); v <= 6; v++ {
		if r := f.m.Apply(core.SetClusterVersion(v)); r.Kind != core.ResultControlApplied {
			t.Fatalf("SetClusterVersion(%d) = %v", v, r)
		}
	}
	s.Attach(f)
	s.OnLeaderReady(1)
	t.Cleanup(s.Close)
	return s, f, clk, log
}

// checkLeaderAgrees fails unless the lease table is sound (its own
// invariants) and the leader's indexes agree with its applied state
// (leaderIndexesDiff).
func checkLeaderAgrees(t *testing.T, s *Service, f *fakeNode) {
	t.Helper()
	s.lead.mu.Lock()
	s.lead.leases.check(t)
	s.lead.mu.Unlock()
	if d := leaderIndexesDiff(s); d != "" {
		t.Fatal(d)
	}
}

// leaderIndexesDiff says how the leader's indexes differ from what its
// applied state holds ("" when they agree): one lease timer per held lock
// or holder, with its token, and none else; the per-identity timer
// counts; the view of each multi-holder key; a session timer per open
// session; the held-locks gauge. The applied state is read first, so
// nothing may be applied meanwhile.
func leaderIndexesDiff(s *Service) string {
	wantTimers := map[string]uint64{}
	wantHeld := map[string]int{}
	wantMulti := map[string][]uint64{}
	wantSessions := map[uint64]bool{}
	var n int
	s.node.View(func(m *core.Machine) {
		n = m.Len()
		for _, l := range m.Locks() {
			wantTimers[l.Key] = l.Token
			wantHeld[l.Identity]++
		}
		for _, kh := range m.MultiKeys() {
			toks := []uint64{}
			for _, l := range kh.Holders {
				wantTimers[timerKey(l.Key, l.Token, true)] = l.Token
				wantHeld[l.Identity]++
				toks = append(toks, l.Token)
			}
			wantMulti[kh.Key] = toks
		}
		m.ForEachSession(func(x core.Session) { wantSessions[x.ID] = true })
	})
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	h := s.lead.leases
	timers := map[string]uint64{}
	for i := range h.recs {
		if r := &h.recs[i]; r.heapAt >= 0 {
			timers[string(h.key(r))] = r.token
		}
	}
	if !maps.Equal(timers, wantTimers) {
		return fmt.Sprintf("leader's lease timers %v, held locks %v", printable(timers), printable(wantTimers))
	}
	for id, c := range wantHeld {
		if h.held(id) != c {
			return fmt.Sprintf("identity %q: %d timers, %d locks held", id, h.held(id), c)
		}
	}
	multi := map[string][]uint64{}
	for k, v := range s.lead.multi {
		multi[k] = append([]uint64{}, v.holders...)
	}
	if fmt.Sprint(multi) != fmt.Sprint(wantMulti) {
		return fmt.Sprintf("leader's multi-holder view %v, applied %v", multi, wantMulti)
	}
	sessions := map[uint64]bool{}
	for id := range s.lead.sess.byID {
		sessions[id] = true
	}
	if !maps.Equal(sessions, wantSessions) {
		return fmt.Sprintf("leader's session timers %v, open sessions %v", sessions, wantSessions)
	}
	var g dto.Metric
	if err := s.cfg.Metrics.HeldLocks.Write(&g); err != nil {
		return err.Error()
	}
	if v := g.GetGauge().GetValue(); int(v) != n {
		return fmt.Sprintf("held-locks gauge %v, %d held", v, n)
	}
	return ""
}

// printable shows timer keys of holders (key NUL token) readably.
func printable(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		out[fmt.Sprintf("%q", lockKeyOf(k))+fmt.Sprintf("#%d", v)] = v
	}
	return out
}

// A Settle that releases a holder leaves nothing of it on the leader,
// whatever the holder's kind (a mutex, a semaphore slot, a shared hold)
// and whether a session or a lease holds it: no lease timer (so no Expire
// is ever proposed for it), no place in its session (the session's lock
// count drops, its close or expiry later ends nothing and leaves no
// lock-delay on the key, and it can take MaxLocksPerSession locks again),
// and another holder of the key keeps its timer through all of it. The
// same holds for a new leader's rebuilt indexes.
func TestSettleLeavesNothingOnTheLeader(t *testing.T) {
	const maxPerSession = 2
	kinds := []struct {
		name  string
		limit uint32
		mode  core.Mode
	}{
		{"mutex", 0, core.ModeExclusive},
		{"semaphore slot", 3, core.ModeExclusive},
		{"shared hold", 0, core.ModeShared},
	}
	for _, k := range kinds {
		for _, session := range []bool{true, false} {
			for _, newLeader := range []bool{false, true} {
				for _, expire := range []bool{false, true} {
					if !session && !expire {
						continue // a lease holder's end is its expiry
					}
					name := fmt.Sprintf("%s/session=%v/new leader=%v/expire=%v", k.name, session, newLeader, expire)
					t.Run(name, func(t *testing.T) {
						s, f, clk, log := newSettleLeader(t, Config{Limits: Limits{MaxLocksPerSession: maxPerSession}})
						ctxA, ctxB := as("A"), as("B")
						const key = "res"
						kindOf := func(p AcquireParams) AcquireParams {
							p.Limit, p.Mode, p.Timeout = k.limit, k.mode, 5*time.Second
							return p
						}
						multi := k.limit > 1 || k.mode == core.ModeShared
						var other Grant // B's hold of the same key, which must survive
						var err error
						if multi {
							if other, err = s.Acquire(ctxB, kindOf(AcquireParams{Key: key, Lease: time.Hour})); err != nil {
								t.Fatal(err)
							}
						}
						var sid uint64
						p := kindOf(AcquireParams{Key: key, RequestID: "r1", Lease: 2 * time.Second})
						if session {
							sid = openSession(t, s, "A", 10*time.Second, 5*time.Second)
							p.Session, p.Lease = sid, 0
						}
						g, err := s.Acquire(ctxA, p)
						if err != nil {
							t.Fatal(err)
						}
						// A sentinel lease that runs out just after A's would.
						sentinel, err := s.Acquire(ctxB, AcquireParams{Key: "sentinel", Lease: 2*time.Second + 100*time.Millisecond, Timeout: 5 * time.Second})
						if err != nil {
							t.Fatal(err)
						}
						if got, err := s.Withdraw(ctxA, key, "", "r1"); err != nil || got != (Withdrawal{ReleasedToken: g.Token}) {
							t.Fatalf("withdraw: %+v %v, want released token %d", got, err, g.Token)
						}
						if !multi {
							// The key is free: B takes it, a holder a stale
							// session index would end.
							if other, err = s.Acquire(ctxB, AcquireParams{Key: key, Lease: time.Hour, Timeout: 5 * time.Second}); err != nil {
								t.Fatalf("the settled key is not free: %v", err)
							}
						}
						checkLeaderAgrees(t, s, f)
						if newLeader {
							s.OnLeadershipLost()
							s.OnLeaderReady(2)
							testkit.Eventually(t, 5*time.Second, "leader ready", s.IsLeader)
							checkLeaderAgrees(t, s, f)
						}
						if session {
							if n := view(f, func(m *core.Machine) int { return m.SessionLockCount(sid) }); n != 0 {
								t.Fatalf("the session still counts %d locks", n)
							}
							// Room for MaxLocksPerSession again, and no more.
							var extra []Grant
							for i := 0; i < maxPerSession; i++ {
								x, err := s.Acquire(ctxA, AcquireParams{Key: fmt.Sprintf("x%d", i), Session: sid, Timeout: 5 * time.Second})
								if err != nil {
									t.Fatalf("lock %d of the session after the settle: %v", i+1, err)
								}
								extra = append(extra, x)
							}
							_, err := s.Acquire(ctxA, AcquireParams{Key: "x-over", Session: sid, Timeout: 5 * time.Second})
							wantLimit(t, err, ResourceSessionLocks)
							for _, x := range extra {
								if err := s.Release(ctxA, x.Key, x.Token); err != nil {
									t.Fatal(err)
								}
							}
							if !expire {
								if n, err := s.CloseSession(ctxA, sid); err != nil || n != 0 {
									t.Fatalf("close: %d locks ended, %v; want 0, nil", n, err)
								}
							}
						}
						if expire {
							advance(s, clk, 11*time.Second) // past the session's TTL and every short lease
							testkit.Eventually(t, 5*time.Second, "the sentinel's expiry", func() bool {
								return len(log.find(core.KindExpire, func(a raftstore.Applied) bool {
									return a.Command.Key == "sentinel" && a.Result.Existed
								})) == 1
							})
							if session {
								testkit.Eventually(t, 5*time.Second, "the session's expiry", func() bool {
									return len(log.find(core.KindExpireSession, func(a raftstore.Applied) bool { return a.Result.Existed })) == 1
								})
							}
						}
						for _, a := range log.find(core.KindExpire, func(a raftstore.Applied) bool { return a.Command.Token == g.Token }) {
							t.Fatalf("an Expire of the settled holder was proposed: %+v", a)
						}
						for _, a := range append(log.find(core.KindExpireSession, nil), log.find(core.KindCloseSession, nil)...) {
							if a.Result.Count != 0 || len(a.Keys) != 0 {
								t.Fatalf("the session's end ended %d locks (%v), want none", a.Result.Count, a.Keys)
							}
						}
						if _, delayed := delayOf(f, key); delayed {
							t.Fatalf("the settled holder's key is in a lock-delay")
						}
						if !holderOf(f, key, other.Token) {
							t.Fatalf("B's hold (token %d) of the key is gone", other.Token)
						}
						if sentinel.Token == 0 {
							t.Fatal("no sentinel")
						}
						checkLeaderAgrees(t, s, f)
					})
				}
			}
		}
	}
}

// delayOf reports whether key (a lock or a multi-holder key) has a
// lock-delay or a delayed slot.
func delayOf(f *fakeNode, key string) (core.Delay, bool) {
	var d core.Delay
	var ok bool
	f.View(func(m *core.Machine) {
		if d, ok = m.Delay(key); ok {
			return
		}
		if kh, multi := m.KeyHolders(key); multi && len(kh.Delays) > 0 {
			d, ok = kh.Delays[0], true
		}
	})
	return d, ok
}
