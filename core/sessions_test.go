package core_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v4Machine is a machine whose cluster agreed on version 4.
func v4Machine(t testing.TB) *core.Machine {
	t.Helper()
	m := v3Machine(t)
	if r := m.Apply(core.SetClusterVersion(4)); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetClusterVersion(4) = %v", r)
	}
	return m
}

const (
	ttl   = 10_000 // a valid session TTL in ms
	delay = 15_000 // a valid lock-delay in ms
)

// sgrant is a Grant of key in session id.
func sgrant(key string, id uint64) core.Command { return core.Grant(key, "w", lease, 7).InSession(id) }

// dgrant is a Grant of key with a lease and a lock-delay.
func dgrant(key string, delayMS uint64) core.Command {
	return core.Grant(key, "w", lease, 7).WithLockDelay(delayMS)
}

var (
	sessionNotFound = core.Result{Kind: core.ResultSessionNotFound}
	delayed         = core.Result{Kind: core.ResultDelayed}
	delayCleared    = core.Result{Kind: core.ResultDelayCleared}
	delaysFull      = core.Result{Kind: core.ResultDelaysExhausted}
	opened          = func(id uint64) core.Result { return core.Result{Kind: core.ResultSessionOpened, Session: id, Epoch: 1} }
	refreshed       = func(id, epoch uint64) core.Result {
		return core.Result{Kind: core.ResultSessionRefreshed, Session: id, Epoch: epoch}
	}
	closed = func(id, n uint64) core.Result {
		return core.Result{Kind: core.ResultSessionClosed, Session: id, Count: n}
	}
	sessionExpired = func(id uint64, existed bool, n uint64) core.Result {
		return core.Result{Kind: core.ResultSessionExpired, Session: id, Existed: existed, Count: n}
	}
)

// sessStep is one command of a session scenario, its result, and whether
// it changes the state (digest) at all.
type sessStep struct {
	cmd     core.Command
	want    core.Result
	changes bool
}

// TestSessions is the table of every branch of the session and lock-delay
// commands and of a Grant that meets them: each scenario runs on a fresh
// cluster version 4 machine (with small limits where it says), checks
// each result, whether the state changed, that the state survives its
// snapshot and its storage records, and then the final state.
func TestSessions(t *testing.T) {
	type final struct {
		locks    []string          // held keys
		sessions []uint64          // open session IDs
		delays   map[string]uint64 // delayed key -> seq
	}
	tests := []struct {
		name   string
		limits [3]int
		steps  []sessStep
		final  final
	}{
		{
			name: "open: IDs from 1, epoch 1, never reused",
			steps: []sessStep{
				{core.OpenSession("alice", ttl, 0), opened(1), true},
				{core.OpenSession("alice", ttl, delay), opened(2), true},
				{core.CloseSession(2, "alice"), closed(2, 0), true},
				{core.OpenSession("", core.MaxSessionTTLMS, core.MaxLockDelayMS), opened(3), true},
			},
			final: final{sessions: []uint64{1, 3}},
		},
		{
			name:   "open beyond MaxSessions is refused",
			limits: [3]int{2, 0, 0},
			steps: []sessStep{
				{core.OpenSession("a", ttl, 0), opened(1), true},
				{core.OpenSession("a", ttl, 0), opened(2), true},
				{core.OpenSession("b", ttl, 0), core.Result{Kind: core.ResultSessionsExhausted}, false},
				{core.CloseSession(1, ""), closed(1, 0), true},
				{core.OpenSession("b", ttl, 0), opened(3), true},
			},
			final: final{sessions: []uint64{2, 3}},
		},
		{
			name: "grant in a session: no lease, counted; missing session refused",
			steps: []sessStep{
				{core.OpenSession("a", ttl, 0), opened(1), true},
				{sgrant("k1", 1), granted(1), true},
				{sgrant("k2", 1), granted(2), true},
				{sgrant("k3", 2), sessionNotFound, false},
				{sgrant("k1", 1), grantRejected(1), false},
			},
			final: final{locks: []string{"k1", "k2"}, sessions: []uint64{1}},
		},
		{
			name:   "grant beyond MaxLocksPerSession is refused; a release makes room",
			limits: [3]int{0, 2, 0},
			steps: []sessStep{
				{core.OpenSession("a", ttl, 0), opened(1), true},
				{sgrant("k1", 1), granted(1), true},
				{sgrant("k2", 1), granted(2), true},
				{sgrant("k3", 1), core.Result{Kind: core.ResultSessionLocksExhausted}, false},
				{core.Grant("k3", "", lease, 0), granted(3), true},
				{core.Release("k1", 1), released, true},
				{sgrant("k4", 1), granted(4), true},
			},
			final: final{locks: []string{"k2", "k3", "k4"}, sessions: []uint64{1}},
		},
		{
			name: "a session lock is not renewed nor expired by itself",
			steps: []sessStep{
				{core.OpenSession("a", ttl, delay), opened(1), true},
				{sgrant("k", 1), granted(1), true},
				{core.Renew("k", 1, lease), noop, false},
				{core.Expire("k", 1), expiredFalse, false},
			},
			final: final{locks: []string{"k"}, sessions: []uint64{1}},
		},
		{
			name: "close releases every lock, without a delay",
			steps: []sessStep{
				{core.OpenSession("a", ttl, delay), opened(1), true},
				{sgrant("b", 1), granted(1), true},
				{sgrant("a", 1), granted(2), true},
				{core.Grant("c", "", lease, 0), granted(3), true},
				{core.CloseSession(1, "a"), closed(1, 2), true},
				{core.CloseSession(1, "a"), sessionNotFound, false},
				{core.Grant("a", "", lease, 0), granted(4), true},
			},
			final: final{locks: []string{"a", "c"}},
		},
		{
			name: "expire with a stale epoch changes nothing; with the current one frees and delays",
			steps: []sessStep{
				{core.OpenSession("a", ttl, delay), opened(1), true},
				{sgrant("x", 1), granted(1), true},
				{sgrant("y", 1), granted(2), true},
				{core.RefreshSession(1), refreshed(1, 2), true},
				{core.ExpireSession(1, 1), sessionExpired(1, false, 0), false},
				{core.ExpireSession(1, 3), sessionExpired(1, false, 0), false},
				{core.ExpireSession(1, 2), sessionExpired(1, true, 2), true},
				{core.ExpireSession(1, 2), sessionExpired(1, false, 0), false},
				{core.RefreshSession(1), sessionNotFound, false},
				{core.Grant("x", "", lease, 0), delayed, false},
				{sgrant("y", 1), delayed, false},
			},
			final: final{delays: map[string]uint64{"x": 1, "y": 2}},
		},
		{
			name: "expire of a session without a delay frees at once",
			steps: []sessStep{
				{core.OpenSession("a", ttl, 0), opened(1), true},
				{sgrant("x", 1), granted(1), true},
				{core.ExpireSession(1, 1), sessionExpired(1, true, 1), true},
				{core.Grant("x", "", lease, 0), granted(2), true},
			},
			final: final{locks: []string{"x"}},
		},
		{
			name: "lock-delay after an expiry, not after a release; clear needs the current seq",
			steps: []sessStep{
				{dgrant("k", delay), granted(1), true},
				{core.Release("k", 1), released, true},
				{dgrant("k", delay), granted(2), true},
				{core.Expire("k", 2), expiredTrue, true},
				{core.Grant("k", "", lease, 0), delayed, false},
				{core.ClearDelay("k", 2), notFound, false},
				{core.ClearDelay("j", 1), notFound, false},
				{core.ClearDelay("k", 1), delayCleared, true},
				{core.ClearDelay("k", 1), notFound, false},
				{dgrant("k", 1), granted(3), true},
				{core.Expire("k", 3), expiredTrue, true},
				{core.ClearDelay("k", 1), notFound, false},
			},
			final: final{delays: map[string]uint64{"k": 2}},
		},
		{
			name: "a lease lock without a delay expires as before",
			steps: []sessStep{
				{core.Grant("k", "", lease, 0), granted(1), true},
				{core.Expire("k", 1), expiredTrue, true},
				{core.Grant("k", "", lease, 0), granted(2), true},
			},
			final: final{locks: []string{"k"}},
		},
		{
			name:   "delayed keys full: the expiry waits, the lock stays held",
			limits: [3]int{0, 0, 2},
			steps: []sessStep{
				{dgrant("a", delay), granted(1), true},
				{dgrant("b", delay), granted(2), true},
				{dgrant("c", delay), granted(3), true},
				{core.Grant("d", "", lease, 0), granted(4), true},
				{core.Expire("a", 1), expiredTrue, true},
				{core.Expire("b", 2), expiredTrue, true},
				{core.Expire("c", 3), delaysFull, false},
				{core.Expire("d", 4), expiredTrue, true}, // no delay: no room needed
				{core.ClearDelay("a", 1), delayCleared, true},
				{core.Expire("c", 3), expiredTrue, true},
			},
			final: final{delays: map[string]uint64{"b": 2, "c": 3}},
		},
		{
			name:   "delayed keys full: a session expiry is all or nothing",
			limits: [3]int{0, 0, 3},
			steps: []sessStep{
				{dgrant("a", delay), granted(1), true},
				{core.Expire("a", 1), expiredTrue, true},
				{core.OpenSession("s", ttl, delay), opened(1), true},
				{sgrant("x", 1), granted(2), true},
				{sgrant("y", 1), granted(3), true},
				{sgrant("z", 1), granted(4), true},
				{core.ExpireSession(1, 1), delaysFull, false},
				{core.ClearDelay("a", 1), delayCleared, true},
				{core.ExpireSession(1, 1), sessionExpired(1, true, 3), true},
			},
			final: final{delays: map[string]uint64{"x": 2, "y": 3, "z": 4}},
		},
		{
			name: "a session lock with a request id: the repeat finds it, then learns it ended",
			steps: []sessStep{
				{core.OpenSession("a", ttl, 0), opened(1), true},
				{sgrant("k", 1).WithRequest("a", "r1"), granted(1), true},
				{sgrant("k", 1).WithRequest("a", "r1"), repeated(1), false},
				{core.CloseSession(1, "a"), closed(1, 1), true},
				{sgrant("k", 1).WithRequest("a", "r1"), ended(1), false},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := v4Machine(t)
			m.SetSessionLimitsForTest(tc.limits[0], tc.limits[1], tc.limits[2])
			for i, s := range tc.steps {
				before := m.Digest()
				if got := m.Apply(s.cmd); got != s.want {
					t.Fatalf("step %d: Apply(%+v) = %v, want %v", i, s.cmd, got, s.want)
				}
				if changed := m.Digest() != before; changed != s.changes {
					t.Fatalf("step %d: %v changed the state: %t, want %t", i, s.want, changed, s.changes)
				}
				checkSessionsSurvive(t, m)
			}
			var keys []string
			for _, l := range m.Locks() {
				keys = append(keys, l.Key)
			}
			ss := m.SessionState()
			var ids []uint64
			for _, x := range ss.Sessions {
				ids = append(ids, x.ID)
			}
			delays := map[string]uint64{}
			for _, d := range ss.Delays {
				delays[d.Key] = d.Seq
				if got, ok := m.Delay(d.Key); !ok || got != d {
					t.Fatalf("Delay(%q) = %+v, %t", d.Key, got, ok)
				}
			}
			if strings.Join(keys, ",") != strings.Join(tc.final.locks, ",") || len(ids) != len(tc.final.sessions) ||
				len(delays) != len(tc.final.delays) || m.DelayCount() != len(delays) || m.SessionCount() != len(ids) {
				t.Fatalf("final: locks %v, sessions %v, delays %v; want %+v", keys, ids, delays, tc.final)
			}
			for i := range ids {
				if ids[i] != tc.final.sessions[i] {
					t.Fatalf("sessions %v, want %v", ids, tc.final.sessions)
				}
			}
			for k, seq := range tc.final.delays {
				if delays[k] != seq {
					t.Fatalf("delays %v, want %v", delays, tc.final.delays)
				}
			}
		})
	}
}

// checkSessionsSurvive checks that the whole state, sessions and delays
// included, comes back the same through a snapshot and through the
// storage records, and that the derived counts agree with the locks.
func checkSessionsSurvive(t testing.TB, m *core.Machine) {
	t.Helper()
	checkRequestsSurvive(t, m)
	perSession := map[uint64]int{}
	for _, l := range m.Locks() {
		if l.SessionID != 0 {
			perSession[l.SessionID]++
			if l.LeaseMS != 0 || l.LockDelayMS != 0 {
				t.Fatalf("session lock %+v has a lease or a delay", l)
			}
		}
		if _, d := m.Delay(l.Key); d {
			t.Fatalf("key %q is held and delayed", l.Key)
		}
	}
	m.ForEachHolder(func(l core.Lock) { // holders of multi-holder keys (kinds.go)
		if l.SessionID != 0 {
			perSession[l.SessionID]++
		}
	})
	perIdentity := map[string]int{}
	m.ForEachSession(func(x core.Session) {
		perIdentity[x.Identity]++
		if got := m.SessionLockCount(x.ID); got != perSession[x.ID] || len(m.SessionLocks(x.ID)) != got {
			t.Fatalf("session %d: %d locks counted, %d held", x.ID, got, perSession[x.ID])
		}
		delete(perSession, x.ID)
	})
	if len(perSession) != 0 {
		t.Fatalf("locks of sessions that are not open: %v", perSession)
	}
	for id, n := range perIdentity {
		if m.SessionsOf(id) != n {
			t.Fatalf("SessionsOf(%q) = %d, want %d", id, m.SessionsOf(id), n)
		}
	}
}

func TestSessionAccessors(t *testing.T) {
	m := v4Machine(t)
	applyAll(m,
		core.OpenSession("alice", ttl, delay), // 1
		core.OpenSession("bob", 2*ttl, 0),     // 2
		core.OpenSession("alice", ttl, 0),     // 3
		sgrant("z", 1), sgrant("a", 1), sgrant("m", 2),
		dgrant("d", delay),
		core.Expire("d", 4),
		core.RefreshSession(2),
	)
	if x, ok := m.Session(2); !ok || x != (core.Session{ID: 2, Identity: "bob", TTLMS: 2 * ttl, Epoch: 2}) {
		t.Fatalf("Session(2) = %+v, %t", x, ok)
	}
	if _, ok := m.Session(4); ok {
		t.Fatal("Session(4) exists")
	}
	if m.SessionsOf("alice") != 2 || m.SessionsOf("bob") != 1 || m.SessionsOf("carol") != 0 || m.SessionCount() != 3 {
		t.Fatalf("per identity: alice %d, bob %d, carol %d; %d sessions", m.SessionsOf("alice"), m.SessionsOf("bob"), m.SessionsOf("carol"), m.SessionCount())
	}
	locks := m.SessionLocks(1)
	if len(locks) != 2 || locks[0].Key != "a" || locks[1].Key != "z" || locks[0].SessionID != 1 || m.SessionLockCount(3) != 0 {
		t.Fatalf("SessionLocks(1) = %+v", locks)
	}
	if d, ok := m.Delay("d"); !ok || d != (core.Delay{Key: "d", DelayMS: delay, Seq: 1}) || m.LastDelaySeq() != 1 || m.LastSessionID() != 3 {
		t.Fatalf("Delay(d) = %+v, %t; last seq %d, last session %d", d, ok, m.LastDelaySeq(), m.LastSessionID())
	}
	n := 0
	m.ForEachDelay(func(core.Delay) { n++ })
	if n != 1 {
		t.Fatalf("ForEachDelay saw %d", n)
	}
	// Closing alice's first session frees its locks in key order: the
	// request records and delay sequence numbers depend on that order.
	applyAll(m, core.ExpireSession(1, 1))
	if d, _ := m.Delay("a"); d.Seq != 2 {
		t.Fatalf("a delayed with seq %d, want 2 (key order)", d.Seq)
	}
	if d, _ := m.Delay("z"); d.Seq != 3 {
		t.Fatalf("z delayed with seq %d, want 3", d.Seq)
	}
	if m.SessionsOf("alice") != 1 {
		t.Fatalf("SessionsOf(alice) = %d after an expiry", m.SessionsOf("alice"))
	}
}

// Below cluster version 4 every session and lock-delay command, and a
// Grant with a session or a lock-delay, is Noop: a mixed-version cluster
// refuses nothing it cannot apply and changes nothing an older member
// could not represent.
func TestVersion4CommandsWaitForTheClusterVersion(t *testing.T) {
	m := v3Full(t)
	before := m.Digest()
	snap := m.Snapshot()
	for _, c := range []core.Command{
		core.OpenSession("a", ttl, 0), core.CloseSession(1, ""), core.ExpireSession(1, 1), core.RefreshSession(1),
		core.ClearDelay("k", 1), sgrant("new", 1), dgrant("new", delay), dgrant("new", delay).WithRequest("a", "r"),
	} {
		if core.CommandVersion(c) != 4 {
			t.Fatalf("CommandVersion(%+v) = %d", c, core.CommandVersion(c))
		}
		if got := m.Apply(c); got != noop {
			t.Fatalf("at cluster version 3, Apply(%+v) = %v", c, got)
		}
	}
	if m.Digest() != before || !bytes.Equal(m.Snapshot(), snap) || snap[3] != core.SnapshotVersion4 {
		t.Fatal("version 4 commands changed a version 3 state")
	}
	// Raising the version changes the formats, not the locks.
	if r := m.Apply(core.SetClusterVersion(4)); r.Kind != core.ResultControlApplied {
		t.Fatal(r)
	}
	if s := m.Snapshot(); s[3] != core.SnapshotVersion5 || m.Digest() == before {
		t.Fatalf("at cluster version 4: snapshot version %d, digest unchanged %t", s[3], m.Digest() == before)
	}
	if got := m.Apply(core.OpenSession("a", ttl, 0)); got != opened(1) {
		t.Fatalf("OpenSession at version 4 = %v", got)
	}
	checkSessionsSurvive(t, m)
}

func TestSessionValidate(t *testing.T) {
	valid := []core.Command{
		core.OpenSession("", core.MinSessionTTLMS, 0),
		core.OpenSession(strings.Repeat("i", core.MaxIdentityLen), core.MaxSessionTTLMS, core.MaxLockDelayMS),
		core.CloseSession(1, ""), core.CloseSession(^uint64(0), "acct"),
		core.ExpireSession(1, 1), core.RefreshSession(9), core.ClearDelay("k", 1),
		sgrant("k", 1), sgrant("k", 1).WithRequest("a", "r"), dgrant("k", core.MaxLockDelayMS), dgrant("k", 0),
	}
	for _, c := range valid {
		if err := c.Validate(); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
	}
	invalid := map[string]core.Command{
		"ttl below the minimum":           core.OpenSession("", core.MinSessionTTLMS-1, 0),
		"ttl above the maximum":           core.OpenSession("", core.MaxSessionTTLMS+1, 0),
		"lock delay above the maximum":    core.OpenSession("", ttl, core.MaxLockDelayMS+1),
		"identity with NUL":               core.OpenSession("a\x00", ttl, 0),
		"open with a session id":          {Kind: core.KindOpenSession, TTLMS: ttl, SessionID: 1},
		"open with a key":                 {Kind: core.KindOpenSession, TTLMS: ttl, Key: "k"},
		"close without a session":         core.CloseSession(0, ""),
		"close with an epoch":             {Kind: core.KindCloseSession, SessionID: 1, Epoch: 1},
		"close with a long identity":      core.CloseSession(1, strings.Repeat("i", core.MaxIdentityLen+1)),
		"expire without an epoch":         core.ExpireSession(1, 0),
		"expire without a session":        core.ExpireSession(0, 1),
		"expire with an identity":         {Kind: core.KindExpireSession, SessionID: 1, Epoch: 1, Identity: "a"},
		"refresh without a session":       core.RefreshSession(0),
		"refresh with a token":            {Kind: core.KindRefreshSession, SessionID: 1, Token: 1},
		"clear without a seq":             core.ClearDelay("k", 0),
		"clear without a key":             core.ClearDelay("", 1),
		"clear with a session":            {Kind: core.KindClearDelay, Key: "k", DelaySeq: 1, SessionID: 1},
		"session command with control":    {Kind: core.KindRefreshSession, SessionID: 1, Control: core.SetClusterVersion(4).Control},
		"session grant with a lease":      {Kind: core.KindGrant, Key: "k", LeaseMS: lease, SessionID: 1},
		"session grant with a delay":      sgrant("k", 1).WithLockDelay(1),
		"grant delay above the max":       dgrant("k", core.MaxLockDelayMS+1),
		"grant without lease nor session": {Kind: core.KindGrant, Key: "k"},
		"release with a session":          {Kind: core.KindRelease, Key: "k", Token: 1, SessionID: 1},
		"expire with a delay":             {Kind: core.KindExpire, Key: "k", Token: 1, LockDelayMS: 1},
		"renew with a ttl":                {Kind: core.KindRenew, Key: "k", Token: 1, TTLMS: ttl},
		"grant with an epoch":             {Kind: core.KindGrant, Key: "k", LeaseMS: lease, Epoch: 1},
		"grant with a delay seq":          {Kind: core.KindGrant, Key: "k", LeaseMS: lease, DelaySeq: 1},
		"control with a session":          {Kind: core.KindControl, Control: core.SetClusterVersion(4).Control, SessionID: 1},
	}
	for name, c := range invalid {
		t.Run(name, func(t *testing.T) {
			wantCode(t, c.Validate(), core.CodeInvalidArgument)
			m := v4Machine(t)
			applyAll(m, core.OpenSession("", ttl, 0))
			before := m.Digest()
			if got := m.Apply(c); got != noop || m.Digest() != before {
				t.Fatalf("Apply(invalid) = %v", got)
			}
		})
	}
}

func TestSessionStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{core.KindOpenSession.String(), "open_session"},
		{core.KindClearDelay.String(), "clear_delay"},
		{opened(3).String(), "session_opened{session:3,epoch:1}"},
		{refreshed(3, 4).String(), "session_refreshed{session:3,epoch:4}"},
		{closed(3, 2).String(), "session_closed{session:3,count:2}"},
		{sessionExpired(3, true, 2).String(), "session_expired{session:3,existed:true,count:2}"},
		{delayed.String(), "delayed"},
		{delaysFull.String(), "delays_exhausted"},
		{core.Result{Kind: core.ResultSessionLocksExhausted}.String(), "session_locks_exhausted"},
	} {
		if tc.got != tc.want {
			t.Fatalf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// The digest covers each part of the session state: every change of one
// gives another digest, and two machines that reach the same state by
// different paths agree.
func TestDigestCoversSessions(t *testing.T) {
	base := func() *core.Machine {
		m := v4Machine(t)
		applyAll(m, core.OpenSession("a", ttl, delay), sgrant("x", 1), dgrant("y", delay), core.Expire("y", 2))
		return m
	}
	seen := map[[32]byte]string{base().Digest(): "base"}
	for name, c := range map[string]core.Command{
		"another session":       core.OpenSession("a", ttl, delay),
		"a refresh":             core.RefreshSession(1),
		"a session lock":        sgrant("z", 1),
		"a plain lock":          core.Grant("z", "w", lease, 7),
		"a lock with a delay":   dgrant("z", delay),
		"a delay cleared":       core.ClearDelay("y", 1),
		"the session closed":    core.CloseSession(1, ""),
		"the session expired":   core.ExpireSession(1, 1),
		"another session ttl":   core.OpenSession("a", ttl+1, delay),
		"another identity":      core.OpenSession("b", ttl, delay),
		"another session delay": core.OpenSession("a", ttl, delay+1),
	} {
		m := base()
		applyAll(m, c)
		d := m.Digest()
		if other, dup := seen[d]; dup {
			t.Fatalf("%s and %s have the same digest", name, other)
		}
		seen[d] = name
	}
	// A session opened and closed leaves the counter moved: not the base.
	m := base()
	applyAll(m, core.OpenSession("a", ttl, 0), core.CloseSession(2, ""))
	if _, dup := seen[m.Digest()]; dup {
		t.Fatal("the session counter is not in the digest")
	}
}

func TestLoadSessionsRejects(t *testing.T) {
	m := v4Machine(t)
	applyAll(m, core.OpenSession("a", ttl, delay), sgrant("x", 1), dgrant("y", delay), core.Expire("y", 2))
	good := m.SessionState()
	s1 := good.Sessions[0]
	d1 := good.Delays[0]
	for name, ss := range map[string]core.SessionState{
		"the session of a lock missing": {LastSessionID: 1, LastDelaySeq: 1, Delays: good.Delays},
		"a session above the counter":   {LastSessionID: 0, LastDelaySeq: 1, Sessions: good.Sessions, Delays: good.Delays},
		"a delay above the counter":     {LastSessionID: 1, LastDelaySeq: 0, Sessions: good.Sessions, Delays: good.Delays},
		"a held key delayed":            {LastSessionID: 1, LastDelaySeq: 2, Sessions: good.Sessions, Delays: []core.Delay{{Key: "x", DelayMS: 1, Seq: 2}, d1}},
		"sessions out of order":         {LastSessionID: 3, LastDelaySeq: 1, Sessions: []core.Session{{ID: 3, TTLMS: ttl, Epoch: 1}, s1}, Delays: good.Delays},
		"a session with epoch 0":        {LastSessionID: 1, LastDelaySeq: 1, Sessions: []core.Session{{ID: 1, TTLMS: ttl}}, Delays: good.Delays},
		"a delay of 0":                  {LastSessionID: 1, LastDelaySeq: 1, Sessions: good.Sessions, Delays: []core.Delay{{Key: "y", Seq: 1}}},
		"two delays with one seq":       {LastSessionID: 1, LastDelaySeq: 1, Sessions: good.Sessions, Delays: []core.Delay{{Key: "a", DelayMS: 1, Seq: 1}, d1}},
		"delays out of order":           {LastSessionID: 1, LastDelaySeq: 2, Sessions: good.Sessions, Delays: []core.Delay{d1, {Key: "a", DelayMS: 1, Seq: 2}}},
	} {
		t.Run(name, func(t *testing.T) {
			x := rebuildFromRecords(t, nil, m)
			before := x.Digest()
			wantCode(t, x.LoadSessions(ss), core.CodeMalformed)
			if x.Digest() != before {
				t.Fatal("a refused load changed the machine")
			}
		})
	}
	// Before cluster version 4 nothing of it may exist.
	v3 := v3Full(t)
	wantCode(t, v3.LoadSessions(core.SessionState{LastSessionID: 1}), core.CodeMalformed)
	if err := v3.LoadSessions(core.SessionState{}); err != nil {
		t.Fatal(err)
	}
	// A session holding more than MaxLocksPerSession locks.
	big := v4Machine(t)
	var locks []core.Lock
	for i := range core.MaxLocksPerSession + 1 {
		locks = append(locks, core.Lock{Key: "k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i), Token: uint64(i + 1), SessionID: 1})
	}
	big.Load(uint64(len(locks)), locks)
	wantCode(t, big.LoadSessions(core.SessionState{LastSessionID: 1, Sessions: []core.Session{{ID: 1, TTLMS: ttl, Epoch: 1}}}), core.CodeMalformed)
}

func itoa(i int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + i%10)}, b...)
		if i /= 10; i == 0 {
			return string(b)
		}
	}
}

// Reseed keeps sessions and delays with the locks, drops them with
// DropLocks, and always moves the session counter on.
func TestReseedSessions(t *testing.T) {
	m := v4Machine(t)
	applyAll(m, core.OpenSession("a", ttl, delay), sgrant("x", 1), sgrant("w", 1).WithRequest("a", "r"), dgrant("y", delay), core.Expire("y", 3))
	s := m.SnapshotState()
	for _, drop := range []bool{false, true} {
		out, _, err := core.Reseed(s, core.ReseedOptions{BumpTokens: 10, DropLocks: drop, Static: true})
		if err != nil {
			t.Fatal(err)
		}
		if out.Sessions.LastSessionID != 1+core.ReseedSessionBump || out.Sessions.LastDelaySeq != 1 {
			t.Fatalf("drop %t: counters %+v", drop, out.Sessions)
		}
		if kept := len(out.Sessions.Sessions) == 1 && len(out.Sessions.Delays) == 1 && len(out.Locks) == 2; kept == drop {
			t.Fatalf("drop %t: %+v, %d locks", drop, out.Sessions, len(out.Locks))
		}
		x := core.NewMachine()
		if err := x.Restore(core.EncodeSnapshotState(out)); err != nil {
			t.Fatalf("drop %t: the reseeded state does not restore: %v", drop, err)
		}
		if got := x.Apply(core.OpenSession("a", ttl, 0)); got != opened(2+core.ReseedSessionBump) {
			t.Fatalf("drop %t: first session after the reseed: %v", drop, got)
		}
		if drop && x.LookupRequest("a", "r").Status != core.RequestEnded {
			t.Fatal("a dropped session lock's request did not end")
		}
	}
	// A version 3 state keeps its counter at 0.
	out, _, err := core.Reseed(v3Full(t).SnapshotState(), core.ReseedOptions{Static: true})
	if err != nil || out.Sessions.LastSessionID != 0 {
		t.Fatalf("v3 reseed: %+v, %v", out.Sessions, err)
	}
	// The counter never wraps.
	s.Sessions.LastSessionID = ^uint64(0) - core.ReseedSessionBump + 1
	if _, _, err := core.Reseed(s, core.ReseedOptions{Static: true}); err == nil {
		t.Fatal("a reseed that wraps the session counter succeeded")
	}
}
