package core_test

import (
	"sort"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// sessModel is the property model's part for sessions and lock-delays
// (core/sessions.go), kept as plain as possible: a session's locks are
// found by scanning every lock, delays are a map.
type sessModel struct {
	sessions  map[uint64]core.Session
	last      uint64
	lockSess  map[string]uint64 // key -> session of the lock held on it (0: none)
	lockDelay map[string]uint64 // key -> lock-delay of the lease lock held on it
	delays    map[string]core.Delay
	lastSeq   uint64
	limits    [3]int // sessions, locks per session, delayed keys; 0: the real bound
}

func newSessModel() sessModel {
	return sessModel{sessions: map[uint64]core.Session{}, lockSess: map[string]uint64{}, lockDelay: map[string]uint64{}, delays: map[string]core.Delay{}}
}

func (s *sessModel) limit(i, real int) int {
	if s.limits[i] > 0 {
		return s.limits[i]
	}
	return real
}

// keysOf returns the keys of session id's locks, sorted.
func (s *sessModel) keysOf(id uint64) []string {
	var keys []string
	for k, sid := range s.lockSess {
		if sid == id {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// grantRefused: a Grant of a free key meets a delay, a missing session or
// a full one.
func (s *sessModel) grantRefused(c core.Command) (core.Result, bool) {
	if _, ok := s.delays[c.Key]; ok {
		return core.Result{Kind: core.ResultDelayed}, true
	}
	if c.SessionID == 0 {
		return core.Result{}, false
	}
	if _, ok := s.sessions[c.SessionID]; !ok {
		return core.Result{Kind: core.ResultSessionNotFound}, true
	}
	if len(s.keysOf(c.SessionID)) >= s.limit(1, core.MaxLocksPerSession) {
		return core.Result{Kind: core.ResultSessionLocksExhausted}, true
	}
	return core.Result{}, false
}

func (s *sessModel) delay(key string, ms uint64) {
	s.lastSeq++
	s.delays[key] = core.Delay{Key: key, DelayMS: ms, Seq: s.lastSeq}
}

// applySession is the model of the session and lock-delay commands (the
// version gate, clock and pruning already done by model.apply).
func (m *model) applySession(c core.Command) core.Result {
	s := &m.s
	switch c.Kind {
	case core.KindOpenSession:
		if len(s.sessions) >= s.limit(0, core.MaxSessions) {
			return core.Result{Kind: core.ResultSessionsExhausted}
		}
		s.last++
		s.sessions[s.last] = core.Session{ID: s.last, Identity: c.Identity, TTLMS: c.TTLMS, LockDelayMS: c.LockDelayMS, Epoch: 1}
		return core.Result{Kind: core.ResultSessionOpened, Session: s.last, Epoch: 1}
	case core.KindRefreshSession:
		x, ok := s.sessions[c.SessionID]
		if !ok {
			return core.Result{Kind: core.ResultSessionNotFound}
		}
		x.Epoch++
		s.sessions[x.ID] = x
		return core.Result{Kind: core.ResultSessionRefreshed, Session: x.ID, Epoch: x.Epoch}
	case core.KindCloseSession, core.KindExpireSession:
		x, ok := s.sessions[c.SessionID]
		expire := c.Kind == core.KindExpireSession
		switch {
		case !ok && !expire:
			return core.Result{Kind: core.ResultSessionNotFound}
		case !ok || expire && x.Epoch != c.Epoch:
			return core.Result{Kind: core.ResultSessionExpired, Session: c.SessionID}
		}
		keys := s.keysOf(x.ID)
		if expire && x.LockDelayMS > 0 && len(s.delays)+len(keys) > s.limit(2, core.MaxDelayedKeys) {
			return core.Result{Kind: core.ResultDelaysExhausted}
		}
		for _, k := range keys {
			m.end(k)
			if expire && x.LockDelayMS > 0 {
				s.delay(k, x.LockDelayMS)
			}
		}
		delete(s.sessions, x.ID)
		m.prune(len(keys))
		if expire {
			return core.Result{Kind: core.ResultSessionExpired, Session: x.ID, Existed: true, Count: uint64(len(keys))}
		}
		return core.Result{Kind: core.ResultSessionClosed, Session: x.ID, Count: uint64(len(keys))}
	case core.KindClearDelay:
		if d, ok := s.delays[c.Key]; ok && d.Seq == c.DelaySeq {
			delete(s.delays, c.Key)
			return core.Result{Kind: core.ResultDelayCleared}
		}
		return notFound
	}
	panic("model: unexpected kind " + c.Kind.String())
}

// sessionCommand returns a session or lock-delay command, or a grant in a
// session or with a delay, and whether it is valid.
func (g *cmdGen) sessionCommand(mod *model) (core.Command, bool) {
	r, s := g.r, &mod.s
	switch p := r.IntN(100); {
	case p < 20:
		var delayMS uint64
		if r.IntN(2) == 0 {
			delayMS = 1 + r.Uint64N(core.MaxLockDelayMS)
		}
		ttlMS := core.MinSessionTTLMS + r.Uint64N(core.MaxSessionTTLMS-core.MinSessionTTLMS+1)
		return core.OpenSession(propertyIdentities[r.IntN(len(propertyIdentities))], ttlMS, delayMS), true
	case p < 45:
		c := core.Grant(g.key(), "", 0, g.grantTime()).InSession(g.session(s))
		if r.IntN(4) == 0 {
			c = c.WithRequest(propertyIdentities[r.IntN(len(propertyIdentities))], propertyRequestIDs[r.IntN(len(propertyRequestIDs))])
		}
		return c, true
	case p < 57:
		leaseMS := core.MinLeaseMS + r.Uint64N(core.MaxLeaseMS-core.MinLeaseMS+1)
		return core.Grant(g.key(), "", leaseMS, g.grantTime()).WithLockDelay(r.Uint64N(core.MaxLockDelayMS + 1)), true
	case p < 65:
		return core.CloseSession(g.session(s), propertyIdentities[r.IntN(len(propertyIdentities))]), true
	case p < 80:
		id := g.session(s)
		epoch := 1 + r.Uint64N(3)
		if x, ok := s.sessions[id]; ok && r.IntN(10) < 7 {
			epoch = x.Epoch
		}
		return core.ExpireSession(id, epoch), true
	case p < 86:
		return core.RefreshSession(g.session(s)), true
	case p < 96:
		k := g.key()
		seq := 1 + r.Uint64N(s.lastSeq+2)
		if d, ok := s.delays[k]; ok && r.IntN(10) < 6 {
			seq = d.Seq
		}
		return core.ClearDelay(k, seq), true
	}
	invalid := []core.Command{
		core.OpenSession("", core.MinSessionTTLMS-1, 0),
		core.OpenSession("", core.MaxSessionTTLMS+1, 0),
		core.OpenSession("", core.MinSessionTTLMS, core.MaxLockDelayMS+1),
		core.CloseSession(0, ""),
		core.ExpireSession(g.session(s), 0),
		core.RefreshSession(0),
		core.ClearDelay(g.key(), 0),
		{Kind: core.KindGrant, Key: g.key(), LeaseMS: lease, SessionID: 1},
		core.Grant(g.key(), "", lease, 0).WithLockDelay(core.MaxLockDelayMS + 1),
		core.Grant(g.key(), "", 0, 0).InSession(1).WithLockDelay(1),
		{Kind: core.KindRelease, Key: g.key(), Token: 1, SessionID: 1},
		{Kind: core.KindOpenSession, TTLMS: core.MinSessionTTLMS, Key: g.key()},
		{Kind: core.KindExpireSession, SessionID: 1, Epoch: 1, Token: 1},
	}
	return invalid[r.IntN(len(invalid))], false
}

// session picks a session ID: mostly an open one, sometimes one closed,
// expired or never issued.
func (g *cmdGen) session(s *sessModel) uint64 {
	if len(s.sessions) > 0 && g.r.IntN(10) < 8 {
		ids := make([]uint64, 0, len(s.sessions))
		for id := range s.sessions {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		return ids[g.r.IntN(len(ids))]
	}
	return 1 + g.r.Uint64N(s.last+2)
}

// check compares a machine's session state and its locks' sessions and
// delays with the model.
func (s *sessModel) check(t *testing.T, m *core.Machine) {
	t.Helper()
	ss := m.SessionState()
	if ss.LastSessionID != s.last || ss.LastDelaySeq != s.lastSeq || len(ss.Sessions) != len(s.sessions) || len(ss.Delays) != len(s.delays) {
		t.Fatalf("sessions %+v; model last %d, seq %d, %d sessions, %d delays", ss, s.last, s.lastSeq, len(s.sessions), len(s.delays))
	}
	for _, x := range ss.Sessions {
		if s.sessions[x.ID] != x {
			t.Fatalf("session %+v, model %+v", x, s.sessions[x.ID])
		}
		if m.SessionLockCount(x.ID) != len(s.keysOf(x.ID)) {
			t.Fatalf("session %d holds %d locks, model %d", x.ID, m.SessionLockCount(x.ID), len(s.keysOf(x.ID)))
		}
	}
	for _, d := range ss.Delays {
		if s.delays[d.Key] != d {
			t.Fatalf("delay %+v, model %+v", d, s.delays[d.Key])
		}
	}
	for _, l := range m.Locks() {
		if l.SessionID != s.lockSess[l.Key] || l.LockDelayMS != s.lockDelay[l.Key] {
			t.Fatalf("lock %+v, model session %d, delay %d", l, s.lockSess[l.Key], s.lockDelay[l.Key])
		}
	}
	perIdentity := map[string]int{}
	for _, x := range s.sessions {
		perIdentity[x.Identity]++
	}
	for _, id := range propertyIdentities {
		if m.SessionsOf(id) != perIdentity[id] {
			t.Fatalf("SessionsOf(%q) = %d, model %d", id, m.SessionsOf(id), perIdentity[id])
		}
	}
}

// TestPropertySessionsIdentical is a focused property run: every
// sequence starts at cluster version 4 with small session limits, so
// that sessions, delays and their limits are exercised in every step.
func TestPropertySessionsIdentical(t *testing.T) {
	t.Parallel()
	seed := propertySeed(t) ^ 0x5e5510
	sequences := 300
	if testing.Short() {
		sequences = 60
	}
	for seq := range sequences {
		runSequenceFrom(t, seed, seq, 150, 4)
		if t.Failed() {
			t.Fatalf("sequence %d failed (seed %d)", seq, seed)
		}
	}
}
