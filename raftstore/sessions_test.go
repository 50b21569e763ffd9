package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// sessionWorkload is requestWorkload (grants with and without request
// ids, releases, expires, renews) at cluster version 4 plus sessions and
// lock-delays: sessions opened (some with a lock-delay), grants in them,
// plain grants with a lock-delay, sessions closed, refreshed and expired
// (mostly at their epoch, sometimes at a stale one), and delays cleared
// (mostly at their sequence number). It counts what the machine did.
type sessionWorkload struct {
	requestWorkload
	expired, delaysCleared int
}

func (w *sessionWorkload) next(m *core.Machine) core.Command {
	ss := m.SessionState() // sorted: the workload is deterministic
	pick := func() (core.Session, bool) {
		if len(ss.Sessions) == 0 {
			return core.Session{}, false
		}
		return ss.Sessions[w.r.IntN(len(ss.Sessions))], true
	}
	key := fmt.Sprintf("k%d", w.r.IntN(6))
	switch p := w.r.IntN(100); {
	case p < 8:
		return core.OpenSession(fmt.Sprintf("id-%d", w.r.IntN(2)), core.MinSessionTTLMS, uint64(w.r.IntN(2))*1500)
	case p < 28:
		if x, ok := pick(); ok {
			w.now += w.r.Uint64N(1000)
			return core.Grant(key, "o", 0, w.now).InSession(x.ID)
		}
	case p < 36:
		w.now += w.r.Uint64N(1000)
		return core.Grant(key, "o", 1000, w.now).WithLockDelay(700)
	case p < 40:
		if x, ok := pick(); ok {
			return core.CloseSession(x.ID, x.Identity)
		}
	case p < 44:
		if x, ok := pick(); ok {
			return core.RefreshSession(x.ID)
		}
	case p < 50:
		if x, ok := pick(); ok {
			epoch := x.Epoch
			if w.r.IntN(4) == 0 && epoch > 1 {
				epoch-- // a stale expiry: changes nothing
			} else if m.SessionLockCount(x.ID) > 0 {
				w.expired++
			}
			return core.ExpireSession(x.ID, epoch)
		}
	case p < 58:
		if len(ss.Delays) > 0 {
			d := ss.Delays[w.r.IntN(len(ss.Delays))]
			if w.r.IntN(5) == 0 {
				return core.ClearDelay(d.Key, d.Seq+1) // stale or future: nothing
			}
			w.delaysCleared++
			return core.ClearDelay(d.Key, d.Seq)
		}
	}
	return w.requestWorkload.next(m)
}

// v4Ref is a cluster version 4 machine (index 1 applied the version) and
// the store it was written to.
func v4Ref(t testing.TB, s *Store) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 1, core.SetClusterVersion(4)), HardState: raftpb.HardState{Term: 1, Commit: 1},
		State: applyRun(m, 1, core.SetClusterVersion(4))})
	return m
}

// checkSessionRows checks that the session rows of s are exactly m's
// sessions and delayed keys, with the header's counters and counts.
func checkSessionRows(t *testing.T, step string, s *Store, m *core.Machine) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	h, err := readSessionsHeader(s.view)
	if err != nil || h != markSessions(m) || s.st.sessions != h {
		t.Fatalf("%s: header %+v (cached %+v), %v; machine %+v", step, h, s.st.sessions, err, markSessions(m))
	}
	got := core.SessionState{LastSessionID: h.lastID, LastDelaySeq: h.lastSeq}
	if err := forEachSessionRow(s.view, h, func(x core.Session) error {
		got.Sessions = append(got.Sessions, x)
		return nil
	}, func(d core.Delay) error {
		got.Delays = append(got.Delays, d)
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	if want := m.SessionState(); !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: session rows %+v, machine %+v", step, got, want)
	}
}

// The session and delay rows follow the machine through runs of commands,
// reopen after reopen, and a snapshot built from the rows is the
// machine's.
func TestSessionRowsPersist(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	ref := v4Ref(t, s)
	w := &sessionWorkload{requestWorkload: requestWorkload{r: rand.New(rand.NewPCG(7, 8))}}
	index := uint64(1)
	maxSessions, maxDelays, sessionLocks := 0, 0, 0
	for run := 0; run < 80; run++ {
		var cmds []core.Command
		scratch := core.NewMachine()
		if err := scratch.Restore(ref.Snapshot()); err != nil {
			t.Fatal(err)
		}
		for range 1 + w.r.IntN(12) {
			c := w.next(scratch)
			scratch.Apply(c)
			cmds = append(cmds, c)
		}
		first := index + 1
		index += uint64(len(cmds))
		mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, first, cmds...), HardState: raftpb.HardState{Term: 1, Commit: index},
			State: applyRun(ref, index, cmds...)})
		step := fmt.Sprintf("run %d", run)
		checkMachine(t, step, s, index, ref, raftpb.ConfState{})
		checkSessionRows(t, step, s, ref)
		maxSessions, maxDelays = max(maxSessions, ref.SessionCount()), max(maxDelays, ref.DelayCount())
		ref.ForEachSession(func(x core.Session) { sessionLocks = max(sessionLocks, ref.SessionLockCount(x.ID)) })
		if run%10 == 9 {
			s = reopen(t, s, dir)
			checkMachine(t, step+" reopened", s, index, ref, raftpb.ConfState{})
		}
		if run%8 == 7 {
			v, err := s.viewState()
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodeSnapshot(v, ref.Len(), 0, nil)
			_ = v.snap.Close()
			if err != nil || !bytes.Equal(got, ref.Snapshot()) {
				t.Fatalf("%s: the snapshot from the store rows differs from the machine's (%v)", step, err)
			}
		}
	}
	if maxSessions < 2 || maxDelays < 2 || sessionLocks < 2 || w.expired == 0 || w.delaysCleared == 0 {
		t.Fatalf("the workload had at most %d sessions, %d delays, %d locks in a session, %d expiries, %d clears: it did not test",
			maxSessions, maxDelays, sessionLocks, w.expired, w.delaysCleared)
	}
}

// sessionsFixture is a cluster version 4 run: sessions 1 (two locks,
// lock-delay 1500) and 2 (one lock, no delay), session 1 expired, so its
// keys a and b are delayed; a plain lock c with a lock-delay expired, so
// c is delayed; d held in session 2.
func sessionsFixture() []core.Command {
	return []core.Command{
		core.OpenSession("acct", core.MinSessionTTLMS, 1500),
		core.OpenSession("", core.MinSessionTTLMS, 0),
		core.Grant("a", "w", 0, 10).InSession(1),
		core.Grant("b", "w", 0, 10).InSession(1).WithRequest("acct", "r-b"),
		core.Grant("c", "w", 1000, 10).WithLockDelay(900),
		core.Grant("d", "w", 0, 10).InSession(2),
		core.ExpireSession(1, 1),
		core.Expire("c", 3),
	}
}

// Installing a snapshot replaces every session and delay row; one without
// sessions removes them all.
func TestSessionRowsSnapshotInstall(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	local := v4Ref(t, s)
	run := sessionsFixture()
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 9}, State: applyRun(local, 9, run...)})
	if local.SessionCount() != 1 || local.DelayCount() != 3 || local.Len() != 1 {
		t.Fatalf("setup: %d sessions, %d delays, %d locks", local.SessionCount(), local.DelayCount(), local.Len())
	}
	checkSessionRows(t, "local", s, local)

	// The leader's state at index 30: other sessions, other delays.
	leader := core.NewMachine()
	lrun := []core.Command{core.SetClusterVersion(4)}
	for range 5 {
		lrun = append(lrun, core.OpenSession("y", core.MinSessionTTLMS, 800))
	}
	lrun = append(lrun, core.Grant("x", "", 0, 1).InSession(4), core.ExpireSession(4, 1), core.CloseSession(2, "y"),
		core.Grant("a", "", 0, 1).InSession(5), core.Grant("m", "", 0, 1).InSession(5), core.Grant("n", "", 1000, 1),
		core.Grant("o", "", 1000, 1).WithLockDelay(5))
	applyRun(leader, 30, lrun...)
	cs := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap := raftpb.Snapshot{Data: leader.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 30, Term: 2}}
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 2, Commit: 30}})
	checkMachine(t, "installed", s, 30, leader, cs)
	checkSessionRows(t, "installed", s, leader)

	after := []core.Command{core.ClearDelay("x", 1), core.OpenSession("z", core.MinSessionTTLMS, 0)}
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(2, 31, after...), HardState: raftpb.HardState{Term: 2, Commit: 32},
		State: applyRun(leader, 32, after...)})
	s = reopen(t, s, dir)
	checkMachine(t, "after", s, 32, leader, cs)
	checkSessionRows(t, "after", s, leader)
	if x, ok := leader.Session(6); !ok || x.Identity != "z" || leader.DelayCount() != 0 {
		t.Fatalf("after: session 6 %+v %t, %d delays", x, ok, leader.DelayCount())
	}

	// A snapshot of a state at cluster version 3 has no session rows.
	v3 := core.NewMachine()
	v3run := []core.Command{core.SetClusterVersion(3)}
	for i := range 7 {
		v3run = append(v3run, core.Grant(fmt.Sprintf("q%d", i), "", 1000, 1))
	}
	applyRun(v3, 40, v3run...)
	snap = raftpb.Snapshot{Data: v3.Snapshot(), Metadata: raftpb.SnapshotMetadata{ConfState: cs, Index: 40, Term: 3}}
	mustWrite(t, s, ReadyWrite{Snapshot: snap, HardState: raftpb.HardState{Term: 3, Commit: 40}})
	checkMachine(t, "v3 installed", s, 40, v3, cs)
	checkSessionRows(t, "v3 installed", s, v3)
	s.mu.RLock()
	_, ok, err := get(s.view, keySessions)
	s.mu.RUnlock()
	if ok || err != nil {
		t.Fatalf("a state without sessions left a header row (%v)", err)
	}
}

// Write refuses a session change that does not follow the persisted rows
// or carries a row LoadMachine would refuse, and writes nothing.
func TestSessionRowsWriteRejects(t *testing.T) {
	x := core.Session{ID: 2, TTLMS: core.MinSessionTTLMS, Epoch: 1}
	d := core.Delay{Key: "k", DelayMS: 5, Seq: 2}
	base := SessionChange{LastSessionID: 3, LastDelaySeq: 3, Sessions: 1, Delays: 1}
	with := func(f func(*SessionChange)) SessionChange { c := base; f(&c); return c }
	for _, tc := range []struct {
		name string
		sc   SessionChange
	}{
		{"session counter backwards", with(func(c *SessionChange) { c.LastSessionID = 1 })},
		{"delay counter backwards", with(func(c *SessionChange) { c.LastDelaySeq = 1 })},
		{"too many sessions", with(func(c *SessionChange) { c.Sessions = core.MaxSessions + 1 })},
		{"negative delays", with(func(c *SessionChange) { c.Delays = -1 })},
		{"session above the counter", with(func(c *SessionChange) { c.Put = []core.Session{{ID: 4, TTLMS: x.TTLMS, Epoch: 1}} })},
		{"invalid session", with(func(c *SessionChange) { c.Put = []core.Session{{ID: 3, TTLMS: 1, Epoch: 1}} })},
		{"session put and deleted", with(func(c *SessionChange) { c.Put, c.Delete = []core.Session{x}, []uint64{x.ID} })},
		{"delay above the counter", with(func(c *SessionChange) { c.PutDelays = []core.Delay{{Key: "k", DelayMS: 5, Seq: 4}} })},
		{"invalid delay", with(func(c *SessionChange) { c.PutDelays = []core.Delay{{Key: "k", Seq: 3}} })},
		{"delay put and deleted", with(func(c *SessionChange) { c.PutDelays, c.DeleteDelays = []core.Delay{d}, []string{d.Key} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTestStore(t, t.TempDir())
			first := SessionChange{LastSessionID: 2, LastDelaySeq: 2, Sessions: 1, Delays: 1, Put: []core.Session{x}, PutDelays: []core.Delay{d}}
			mustWrite(t, s, ReadyWrite{Entries: mkEnts(1, 1, 3), HardState: raftpb.HardState{Term: 1, Commit: 3},
				State: &StateChange{Index: 1, Sessions: &first}})
			was := s.st.sessions
			err := s.Write(ReadyWrite{State: &StateChange{Index: 2, Sessions: &tc.sc}})
			if !errors.Is(err, ErrInvariant) {
				t.Fatalf("Write = %v, want ErrInvariant", err)
			}
			if s.AppliedIndex() != 1 || s.st.sessions != was {
				t.Fatalf("a refused write changed the state: applied %d, sessions %+v", s.AppliedIndex(), s.st.sessions)
			}
		})
	}
}

// corruptV4Store writes the sessionsFixture store and closes it.
func corruptV4Store(t *testing.T) (dir string, m *core.Machine) {
	dir = t.TempDir()
	s := openTestStore(t, dir)
	m = v4Ref(t, s)
	run := sessionsFixture()
	mustWrite(t, s, ReadyWrite{Entries: cmdEntries(1, 2, run...), HardState: raftpb.HardState{Term: 1, Commit: 9}, State: applyRun(m, 9, run...)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func TestSessionRowsCorrupt(t *testing.T) {
	loadMachine := func(s *Store) error { _, _, _, err := s.LoadMachine(); return err }
	dir, m := corruptV4Store(t)
	h := markSessions(m)
	header := func(f func(*sessionMark)) []byte { x := h; f(&x); return encodeSessionsHeader(x) }
	s2, _ := m.Session(2)
	da, _ := m.Delay("a")
	for _, tc := range []struct {
		name       string
		key, value []byte
		read       func(*Store) error
	}{
		{"header short", keySessions, []byte{1, 2, 3}, nil},
		{"header counts too many sessions", keySessions, header(func(x *sessionMark) { x.sessions = core.MaxSessions + 1 }), nil},
		{"header missing", keySessions, nil, loadMachine},
		{"header counts a missing session", keySessions, header(func(x *sessionMark) { x.sessions++ }), loadMachine},
		{"header counts a missing delay", keySessions, header(func(x *sessionMark) { x.delays++ }), loadMachine},
		{"header counts too few delays", keySessions, header(func(x *sessionMark) { x.delays-- }), loadMachine},
		{"session counter below a session", keySessions, header(func(x *sessionMark) { x.lastID = 1 }), loadMachine},
		{"delay counter below a delay", keySessions, header(func(x *sessionMark) { x.lastSeq = 1 }), loadMachine},
		{"session row missing (its lock stays)", sessionKey(2), nil, loadMachine},
		{"session row garbage", sessionKey(2), []byte{1, 2}, loadMachine},
		{"session row under another id", sessionKey(1), core.EncodeSessionRecord(s2), loadMachine},
		{"delay row garbage", delayKey("a"), []byte{1}, loadMachine},
		{"delay row under another key", delayKey("e"), core.EncodeDelayRecord(da), loadMachine},
		{"delay row of a held key", delayKey("d"), core.EncodeDelayRecord(core.Delay{Key: "d", DelayMS: 5, Seq: 1}), loadMachine},
		{"lock of a session not open", lockKey("e"), core.EncodeLockRecord(core.Lock{Key: "e", Token: 1, SessionID: 1}), loadMachine},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := corruptV4Store(t)
			corruptAndCheck(t, d, tc.key, tc.value, tc.read)
		})
	}
	// The untouched store loads the machine.
	s := openTestStore(t, dir)
	checkMachine(t, "untouched", s, 9, m, raftpb.ConfState{})
	checkSessionRows(t, "untouched", s, m)
}

// Session rows before cluster version 4 are corrupt: an older state has
// none.
func TestSessionRowsBeforeVersion4Corrupt(t *testing.T) {
	dir, _ := corruptV3Store(t)
	corruptAndCheck(t, dir, keySessions, encodeSessionsHeader(sessionMark{lastID: 1}), func(s *Store) error {
		_, _, _, err := s.LoadMachine()
		return err
	})
}

// Through a real node: sessions proposed at cluster version 4 hold locks,
// an expiry frees them (the event names them) and leaves their keys in
// the session's lock-delay, a release leaves none, and after a snapshot
// and a restart the node finds the same sessions, delays and digest.
func TestNodeSessionsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	n := startSingle(t, st, Config{SnapshotEntries: 5, CompactKeep: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	propose := func(c core.Command) Applied {
		t.Helper()
		a, err := n.Propose(ctx, c)
		if err != nil {
			t.Fatalf("Propose(%+v): %v", c, err)
		}
		return a
	}
	open := core.OpenSession("acct", 10_000, 2_000)
	if a := propose(open); a.Result.Kind != core.ResultNoop {
		t.Fatalf("OpenSession below cluster version 4 = %v", a.Result)
	}
	propose(core.SetClusterVersion(4))
	a := propose(open)
	if a.Result.Kind != core.ResultSessionOpened || a.Result.Session != 1 {
		t.Fatalf("OpenSession = %v", a.Result)
	}
	id := a.Result.Session
	for _, key := range []string{"s/b", "s/a", "s/c"} {
		if g := propose(core.Grant(key, "w", 0, 1_000).InSession(id)); g.Result.Kind != core.ResultGranted {
			t.Fatalf("grant %s in session = %v", key, g.Result)
		}
	}
	g := propose(core.Grant("s/c", "w", 0, 1_000).InSession(id))
	if g.Result.Kind != core.ResultGrantRejected {
		t.Fatalf("second grant of s/c = %v", g.Result)
	}
	rel := propose(core.Release("s/c", 3))
	if rel.Result.Kind != core.ResultReleased {
		t.Fatalf("release s/c = %v", rel.Result)
	}
	exp := propose(core.ExpireSession(id, 1))
	if exp.Result != (core.Result{Kind: core.ResultSessionExpired, Session: id, Existed: true, Count: 2}) ||
		!slices.Equal(exp.Keys, []string{"s/a", "s/b"}) {
		t.Fatalf("ExpireSession = %v, keys %q", exp.Result, exp.Keys)
	}
	if d := propose(core.Grant("s/a", "w", 1000, 1_000)); d.Result.Kind != core.ResultDelayed {
		t.Fatalf("grant of a delayed key = %v", d.Result)
	}
	if d := propose(core.Grant("s/c", "w", 1000, 1_000)); d.Result.Kind != core.ResultGranted {
		t.Fatalf("grant of a released key = %v", d.Result)
	}
	propose(core.OpenSession("", core.MinSessionTTLMS, 0))
	testkit.Eventually(t, 10*time.Second, "a snapshot is taken", func() bool { return n.snapIndex.Load() > 0 })
	var digest [32]byte
	var ss core.SessionState
	n.View(func(m *core.Machine) { digest, ss = m.Digest(), m.SessionState() })
	n.Stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if len(ss.Sessions) != 1 || len(ss.Delays) != 2 || ss.LastSessionID != 2 {
		t.Fatalf("before restart: %+v", ss)
	}

	st2 := openTestStore(t, dir)
	n2 := startSingle(t, st2, Config{})
	var gotDigest [32]byte
	var got core.SessionState
	n2.View(func(m *core.Machine) { gotDigest, got = m.Digest(), m.SessionState() })
	if !reflect.DeepEqual(got, ss) || gotDigest != digest {
		t.Fatalf("after restart: %+v, want %+v (digest equal: %t)", got, ss, gotDigest == digest)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	if a, err := n2.Propose(ctx2, core.ClearDelay("s/a", ss.Delays[0].Seq)); err != nil || a.Result.Kind != core.ResultDelayCleared {
		t.Fatalf("ClearDelay after restart = %v, %v", a.Result, err)
	}
	if a, err := n2.Propose(ctx2, core.OpenSession("", core.MinSessionTTLMS, 0)); err != nil || a.Result.Session != 3 {
		t.Fatalf("a session opened after restart = %v, %v: IDs are never reused", a.Result, err)
	}
}

// BenchmarkWriteExpireSessionFull is the store's part of the largest
// ExpireSession: the node's bookkeeping for the run (ready.go) and the one
// synced batch that deletes MaxLocksPerSession lock rows and writes as
// many delay rows.
func BenchmarkWriteExpireSessionFull(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		s, err := Open(b.TempDir(), StoreOptions{Logger: testkit.QuietLogger(), Disk: DiskOptions{BallastBytes: -1}}) // synced
		if err != nil {
			b.Fatal(err)
		}
		m := v4Ref(b, s)
		cmds := []core.Command{core.OpenSession("acct", core.MinSessionTTLMS, 15_000)}
		for i := range core.MaxLocksPerSession {
			cmds = append(cmds, core.Grant(fmt.Sprintf("sess/%05d", i), "o", 0, 1).InSession(1))
		}
		mustWrite(b, s, ReadyWrite{Entries: cmdEntries(1, 2, cmds...), HardState: raftpb.HardState{Term: 1, Commit: uint64(1 + len(cmds))},
			State: applyRun(m, uint64(1+len(cmds)), cmds...)})
		index := uint64(2 + len(cmds))
		b.StartTimer()
		sc := applyRun(m, index, core.ExpireSession(1, 1))
		mustWrite(b, s, ReadyWrite{Entries: cmdEntries(1, index, core.ExpireSession(1, 1)), HardState: raftpb.HardState{Term: 1, Commit: index}, State: sc})
		b.StopTimer()
		if len(sc.Delete) != core.MaxLocksPerSession || len(sc.Sessions.PutDelays) != core.MaxLocksPerSession {
			b.Fatalf("%d lock rows deleted, %d delay rows written", len(sc.Delete), len(sc.Sessions.PutDelays))
		}
		_ = s.Close()
		b.StartTimer()
	}
}
