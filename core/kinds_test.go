package core_test

import (
	"bytes"
	"encoding/hex"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v5Machine is an empty cluster version 5 machine.
func v5Machine(t testing.TB) *core.Machine {
	t.Helper()
	m := v4Machine(t)
	if r := m.Apply(core.SetClusterVersion(5)); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetClusterVersion(5) = %v", r)
	}
	return m
}

// sem is a Grant of a slot of semaphore key of limit n; shared a shared
// Grant of read/write key key; excl an exclusive one (a mutex Grant).
func sem(key string, n uint32) core.Command {
	return core.Grant(key, "w", lease, 7).WithKind(n, core.ModeExclusive)
}
func shared(key string) core.Command {
	return core.Grant(key, "r", lease, 7).WithKind(0, core.ModeShared)
}
func excl(key string) core.Command { return core.Grant(key, "x", lease, 7) }

var (
	holdersFull   = core.Result{Kind: core.ResultHoldersExhausted}
	limitMismatch = func(limit uint32, tok uint64) core.Result {
		return core.Result{Kind: core.ResultLimitMismatch, Limit: limit, Token: tok}
	}
)

// TestKinds is the table of every branch of a Grant, Release, Renew,
// Expire, ClearDelay and session end of a semaphore or read/write key:
// each scenario runs on a fresh cluster version 5 machine (with small
// limits where it says), checks each result and whether the state
// changed, then that the state survives its snapshot and its storage
// records, and the holders of each key it names, in token order.
func TestKinds(t *testing.T) {
	tests := []struct {
		name       string
		maxHolders int
		delays     int // MaxDelayedKeys for the test (0: the real one)
		steps      []sessStep
		holders    map[string][]uint64 // key -> holders' tokens
		slots      map[string][]uint64 // key -> delayed slots' seqs
	}{
		{
			name: "semaphore: N holders, each its own token, then held",
			steps: []sessStep{
				{sem("s", 3), granted(1), true},
				{sem("s", 3), granted(2), true},
				{sem("s", 3), granted(3), true},
				{sem("s", 3), grantRejected(1), false},
				{core.Release("s", 2), released, true},
				{sem("s", 3), granted(4), true},
				{core.Release("s", 2), notFound, false},
			},
			holders: map[string][]uint64{"s": {1, 3, 4}},
		},
		{
			name: "limit mismatch names the key's limit, whichever side",
			steps: []sessStep{
				{sem("s", 3), granted(1), true},
				{sem("s", 4), limitMismatch(3, 1), false},
				{excl("s"), limitMismatch(3, 1), false},
				{shared("s"), limitMismatch(3, 1), false},
				{excl("m"), granted(2), true},
				{sem("m", 2), limitMismatch(1, 2), false},
				{shared("r"), granted(3), true},
				{sem("r", 2), limitMismatch(1, 3), false},
				{core.Release("s", 1), released, true},
				{sem("s", 4), granted(4), true}, // a free key takes the next kind
			},
			holders: map[string][]uint64{"s": {4}, "m": {2}, "r": {3}},
		},
		{
			name: "read/write: shared beside shared, exclusive excluded both ways",
			steps: []sessStep{
				{shared("k"), granted(1), true},
				{shared("k"), granted(2), true},
				{excl("k"), grantRejected(1), false},
				{core.Release("k", 1), released, true},
				{excl("k"), grantRejected(2), false},
				{core.Release("k", 2), released, true},
				{excl("k"), granted(3), true},
				{shared("k"), grantRejected(3), false},
				{core.Release("k", 3), released, true},
				{shared("k"), granted(4), true},
			},
			holders: map[string][]uint64{"k": {4}},
		},
		{
			name:       "shared holders bounded by MaxHoldersPerKey",
			maxHolders: 2,
			steps: []sessStep{
				{shared("k"), granted(1), true},
				{shared("k"), granted(2), true},
				{shared("k"), holdersFull, false},
				{core.Release("k", 1), released, true},
				{shared("k"), granted(3), true},
			},
			holders: map[string][]uint64{"k": {2, 3}},
		},
		{
			name: "per-holder renew and expire; stale tokens change nothing",
			steps: []sessStep{
				{sem("s", 2), granted(1), true},
				{sem("s", 2), granted(2), true},
				{core.Renew("s", 1, 2*lease), core.Result{Kind: core.ResultRenewed, Token: 1}, true},
				{core.Renew("s", 1, lease), core.Result{Kind: core.ResultRenewed, Token: 1}, false},
				{core.Renew("s", 9, 2*lease), notFound, false},
				{core.Expire("s", 9), expiredFalse, false},
				{core.Expire("s", 2), expiredTrue, true},
				{core.Expire("s", 2), expiredFalse, false},
				{core.Release("s", 2), notFound, false},
			},
			holders: map[string][]uint64{"s": {1}},
		},
		{
			name: "semaphore lock-delay: a failed holder's slot stays occupied until cleared",
			steps: []sessStep{
				{sem("s", 2).WithLockDelay(delay), granted(1), true},
				{sem("s", 2), granted(2), true},
				{core.Expire("s", 1), expiredTrue, true}, // slot seq 1
				{sem("s", 2), delayed, false},            // one holder, one delayed slot
				{core.Release("s", 2), released, true},
				{sem("s", 2), granted(3), true},
				{sem("s", 2), delayed, false}, // one holder + one delayed slot
				{excl("s"), limitMismatch(2, 3), false},
				{core.ClearDelay("s", 2), notFound, false},
				{core.ClearDelay("s", 1), delayCleared, true},
				{core.ClearDelay("s", 1), notFound, false},
				{sem("s", 2), granted(4), true},
			},
			holders: map[string][]uint64{"s": {3, 4}},
		},
		{
			name: "a key of delayed slots only keeps its kind",
			steps: []sessStep{
				{sem("s", 2).WithLockDelay(delay), granted(1), true},
				{core.Expire("s", 1), expiredTrue, true},
				{sem("s", 3), limitMismatch(2, 0), false},
				{sem("s", 2), granted(2), true},
				{sem("s", 2), delayed, false},
			},
			holders: map[string][]uint64{"s": {2}},
			slots:   map[string][]uint64{"s": {1}},
		},
		{
			name: "read/write lock-delay: a failed reader delays writers only",
			steps: []sessStep{
				{shared("k").WithLockDelay(delay), granted(1), true},
				{core.Expire("k", 1), expiredTrue, true}, // shared slot, seq 1
				{excl("k"), delayed, false},
				{shared("k"), granted(2), true},
				{core.Release("k", 2), released, true},
				{excl("k"), delayed, false},
				{core.ClearDelay("k", 1), delayCleared, true},
				{excl("k"), granted(3), true},
			},
			holders: map[string][]uint64{"k": {3}},
		},
		{
			name: "read/write lock-delay: a failed writer delays everyone",
			steps: []sessStep{
				{excl("k").WithLockDelay(delay), granted(1), true},
				{core.Expire("k", 1), expiredTrue, true},
				{shared("k"), delayed, false},
				{excl("k"), delayed, false},
				{sem("k", 2), delayed, false},
				{core.ClearDelay("k", 1), delayCleared, true},
				{shared("k"), granted(2), true},
			},
			holders: map[string][]uint64{"k": {2}},
		},
		{
			name:   "delayed slots count towards MaxDelayedKeys",
			delays: 1,
			steps: []sessStep{
				{sem("s", 3).WithLockDelay(delay), granted(1), true},
				{sem("s", 3).WithLockDelay(delay), granted(2), true},
				{core.Expire("s", 1), expiredTrue, true},
				{core.Expire("s", 2), delaysFull, false},
			},
			holders: map[string][]uint64{"s": {2}},
			slots:   map[string][]uint64{"s": {1}},
		},
		{
			name: "sessions: slots and shared holds, ended together by key then token",
			steps: []sessStep{
				{core.OpenSession("a", ttl, delay), opened(1), true},
				{sem("s", 3).InSession(1), granted(1), true},
				{sem("s", 3).InSession(1), granted(2), true},
				{sem("s", 3), granted(3), true},
				{shared("r").InSession(1), granted(4), true},
				{excl("m").InSession(1), granted(5), true},
				{core.Expire("s", 1), expiredFalse, false}, // no lease: ends with its session
				{core.Renew("s", 2, lease), noop, false},
				{core.ExpireSession(1, 1), sessionExpired(1, true, 4), true},
				// m delayed (seq 1), r's shared slot (2), s's two slots (3, 4)
				{sem("s", 3), delayed, false},
				{shared("r"), granted(6), true},
				{excl("m"), delayed, false},
			},
			holders: map[string][]uint64{"s": {3}, "r": {6}},
			slots:   map[string][]uint64{"s": {3, 4}, "r": {2}},
		},
		{
			name: "close session releases every slot without delay",
			steps: []sessStep{
				{core.OpenSession("a", ttl, delay), opened(1), true},
				{sem("s", 2).InSession(1), granted(1), true},
				{shared("r").InSession(1), granted(2), true},
				{core.CloseSession(1, "a"), closed(1, 2), true},
				{sem("s", 2), granted(3), true},
				{excl("r"), granted(4), true},
			},
			holders: map[string][]uint64{"s": {3}, "r": {4}},
		},
		{
			name: "a retried acquire names its own holder",
			steps: []sessStep{
				{sem("s", 2).WithRequest("id", "a"), granted(1), true},
				{sem("s", 2).WithRequest("id", "b"), granted(2), true},
				{sem("s", 2).WithRequest("id", "a"), core.Result{Kind: core.ResultGrantRepeated, Token: 1}, false},
				{sem("t", 2).WithRequest("id", "b"), core.Result{Kind: core.ResultRequestMismatch, Token: 2}, false},
				{core.Release("s", 1), released, true},
				{sem("s", 2).WithRequest("id", "a"), core.Result{Kind: core.ResultGrantEnded, Token: 1}, false},
			},
			holders: map[string][]uint64{"s": {2}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := v5Machine(t)
			m.SetSessionLimitsForTest(0, 0, tc.delays)
			m.SetMaxHoldersForTest(tc.maxHolders)
			for i, s := range tc.steps {
				before := m.Digest()
				if got := m.Apply(s.cmd); got != s.want {
					t.Fatalf("step %d %+v = %v, want %v", i, s.cmd, got, s.want)
				}
				if changed := m.Digest() != before; changed != s.changes {
					t.Fatalf("step %d %+v changed the state: %t, want %t", i, s.cmd, changed, s.changes)
				}
			}
			checkKindsSurvive(t, m)
			for key, want := range tc.holders {
				var got []uint64
				for _, l := range m.Holders(key) {
					got = append(got, l.Token)
					if h, ok := m.Holder(key, l.Token); !ok || h != l {
						t.Fatalf("Holder(%q, %d) = %+v, %t", key, l.Token, h, ok)
					}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("holders of %q: %v, want %v", key, got, want)
				}
			}
			for key, want := range tc.slots {
				var got []uint64
				for _, d := range m.Delays(key) {
					got = append(got, d.Seq)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("delayed slots of %q: %v, want %v", key, got, want)
				}
			}
		})
	}
}

// checkKindsSurvive asserts that m's state, multi-holder keys included,
// comes back whole from its snapshot (both restore paths) and from its
// storage records, and that the accessors agree with each other.
func checkKindsSurvive(t testing.TB, m *core.Machine) {
	t.Helper()
	checkSessionsSurvive(t, m)
	snap := m.Snapshot()
	st, err := core.DecodeSnapshotState(snap)
	if err != nil {
		t.Fatalf("DecodeSnapshotState(own snapshot): %v", err)
	}
	if !reflect.DeepEqual(st, m.SnapshotState()) {
		t.Fatalf("decoded %+v\nwant %+v", st, m.SnapshotState())
	}
	for _, records := range []bool{false, true} {
		got, err := encodeState(t, st, records)
		if err != nil || !bytes.Equal(got, snap) {
			t.Fatalf("streaming encoder (records %t): %v, bytes equal %t", records, err, bytes.Equal(got, snap))
		}
	}
	x := core.NewMachine()
	x.RestoreState(st)
	if x.Digest() != m.Digest() {
		t.Fatal("RestoreState's digest differs")
	}
	holders, slots := 0, 0
	for _, kh := range m.MultiKeys() {
		holders += len(kh.Holders)
		slots += len(kh.Delays)
		if !m.IsMulti(kh.Key) {
			t.Fatalf("IsMulti(%q) false", kh.Key)
		}
		if _, plain := m.Get(kh.Key); plain {
			t.Fatalf("multi-holder key %q also in Get", kh.Key)
		}
	}
	n := 0
	m.ForEachHolder(func(core.Lock) { n++ })
	if holders != m.HolderCount() || n != holders || slots != m.SlotDelayCount() || m.Len() != len(m.Locks())+holders {
		t.Fatalf("%d holders (%d counted, %d walked), %d slots (%d counted), Len %d", holders, m.HolderCount(), n, slots, m.SlotDelayCount(), m.Len())
	}
	d := 0
	m.ForEachDelay(func(core.Delay) { d++ })
	if d != m.DelayCount()+m.SlotDelayCount() {
		t.Fatalf("ForEachDelay walked %d, want %d + %d", d, m.DelayCount(), m.SlotDelayCount())
	}
}

// Below cluster version 5 a Grant of a semaphore or a shared Grant is a
// Noop: a mixed-version cluster changes nothing an older member could
// not represent.
func TestVersion5CommandsWaitForTheClusterVersion(t *testing.T) {
	m := v4Machine(t)
	before, snap := m.Digest(), m.Snapshot()
	for _, c := range []core.Command{sem("s", 2), shared("r"), sem("s", core.MaxSemaphoreLimit)} {
		if core.CommandVersion(c) != 5 {
			t.Fatalf("CommandVersion(%+v) = %d", c, core.CommandVersion(c))
		}
		if r := m.Apply(c); r != noop {
			t.Fatalf("Apply(%+v) at cluster version 4 = %v, want noop", c, r)
		}
	}
	if m.Digest() != before || !bytes.Equal(m.Snapshot(), snap) || snap[3] != core.SnapshotVersion5 {
		t.Fatal("version 5 commands changed a version 4 machine")
	}
	if core.CommandVersion(excl("k")) != 1 || core.CommandVersion(sem("k", 1)) != 1 {
		t.Fatal("a mutex Grant (limit 0 or 1) needs cluster version 5")
	}
	m = v5Machine(t)
	if m.Snapshot()[3] != core.SnapshotVersion6 {
		t.Fatalf("cluster version 5 writes snapshot version %d", m.Snapshot()[3])
	}
}

func TestKindValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  core.Command
		ok   bool
	}{
		{"mutex", excl("k"), true},
		{"limit 1 via WithKind is a mutex", sem("k", 1), true},
		{"limit 2", sem("k", 2), true},
		{"limit max", sem("k", core.MaxSemaphoreLimit), true},
		{"limit above max", sem("k", core.MaxSemaphoreLimit+1), false},
		{"limit 1 written", core.Command{Kind: core.KindGrant, Key: "k", LeaseMS: lease, Limit: 1}, false},
		{"shared", shared("k"), true},
		{"shared semaphore", core.Grant("k", "", lease, 0).WithKind(3, core.ModeShared), false},
		{"unknown mode", core.Grant("k", "", lease, 0).WithKind(0, 2), false},
		{"limit on release", core.Command{Kind: core.KindRelease, Key: "k", Token: 1, Limit: 2}, false},
		{"mode on renew", core.Command{Kind: core.KindRenew, Key: "k", Token: 1, Mode: core.ModeShared}, false},
		{"limit on a session command", core.Command{Kind: core.KindRefreshSession, SessionID: 1, Limit: 2}, false},
		{"mode on control", core.Command{Kind: core.KindControl, Control: core.SetClusterVersion(5).Control, Mode: core.ModeShared}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cmd.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate = %v, want ok %t", err, tc.ok)
			}
			if err != nil {
				wantCode(t, err, core.CodeInvalidArgument)
			}
		})
	}
}

func TestEntryVersion5Goldens(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  core.Command
		hex  string
	}{
		{"semaphore", core.Grant("k", "o", 1000, 5).WithKind(3, core.ModeExclusive), "050701016be807016f05000000000300"},
		{"shared", core.Grant("k", "", 1000, 5).WithKind(0, core.ModeShared), "050701016be8070005000000000001"},
		{"semaphore in a session", core.Grant("k", "", 0, 5).InSession(2).WithKind(1024, 0), "050701016b00000500000200800800"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := core.EncodeEntry(core.Entry{RequestID: 7, Command: tc.cmd})
			if got := hex.EncodeToString(b); got != tc.hex {
				t.Fatalf("EncodeEntry = %s, want %s", got, tc.hex)
			}
			e, err := core.DecodeEntry(b)
			if err != nil || e.Command != tc.cmd {
				t.Fatalf("DecodeEntry = %+v, %v", e, err)
			}
		})
	}
	for _, tc := range []struct{ name, hex string }{
		{"v5 grant without a kind", "050701016be807016f05000000000000"},
		{"limit 1", "050701016be807016f05000000000100"},
		{"limit above max", "050701016be807016f0500000000810800"},
		{"shared semaphore", "050701016be807016f05000000000301"},
		{"mode 2", "050701016be807016f05000000000002"},
		{"release in v5", "050702016b01"},
		{"session command in v5", "05070901"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := hex.DecodeString(tc.hex)
			if e, err := core.DecodeEntry(b); err == nil {
				t.Fatalf("DecodeEntry(%s) = %+v, want an error", tc.hex, e)
			}
		})
	}
}

// v5Full is a cluster version 5 machine with every kind of version 5
// state on top of v4Full's: a semaphore with holders in and out of
// sessions, with a request id and with a delayed slot; a read/write key
// with shared holders and a delayed shared slot; a key of delayed slots
// only.
func v5Full(t testing.TB) *core.Machine {
	t.Helper()
	m := v4Full(t)
	s1 := m.SessionState().Sessions[0].ID
	for _, c := range []core.Command{
		core.SetClusterVersion(5),
		sem("sem/a", 3).WithRequest("ACCOUNT_A/alice", "req-sem"),
		sem("sem/a", 3).InSession(s1),
		sem("sem/a", 3).WithLockDelay(delay),
		shared("rw/a").WithLockDelay(delay),
		shared("rw/a").InSession(s1),
		shared("rw/a"),
		sem("sem/b", 2).WithLockDelay(core.MaxLockDelayMS),
	} {
		if r := m.Apply(c); r.Kind != core.ResultGranted && r.Kind != core.ResultControlApplied {
			t.Fatalf("v5Full: %+v: %v", c, r)
		}
	}
	for _, key := range []string{"sem/a", "rw/a", "sem/b"} {
		kh, _ := m.KeyHolders(key)
		for _, l := range kh.Holders {
			if l.LockDelayMS > 0 {
				if r := m.Apply(core.Expire(key, l.Token)); r != expiredTrue {
					t.Fatalf("v5Full: expire %s/%d: %v", key, l.Token, r)
				}
			}
		}
	}
	if m.HolderCount() != 4 || m.SlotDelayCount() != 3 || len(m.MultiKeys()) != 3 {
		t.Fatalf("v5Full: %+v", m.MultiKeys())
	}
	return m
}

func TestSnapshotVersion6RoundTrip(t *testing.T) {
	m := v5Full(t)
	snap := m.Snapshot()
	if snap[3] != core.SnapshotVersion6 {
		t.Fatalf("snapshot v%d", snap[3])
	}
	checkKindsSurvive(t, m)
	if info, err := core.CheckSnapshot(snap); err != nil || info.Version != core.SnapshotVersion6 || info.Locks != uint64(len(m.Locks())) {
		t.Fatalf("CheckSnapshot = %+v, %v", info, err)
	}
	// What a restored machine answers, it answers as the original does.
	x := core.NewMachine()
	if err := x.Restore(snap); err != nil {
		t.Fatal(err)
	}
	kh, _ := m.KeyHolders("sem/a")
	for _, c := range []core.Command{sem("sem/a", 3), sem("sem/a", 3), core.ClearDelay("sem/a", kh.Delays[0].Seq), sem("sem/a", 3),
		excl("rw/a"), shared("rw/a"), core.ExpireSession(1, 1), core.Release("sem/a", kh.Holders[0].Token), sem("sem/b", 3),
		sem("sem/a", 3).WithRequest("ACCOUNT_A/alice", "req-sem")} {
		if a, b := m.Apply(c), x.Apply(c); a != b || m.Digest() != x.Digest() {
			t.Fatalf("%+v: original %v, restored %v", c, a, b)
		}
	}
	checkKindsSurvive(t, m)
}

func TestDecodeSnapshotVersion6Rejects(t *testing.T) {
	base := v5Full(t).SnapshotState()
	for _, tc := range []struct {
		name   string
		change func(s *core.SnapshotState)
	}{
		{"holder token above the last", func(s *core.SnapshotState) { s.Holders[0].Holders[0].Token = s.LastToken + 1 }},
		{"holder token of a plain lock", func(s *core.SnapshotState) { s.Holders[1].Holders[0].Token = s.Locks[0].Token }},
		{"holder token twice", func(s *core.SnapshotState) { s.Holders[1].Holders[0].Token = s.Holders[0].Holders[0].Token }},
		{"holder token of an ended request", func(s *core.SnapshotState) { s.Holders[1].Holders[0].Token = s.Requests.Ended[0].Token }},
		{"a key both plain and multi", func(s *core.SnapshotState) { s.Holders[0].Key = s.Locks[0].Key; fixKeys(&s.Holders[0]) }},
		{"a key both delayed and multi", func(s *core.SnapshotState) { s.Holders[0].Key = s.Sessions.Delays[0].Key; fixKeys(&s.Holders[0]) }},
		{"keys out of order", func(s *core.SnapshotState) { s.Holders[0], s.Holders[1] = s.Holders[1], s.Holders[0] }},
		{"an empty key", func(s *core.SnapshotState) { s.Holders[2].Delays = nil }},
		{"more than the limit", func(s *core.SnapshotState) { s.Holders[1].Limit = 2; fixKeys(&s.Holders[1]) }},
		{"a mutex as a multi-holder key", func(s *core.SnapshotState) { s.Holders[1].Limit = 0; fixKeys(&s.Holders[1]) }},
		{"a shared semaphore", func(s *core.SnapshotState) { s.Holders[1].Mode = core.ModeShared; fixKeys(&s.Holders[1]) }},
		{"holders out of token order", func(s *core.SnapshotState) {
			h := s.Holders[1].Holders
			h[0], h[1] = h[1], h[0]
		}},
		{"a holder of a session not open", func(s *core.SnapshotState) { s.Holders[0].Holders[0].SessionID = 3 }},
		{"a session holder with a lease", func(s *core.SnapshotState) { s.Holders[0].Holders[0].LeaseMS = lease }},
		{"a request held twice", func(s *core.SnapshotState) {
			l := &s.Holders[1].Holders[1]
			l.Identity, l.RequestID = s.Holders[1].Holders[0].Identity, s.Holders[1].Holders[0].RequestID
		}},
		{"a request of a plain lock", func(s *core.SnapshotState) {
			for _, p := range s.Locks {
				if p.RequestID != "" {
					s.Holders[0].Holders[0].Identity, s.Holders[0].Holders[0].RequestID = p.Identity, p.RequestID
					return
				}
			}
			t.Fatal("no plain lock with a request id")
		}},
		{"a slot seq above the last", func(s *core.SnapshotState) { s.Holders[1].Delays[0].Seq = s.Sessions.LastDelaySeq + 1 }},
		{"a slot seq of a delayed key", func(s *core.SnapshotState) { s.Holders[1].Delays[0].Seq = s.Sessions.Delays[0].Seq }},
		{"a slot seq twice", func(s *core.SnapshotState) { s.Holders[1].Delays[0].Seq = s.Holders[2].Delays[0].Seq }},
		{"a slot without a delay", func(s *core.SnapshotState) { s.Holders[1].Delays[0].DelayMS = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			s.Holders = nil
			for _, kh := range base.Holders {
				kh.Holders, kh.Delays = slices.Clone(kh.Holders), slices.Clone(kh.Delays)
				s.Holders = append(s.Holders, kh)
			}
			tc.change(&s)
			b := core.EncodeSnapshotState(s)
			got, err := core.DecodeSnapshotState(b)
			if err == nil {
				t.Fatal("decoded")
			}
			checkDecodeError(t, err)
			if !reflect.DeepEqual(got, core.SnapshotState{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
			x := core.NewMachine()
			if rerr := x.Restore(b); rerr == nil || rerr.Error() != err.Error() {
				t.Fatalf("Restore: %v, DecodeSnapshotState: %v", rerr, err)
			}
		})
	}
}

// fixKeys gives kh's holders and slots kh's key and kind again.
func fixKeys(kh *core.KeyHolders) {
	for i := range kh.Holders {
		kh.Holders[i].Key, kh.Holders[i].Limit, kh.Holders[i].Mode = kh.Key, kh.Limit, kh.Mode
	}
	for i := range kh.Delays {
		kh.Delays[i].Key = kh.Key
	}
}

// A stored holder record is checked on its own, and LoadHolders checks
// the rows against the rest of the state loaded before them.
func TestLoadHoldersRejects(t *testing.T) {
	m := v5Full(t)
	ks := m.MultiKeys()
	load := func(ks []core.KeyHolders) error {
		x := core.NewMachine()
		x.Load(m.LastToken(), m.Locks())
		if err := x.LoadControl(m.ControlSnapshot()); err != nil {
			t.Fatal(err)
		}
		if err := x.LoadRequests(m.RequestState()); err != nil {
			t.Fatal(err)
		}
		if err := x.LoadSessions(m.SessionState()); err != nil {
			t.Fatal(err)
		}
		before := x.Digest()
		err := x.LoadHolders(ks)
		if err != nil && x.Digest() != before {
			t.Fatal("a refused LoadHolders changed the machine")
		}
		if err == nil && x.Digest() != m.Digest() {
			t.Fatal("LoadHolders of the machine's own keys gives another digest")
		}
		return err
	}
	if err := load(slices.Clone(ks)); err != nil {
		t.Fatal(err)
	}
	dup := slices.Clone(ks)
	dup[0].Holders = slices.Clone(dup[0].Holders)
	dup[0].Holders[0].Token = m.Locks()[0].Token
	twice := append(slices.Clone(ks), ks[0])
	for name, bad := range map[string][]core.KeyHolders{"a plain lock's token": dup, "a key twice": twice} {
		if err := load(bad); err == nil {
			t.Fatalf("%s loaded", name)
		}
	}
	v4 := v4Full(t)
	x := core.NewMachine()
	x.Load(v4.LastToken(), v4.Locks())
	if err := x.LoadControl(v4.ControlSnapshot()); err != nil {
		t.Fatal(err)
	}
	if err := x.LoadHolders([]core.KeyHolders{{Key: "a", Limit: 2, Holders: []core.Lock{{Key: "a", Token: 1, LeaseMS: lease, Limit: 2}}}}); err == nil {
		t.Fatal("holders loaded at cluster version 4")
	}
	for _, rec := range [][]byte{
		nil, {2}, append(core.EncodeHolderRecord(ks[0]), 0),
		core.EncodeHolderRecord(core.KeyHolders{Key: "a", Limit: 2}),
	} {
		if _, err := core.DecodeHolderRecord(rec); err == nil {
			t.Fatalf("holder record %x decoded", rec)
		}
	}
}

func TestDigestCoversKinds(t *testing.T) {
	base := func() *core.Machine {
		m := v5Machine(t)
		applyAll(m, sem("s", 3).WithLockDelay(delay), sem("s", 3), shared("r"), core.Expire("s", 1))
		return m
	}
	seen := map[[32]byte]string{base().Digest(): "base"}
	for name, c := range map[string]core.Command{
		"another slot":           sem("s", 3),
		"a slot released":        core.Release("s", 2),
		"a slot renewed":         core.Renew("s", 2, 2*lease),
		"a slot cleared":         core.ClearDelay("s", 1),
		"another shared holder":  shared("r"),
		"a shared holder freed":  core.Release("r", 3),
		"a new semaphore":        sem("t", 2),
		"a new semaphore of 3":   sem("t", 3),
		"a new shared key":       shared("t"),
		"a new mutex":            excl("t"),
		"another owner":          core.Grant("t", "other", lease, 7).WithKind(2, core.ModeExclusive),
		"a slot with a delay":    sem("s", 3).WithLockDelay(delay),
		"a shared with a delay":  shared("r").WithLockDelay(delay),
		"a shared with a delay2": shared("r").WithLockDelay(delay + 1),
	} {
		m := base()
		applyAll(m, c)
		d := m.Digest()
		if other, dup := seen[d]; dup {
			t.Fatalf("%s and %s have the same digest", name, other)
		}
		seen[d] = name
	}
}

func TestReseedKinds(t *testing.T) {
	m := v5Full(t)
	s := m.SnapshotState()
	for _, drop := range []bool{false, true} {
		out, _, err := core.Reseed(s, core.ReseedOptions{BumpTokens: 10, DropLocks: drop, Static: true})
		if err != nil {
			t.Fatal(err)
		}
		if kept := reflect.DeepEqual(out.Holders, s.Holders); kept == drop || drop && len(out.Holders) != 0 {
			t.Fatalf("drop %t: holders %+v", drop, out.Holders)
		}
		x := core.NewMachine()
		if err := x.Restore(core.EncodeSnapshotState(out)); err != nil {
			t.Fatalf("drop %t: the reseeded state does not restore: %v", drop, err)
		}
		rec := x.LookupRequest("ACCOUNT_A/alice", "req-sem")
		if want := core.RequestHeld; drop {
			want = core.RequestEnded
			if rec.Status != want {
				t.Fatalf("drop %t: the semaphore holder's request is %s", drop, rec.Status)
			}
		} else if rec.Status != want {
			t.Fatalf("drop %t: the semaphore holder's request is %s", drop, rec.Status)
		}
		if got := x.Apply(sem("sem/new", 2)); got != granted(s.LastToken+11) {
			t.Fatalf("drop %t: first grant after the reseed: %v", drop, got)
		}
	}
}

// The committed snapshots of v4Full (version 5) and v5Full (version 6)
// still decode to those states, and the machines still encode them byte
// for byte: a format change cannot slip in unnoticed, and this binary
// reads what the last one wrote.
func TestCommittedFullSnapshots(t *testing.T) {
	for _, tc := range []struct {
		file    string
		m       *core.Machine
		version byte
	}{
		{"v5_full", v4Full(t), core.SnapshotVersion5},
		{"v6_full", v5Full(t), core.SnapshotVersion6},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b := readCorpusBytes(t, "testdata/fuzz/FuzzDecodeSnapshot/"+tc.file)
			st, err := core.DecodeSnapshotState(b)
			if err != nil || b[3] != tc.version {
				t.Fatalf("version %d: %v", b[3], err)
			}
			if !reflect.DeepEqual(st, tc.m.SnapshotState()) || !bytes.Equal(tc.m.Snapshot(), b) {
				t.Fatalf("the committed snapshot is not the machine's:\n%+v\n%+v", st, tc.m.SnapshotState())
			}
			x := core.NewMachine()
			if err := x.Restore(b); err != nil || x.Digest() != tc.m.Digest() {
				t.Fatalf("Restore: %v, digest equal %t", err, x.Digest() == tc.m.Digest())
			}
		})
	}
}

// readCorpusBytes reads the one []byte of a "go test fuzz v1" file.
func readCorpusBytes(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
	lit, ok := strings.CutPrefix(lines[len(lines)-1], "[]byte(")
	if !ok || len(lines) != 2 {
		t.Fatalf("%s is not a one-value fuzz corpus file", path)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(s)
}

func TestSnapshotEncoderKindsRefuses(t *testing.T) {
	kh := func(key string, tok uint64) core.KeyHolders {
		return core.KeyHolders{Key: key, Limit: 2, Holders: []core.Lock{{Key: key, Token: tok, LeaseMS: lease, Limit: 2}}}
	}
	v5, v4 := core.ControlState{ClusterVersion: 5}, core.ControlState{ClusterVersion: 4}
	for _, tc := range []struct {
		name string
		ctl  core.ControlState
		keys []core.KeyHolders
	}{
		{"before cluster version 5", v4, []core.KeyHolders{kh("a", 1)}},
		{"keys out of order", v5, []core.KeyHolders{kh("b", 1), kh("a", 2)}},
		{"a key twice", v5, []core.KeyHolders{kh("a", 1), kh("a", 2)}},
		{"a token above the last", v5, []core.KeyHolders{kh("a", 9)}},
		{"an empty key", v5, []core.KeyHolders{{Key: "a", Limit: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := core.NewSnapshotEncoder(2, 0, tc.ctl, 0)
			var err error
			for _, k := range tc.keys {
				if err = e.AddKeyHolders(k); err != nil {
					break
				}
			}
			if _, ferr := e.Finish(); err == nil || ferr == nil {
				t.Fatalf("AddKeyHolders %v, Finish %v", err, ferr)
			}
		})
	}
	if err := core.NewSnapshotEncoder(2, 0, v5, 0).AddHolderRecord([]byte{1}); err == nil {
		t.Fatal("a truncated holder record was added")
	}
}

// A request id is scoped to its identity on a multi-holder key as on a
// mutex: two identities with the same id hold two slots, and a retry of
// each names its own; LookupRequest finds each holder.
func TestKindsRequestsPerIdentity(t *testing.T) {
	m := v5Machine(t)
	applyAll(m, sem("s", 3).WithRequest("alice", "r"), sem("s", 3).WithRequest("bob", "r"))
	for identity, tok := range map[string]uint64{"alice": 1, "bob": 2} {
		if got := m.Apply(sem("s", 3).WithRequest(identity, "r")); got != (core.Result{Kind: core.ResultGrantRepeated, Token: tok}) {
			t.Fatalf("%s's retry = %v, want its token %d", identity, got, tok)
		}
		if rec := m.LookupRequest(identity, "r"); rec.Status != core.RequestHeld || rec.Token != tok || rec.Key != "s" {
			t.Fatalf("LookupRequest(%s) = %+v", identity, rec)
		}
	}
	applyAll(m, core.Release("s", 1))
	if rec := m.LookupRequest("alice", "r"); rec.Status != core.RequestEnded || rec.Token != 1 {
		t.Fatalf("after release: %+v", rec)
	}
	if rec := m.LookupRequest("bob", "r"); rec.Status != core.RequestHeld || rec.Token != 2 {
		t.Fatalf("bob after alice's release: %+v", rec)
	}
	if m.RequestRecords() != 2 {
		t.Fatalf("%d request records, want 2 (one held, one ended)", m.RequestRecords())
	}
}
