package core_test

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v6Machine is a machine whose cluster agreed on version 6 (Settle).
func v6Machine(t testing.TB) *core.Machine {
	t.Helper()
	m := v5Machine(t)
	if r := m.Apply(core.SetClusterVersion(6)); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetClusterVersion(6) = %v", r)
	}
	return m
}

func settle(key, identity, rid string, atMS uint64) core.Command {
	return core.Settle(key, identity, rid, atMS)
}

var settled = result(core.ResultSettled, 0)

// TestSettle is the table of every branch of a Settle (requests.go): each
// scenario runs on a fresh cluster version 6 machine, checks whether each
// step changed the state (data clock aside) and that the state survives a
// snapshot and the storage records, then the lookups.
func TestSettle(t *testing.T) {
	const t0 = 1_000_000
	tests := []struct {
		name    string
		limit   int
		steps   []reqStep
		lookups []lookup
		records int
	}{
		{
			name: "held, same key: released, its end recorded, the token answered",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{settle("k", "alice", "r1", t0+1), result(core.ResultReleased, 1), true},
				{rgrant("k", "alice", "r1", t0+2), ended(1), false},
				{core.Grant("k", "o", lease, t0+3), granted(2), true},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}},
			records: 1,
		},
		{
			name: "held semaphore slot: that holder released, the other stays",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0).WithKind(2, core.ModeExclusive), granted(1), true},
				{rgrant("k", "alice", "r2", t0).WithKind(2, core.ModeExclusive), granted(2), true},
				{settle("k", "alice", "r1", t0+1), result(core.ResultReleased, 1), true},
				{rgrant("k", "alice", "r1", t0+2).WithKind(2, core.ModeExclusive), ended(1), false},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}, {"alice", "r2", heldRec("k", 2)}},
			records: 2,
		},
		{
			name: "held under another key: mismatch, nothing changes",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{settle("j", "alice", "r1", t0+1), mismatch(1), false},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}},
			records: 1,
		},
		{
			name: "ended: its token, nothing changes",
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				{settle("k", "alice", "r1", t0+1), ended(1), false},
				{settle("j", "alice", "r1", t0+1), mismatch(1), false},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 1)}},
			records: 1,
		},
		{
			name: "unknown: a tombstone; a late attempt is refused, ended with token 0",
			steps: []reqStep{
				{settle("k", "alice", "r1", t0), settled, true},
				{rgrant("k", "alice", "r1", t0+1), ended(0), false},
				{rgrant("j", "alice", "r1", t0+1), mismatch(0), false},
				{settle("k", "alice", "r1", t0+2), ended(0), false},
				{rgrant("k", "bob", "r1", t0+3), granted(1), true},
			},
			lookups: []lookup{{"alice", "r1", endedRec("k", 0)}, {"bob", "r1", heldRec("k", 1)}},
			records: 2,
		},
		{
			name:  "full table: exhausted, nothing changes",
			limit: 1,
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{settle("j", "alice", "r2", t0+1), exhausted, false},
				{rgrant("j", "alice", "r2", t0+2), exhausted, false},
			},
			lookups: []lookup{{"alice", "r2", core.RequestRecord{}}},
			records: 1,
		},
		{
			name:  "full table of an old ended record: it makes room",
			limit: 1,
			steps: []reqStep{
				{rgrant("k", "alice", "r1", t0), granted(1), true},
				{core.Release("k", 1), released, true},
				{settle("j", "alice", "r2", t0+minRetain), settled, true},
			},
			lookups: []lookup{{"alice", "r1", core.RequestRecord{}}, {"alice", "r2", endedRec("j", 0)}},
			records: 1,
		},
		{
			name: "stale tombstone: pruned after the retention, a late attempt is granted",
			steps: []reqStep{
				{settle("k", "alice", "r1", t0), settled, true},
				{rgrant("k", "alice", "r1", t0+retainMS+1), granted(1), true},
			},
			lookups: []lookup{{"alice", "r1", heldRec("k", 1)}},
			records: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := v6Machine(t)
			if tc.limit > 0 {
				m.SetRequestLimitForTest(tc.limit)
			}
			applyReqSteps(t, m, tc.steps)
			checkLookups(t, m, tc.lookups)
			if got := m.RequestRecords(); got != tc.records {
				t.Fatalf("RequestRecords() = %d, want %d", got, tc.records)
			}
		})
	}
}

// TestSettleAdvancesTheDataClock: a Settle carries the leader's clock, as
// a Grant does, so its tombstone is dated when it was made.
func TestSettleAdvancesTheDataClock(t *testing.T) {
	m := v6Machine(t)
	m.Apply(settle("k", "a", "r", 5_000))
	if m.DataClockMS() != 5_000 {
		t.Fatalf("data clock %d, want 5000", m.DataClockMS())
	}
	if rs := m.RequestState(); len(rs.Ended) != 1 || rs.Ended[0].EndedAtMS != 5_000 || rs.Ended[0].Token != 0 {
		t.Fatalf("tombstone %+v", rs.Ended)
	}
}

// Below cluster version 6 a Settle is Noop: it changes nothing on a
// machine (nor moves the data clock) whatever the request's record.
func TestSettleWaitsForClusterVersion6(t *testing.T) {
	m := v5Machine(t)
	if r := m.Apply(rgrant("k", "a", "held", 1_000)); r.Kind != core.ResultGranted {
		t.Fatalf("grant = %v", r)
	}
	snap := m.Snapshot()
	for _, c := range []core.Command{settle("k", "a", "held", 2_000), settle("k", "a", "unknown", 2_000)} {
		if core.CommandVersion(c) != 6 {
			t.Fatalf("CommandVersion(settle) = %d", core.CommandVersion(c))
		}
		if r := m.Apply(c); r != noop {
			t.Fatalf("Apply(%+v) at cluster version 5 = %v, want noop", c, r)
		}
	}
	if !bytes.Equal(m.Snapshot(), snap) {
		t.Fatal("a settle changed a cluster version 5 machine")
	}
	// A tombstone is not a version 5 state: a snapshot that carries one
	// below version 6 does not decode.
	s := v6Machine(t)
	s.Apply(settle("k", "a", "r", 1_000))
	st := s.SnapshotState()
	st.Control.ClusterVersion = 5
	if _, err := core.DecodeSnapshotState(core.EncodeSnapshotState(st)); err == nil {
		t.Fatal("a tombstone decoded in a cluster version 5 snapshot")
	}
}

// TestSettleEntry: the golden entry encoding of a Settle, and the shapes
// the decoder refuses.
func TestSettleEntry(t *testing.T) {
	c := settle("k", "a", "r", 5)
	b := core.EncodeEntry(core.Entry{RequestID: 7, Command: c})
	const golden = "06070b016b01610172" + "05"
	if got := hex.EncodeToString(b); got != golden {
		t.Fatalf("EncodeEntry = %s, want %s", got, golden)
	}
	if e, err := core.DecodeEntry(b); err != nil || e.Command != c {
		t.Fatalf("DecodeEntry = %+v, %v", e, err)
	}
	for _, tc := range []struct {
		name string
		in   string
		code core.Code
	}{
		{"in entry version 5", "05070b016b01610172" + "05", core.CodeMalformed},
		{"empty request id", "06070b016b016100" + "05", core.CodeInvalidArgument},
		{"empty key", "06070b00016101720" + "5", core.CodeInvalidArgument},
		{"truncated", "06070b016b016101", core.CodeMalformed},
		{"trailing byte", golden + "00", core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, _ := hex.DecodeString(tc.in)
			e, err := core.DecodeEntry(in)
			wantCode(t, err, tc.code)
			if e != (core.Entry{}) {
				t.Fatalf("failed decode returned %+v", e)
			}
		})
	}
	for _, c := range []core.Command{
		{Kind: core.KindSettle, Key: "k", Identity: "a", RequestID: "r", Token: 1},
		{Kind: core.KindSettle, Key: "k", Identity: "a", RequestID: "r", Owner: "o"},
		{Kind: core.KindSettle, Key: "k", Identity: "a", RequestID: "r", LeaseMS: lease},
		{Kind: core.KindSettle, Key: "k", Identity: "a"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
}
