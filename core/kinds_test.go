package core_test

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"slices"
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
				kh, _ := m.KeyHolders(key)
				var got []uint64
				for _, d := range kh.Delays {
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
