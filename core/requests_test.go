package core_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v3Machine is a machine whose cluster agreed on version 3.
func v3Machine(t testing.TB) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	if r := m.Apply(core.SetClusterVersion(3)); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetClusterVersion(3) = %v", r)
	}
	return m
}

// rgrant is a Grant of key by identity with request id rid at time atMS.
func rgrant(key, identity, rid string, atMS uint64) core.Command {
	return core.Grant(key, "o", lease, atMS).WithRequest(identity, rid)
}

func result(k core.ResultKind, token uint64) core.Result { return core.Result{Kind: k, Token: token} }

var (
	repeated  = func(tok uint64) core.Result { return result(core.ResultGrantRepeated, tok) }
	ended     = func(tok uint64) core.Result { return result(core.ResultGrantEnded, tok) }
	mismatch  = func(tok uint64) core.Result { return result(core.ResultRequestMismatch, tok) }
	exhausted = result(core.ResultRequestsExhausted, 0)
	retainMS  = core.RequestRetentionMS
	minRetain = core.MinRequestRetentionMS
)

// reqStep is one command of a request scenario, its result, and whether
// it may change the state other than the data clock (false: the digest of
// the state is the same before and after, once the clock is put aside).
type reqStep struct {
	cmd     core.Command
	want    core.Result
	changes bool
}

type lookup struct {
	identity, rid string
	want          core.RequestRecord
}

func heldRec(key string, tok uint64) core.RequestRecord {
	return core.RequestRecord{Status: core.RequestHeld, Key: key, KeyHash: core.RequestKeyHash(key), Token: tok}
}

func endedRec(key string, tok uint64) core.RequestRecord {
	return core.RequestRecord{Status: core.RequestEnded, KeyHash: core.RequestKeyHash(key), Token: tok}
}

// TestGrantWithRequestID is the table of every branch of a Grant with a
// request id (requests.go): each scenario runs on a fresh cluster version
// 3 machine, then the lookups must find what they say.
func TestGrantWithRequestID(t *testing.T) {
	const t0 = 1_000_000
	tests := []struct {
		name    string
		limit   int
		steps   []reqStep
		lookups []lookup
		records int
	}{
		{
			name:    "first grant records the request on the lock",
			steps:   []reqStep{{rgrant("k", "alice", "r1", t0), granted(1), true}},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}, {"bob", "r1", core.RequestRecord{}}, {"alice", "r2", core.RequestRecord{}}},
			records: 1,
		},
		{
			name: "repeat while held: the same token, never a second grant",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{rgrant("k", "alice", "r1", t0), repeated(1), false},
				{rgrant("k", "alice", "r1", t0+5), repeated(1), false},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}},
			records: 1,
		},
		{
			name: "repeat for another key while held",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{rgrant("other", "alice", "r1", t0), mismatch(1), false},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}},
			records: 1,
		},
		{
			name: "a request id is scoped to its identity",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{rgrant("k", "bob", "r1", t0), grantRejected(1), false},
				{rgrant("j", "bob", "r1", t0), granted(2), true},
				{rgrant("i", "", "r1", t0), granted(3), true},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}, {"bob", "r1", heldRec("j", 2)}, {"", "r1", heldRec("i", 3)}},
			records: 3,
		},
		{
			name: "released: the repeat learns the grant ended",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				{rgrant("k", "alice", "r1", t0+retainMS), ended(1), false},
				{rgrant("j", "alice", "r1", t0+retainMS), mismatch(1), false},
				// The key is free; a new request takes it.
				{rgrant("k", "alice", "r2", t0+retainMS), granted(2), true},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}, {"alice", "r2", heldRec("k", 2)}},
			records: 2,
		},
		{
			name: "expired: the repeat learns the grant ended",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Expire("k", 1), expiredTrue, true},
				{rgrant("k", "alice", "r1", t0+1), ended(1), false},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}},
			records: 1,
		},
		{
			name: "forgotten once older than the retention by the data clock",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				// Any grant moves the clock; one without a request id too.
				{core.Grant("x", "", lease, t0+retainMS+1), granted(2), true},
				{rgrant("k", "alice", "r1", t0+retainMS+1), granted(3), true},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 3)}},
			records: 1,
		},
		{
			name: "a clock that goes back does not bring a record back nor forget one sooner",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				{core.Grant("x", "", lease, 5), granted(2), true},
				{rgrant("k", "alice", "r1", 5), ended(1), false},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}},
			records: 1,
		},
		{
			name:  "a full table refuses a new request",
			limit: 2,
			steps: []reqStep{
				{rgrant("a", "alice", "r1", t0), granted(1), true},
				{rgrant("b", "alice", "r2", t0), granted(2), true},
				{rgrant("c", "alice", "r3", t0), exhausted, false},
				// Repeats and grants without a request id still work.
				{rgrant("a", "alice", "r1", t0), repeated(1), false},
				{core.Grant("c", "", lease, t0), granted(3), true},
			},
			lookups: []lookup{{"alice", "r3", core.RequestRecord{}}},
			records: 2,
		},
		{
			name:  "a full table forgets an ended record older than the minimum retention",
			limit: 2,
			steps: []reqStep{
				{rgrant("a", "alice", "r1", t0), granted(1), true},
				{rgrant("b", "alice", "r2", t0), granted(2), true},
				{core.Release("a", 1), released, true},
				{rgrant("c", "alice", "r3", t0+minRetain-1), exhausted, false},
				{rgrant("c", "alice", "r3", t0+minRetain), granted(3), true},
			},
			lookups: []lookup{{"alice", "r1", core.RequestRecord{}}, {"alice", "r3", heldRec("c", 3)}},
			records: 2,
		},
		{
			name:  "a full table of held locks refuses until one ends and ages",
			limit: 1,
			steps: []reqStep{
				{rgrant("a", "alice", "r1", t0), granted(1), true},
				{rgrant("b", "bob", "r1", t0), exhausted, false},
				{core.Expire("a", 1), expiredTrue, true},
				{rgrant("b", "bob", "r1", t0), exhausted, false},
				{rgrant("b", "bob", "r1", t0+retainMS+1), granted(2), true},
			},
			lookups: []lookup{{"alice", "r1", core.RequestRecord{}}, {"bob", "r1", heldRec("b", 2)}},
			records: 1,
		},
		{
			name: "the key held by another: rejected, no record",
			steps: []reqStep{
				{core.Grant("k", "", lease, t0), granted(1), true},
				{rgrant("k", "alice", "r1", t0), grantRejected(1), false},
			},
			lookups: []lookup{{"alice", "r1", core.RequestRecord{}}},
			records: 0,
		},
		{
			name: "renew keeps the request",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Renew("k", 1, 2*lease), core.Result{Kind: core.ResultRenewed, Token: 1}, true},
				{rgrant("k", "alice", "r1", t0), repeated(1), false},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}},
			records: 1,
		},
		{
			name: "a request reused after its record went stale: the newest record counts",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				{rgrant("k", "alice", "r1", t0+retainMS+1), granted(2), true},
				{core.Release("k", 2), released, true},
				{rgrant("j", "alice", "r1", t0+retainMS+1), mismatch(2), false},
				{rgrant("k", "alice", "r1", t0+retainMS+2), ended(2), false},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 2)}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := v3Machine(t)
			if tc.limit > 0 {
				m.SetRequestLimitForTest(tc.limit)
			}
			applyReqSteps(t, m, tc.steps)
			checkLookups(t, m, tc.lookups)
			if tc.records != 0 || tc.name == "the key held by another: rejected, no record" {
				if got := m.RequestRecords(); got != tc.records {
					t.Fatalf("RequestRecords() = %d, want %d", got, tc.records)
				}
			}
		})
	}
}

// applyReqSteps applies steps to m in order and checks each: its result,
// whether it changed the state (the data clock aside), that RequestRoom
// foretold the room a new record found (or not), and that the state
// survives a snapshot and the storage records.
func applyReqSteps(t *testing.T, m *core.Machine, steps []reqStep) {
	t.Helper()
	for i, s := range steps {
		room := m.RequestRoom(s.cmd.GrantedAtMS)
		before := withoutClock(t, m)
		if got := m.Apply(s.cmd); got != s.want {
			t.Fatalf("step %d: Apply(%+v) = %v, want %v", i, s.cmd, got, s.want)
		}
		if changed := !bytes.Equal(withoutClock(t, m), before); changed != s.changes {
			t.Fatalf("step %d: %v changed the state: %t, want %t", i, s.want, changed, s.changes)
		}
		if s.cmd.RequestID != "" && (s.want.Kind == core.ResultGranted || s.want == exhausted) && room != (s.want != exhausted) {
			t.Fatalf("step %d: RequestRoom said %t before %v", i, room, s.want)
		}
		checkRequestsSurvive(t, m)
	}
}

// checkLookups checks what LookupRequest finds for each lookup.
func checkLookups(t *testing.T, m *core.Machine, lookups []lookup) {
	t.Helper()
	for _, l := range lookups {
		if got := m.LookupRequest(l.identity, l.rid); got != l.want {
			t.Fatalf("LookupRequest(%q, %q) = %+v, want %+v", l.identity, l.rid, got, l.want)
		}
	}
}

// withoutClock is the snapshot of m with the data clock put to zero: what
// a step that only moves the clock must leave unchanged.
func withoutClock(t testing.TB, m *core.Machine) []byte {
	t.Helper()
	s := m.SnapshotState()
	s.Requests.DataClockMS = 0
	for i := range s.Requests.Ended {
		s.Requests.Ended[i].EndedAtMS = 0
	}
	return core.EncodeSnapshotState(s)
}

// checkRequestsSurvive checks that the state, request records included,
// comes back the same through a snapshot and through the storage records.
func checkRequestsSurvive(t testing.TB, m *core.Machine) {
	t.Helper()
	viaSnap := core.NewMachine()
	if err := viaSnap.Restore(m.Snapshot()); err != nil {
		t.Fatalf("Restore(own snapshot): %v", err)
	}
	viaRecs := rebuildFromRecords(t, nil, m)
	for name, x := range map[string]*core.Machine{"snapshot": viaSnap, "records": viaRecs} {
		if x.Digest() != m.Digest() || !bytes.Equal(x.Snapshot(), m.Snapshot()) {
			t.Fatalf("the request state does not survive the %s", name)
		}
		xh, xn := x.EndedSeqs()
		mh, mn := m.EndedSeqs()
		if xh != mh || xn != mn || x.RequestRecords() != m.RequestRecords() || x.DataClockMS() != m.DataClockMS() {
			t.Fatalf("through the %s: seqs %d..%d, %d records; want %d..%d, %d", name, xh, xn, x.RequestRecords(), mh, mn, m.RequestRecords())
		}
	}
}

// Below cluster version 3 a Grant with a request id and SetFenceKey are
// Noop, and Grants do not move the data clock: a mixed-version cluster
// refuses nothing it cannot apply, and changes nothing an older member
// could not represent.
func TestVersion3CommandsWaitForTheClusterVersion(t *testing.T) {
	m := v2Machine(t)
	before := m.Digest()
	snap := m.Snapshot()
	for _, c := range []core.Command{rgrant("new", "acct", "r1", 99), rgrant("new", "", "r1", 99), core.SetFenceKey(seed(1))} {
		if r := m.Apply(c); r != noop {
			t.Fatalf("Apply(%+v) at cluster version 2 = %v, want noop", c, r)
		}
	}
	if m.Digest() != before || !bytes.Equal(m.Snapshot(), snap) {
		t.Fatal("version 3 commands changed a version 2 machine")
	}
	if r := m.Apply(core.Grant("plain", "", lease, 1_000_000)); r.Kind != core.ResultGranted {
		t.Fatalf("plain grant = %v", r)
	}
	if m.DataClockMS() != 0 || m.Snapshot()[3] != core.SnapshotVersion3 {
		t.Fatalf("data clock %d below cluster version 3", m.DataClockMS())
	}
	if _, ok := m.CurrentFenceKey(); ok {
		t.Fatal("a fence key below cluster version 3")
	}
	if r := m.Apply(core.SetClusterVersion(3)); r.Kind != core.ResultControlApplied || m.ClusterVersion() != 3 {
		t.Fatalf("SetClusterVersion(3) = %v", r)
	}
	if r := m.Apply(rgrant("new", "acct", "r1", 99)); r.Kind != core.ResultGranted {
		t.Fatalf("request grant at version 3 = %v", r)
	}
	if l, _ := m.Get("new"); l.RequestID != "r1" || l.Identity != "acct" {
		t.Fatalf("request id not kept: %+v", l)
	}
}

// Raising the cluster version to 3 changes no result of the commands of
// earlier versions: the same sequence gives the same results on a version
// 2 and a version 3 machine.
func TestVersion3IsHarmlessWithoutRequestIDs(t *testing.T) {
	v2, v3 := v2Machine(t), v2Machine(t)
	if r := v3.Apply(core.SetClusterVersion(3)); r.Kind != core.ResultControlApplied {
		t.Fatal(r)
	}
	for i := 0; i < 300; i++ {
		key := fmt.Sprintf("k%d", i%7)
		var c core.Command
		switch i % 4 {
		case 0, 1:
			c = core.Grant(key, "o", lease, uint64(i)*retainMS)
			c.Identity = []string{"", "acct"}[i%2]
		case 2:
			c = core.Release(key, uint64(i/3))
		default:
			l, _ := v2.Get(key)
			c = core.Expire(key, l.Token)
		}
		if a, b := v2.Apply(c), v3.Apply(c); a != b {
			t.Fatalf("step %d: %+v gives %v at version 2, %v at version 3", i, c, a, b)
		}
	}
	if v3.RequestRecords() != 0 {
		t.Fatalf("%d request records without request ids", v3.RequestRecords())
	}
}

// Ended records older than the retention are pruned a few per applied
// command, oldest first; lookups ignore stale ones at once.
func TestRequestPruningIsBounded(t *testing.T) {
	m := v3Machine(t)
	const n = 3*core.RequestPruneBudget + 1
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k%d", i)
		applyAll(m, rgrant(key, "a", key, 1000))
		applyAll(m, core.Release(key, uint64(i+1)))
	}
	if head, next := m.EndedSeqs(); head != 0 || next != n {
		t.Fatalf("EndedSeqs = %d, %d", head, next)
	}
	// One grant moves the clock past every record: it prunes a budget's
	// worth, and no stale record is found any more.
	applyAll(m, core.Grant("x", "", lease, 1000+retainMS+1))
	head, _ := m.EndedSeqs()
	if head != core.RequestPruneBudget {
		t.Fatalf("one command pruned %d records, the budget is %d", head, core.RequestPruneBudget)
	}
	if got := m.LookupRequest("a", "k9"); got.Status != core.RequestUnknown {
		t.Fatalf("a stale record is still found: %+v", got)
	}
	// Any lock command prunes: a few renews drain the rest.
	for range 3 {
		applyAll(m, core.Renew("x", m.LastToken(), 0))
	}
	if head, next := m.EndedSeqs(); head != n || next != n || m.RequestRecords() != 0 {
		t.Fatalf("after pruning: seqs %d..%d, %d records", head, next, m.RequestRecords())
	}
	checkRequestsSurvive(t, m)
}

// The digest sees every part of the request state.
func TestDigestCoversRequestsAndFenceKeys(t *testing.T) {
	base := func() *core.Machine {
		m := v3Machine(t)
		applyAll(m, rgrant("k", "a", "r1", 10), core.Release("k", 1), rgrant("j", "a", "r2", 10))
		return m
	}
	seen := map[[32]byte]string{}
	for name, change := range map[string]func(m *core.Machine){
		"nothing":                func(*core.Machine) {},
		"data clock":             func(m *core.Machine) { applyAll(m, rgrant("j", "a", "r2", 11)) },
		"held request id":        func(m *core.Machine) { applyAll(m, rgrant("i", "a", "r3", 10)) },
		"ended record":           func(m *core.Machine) { applyAll(m, core.Release("j", 2)) },
		"held id, other request": func(m *core.Machine) { applyAll(m, core.Release("j", 2), rgrant("j", "b", "r2", 10)) },
		"fence key":              func(m *core.Machine) { applyAll(m, core.SetFenceKey(seed(1))) },
		"other fence key":        func(m *core.Machine) { applyAll(m, core.SetFenceKey(seed(2))) },
	} {
		m := base()
		change(m)
		d := m.Digest()
		if other, dup := seen[d]; dup {
			t.Fatalf("%q and %q give the same digest", name, other)
		}
		seen[d] = name
		fresh := core.NewMachine()
		if err := fresh.Restore(m.Snapshot()); err != nil || fresh.Digest() != d {
			t.Fatalf("%s: the rebuilt digest differs (%v)", name, err)
		}
	}
}
