package core_test

import (
	"bytes"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v3Full is a cluster version 3 machine with every kind of version 3
// state: locks with and without request ids and identities, ended request
// records (released and expired), a data clock and two fence keys.
func v3Full(t testing.TB) *core.Machine {
	t.Helper()
	m := v3Machine(t)
	mustApply(t, m, bootstrapped...)
	applyAll(m,
		core.SetFenceKey(seed(1)),
		rgrant("jobs/1", "ACCOUNT_A/alice", "req-1", 1_000),
		rgrant("jobs/2", "", "req-1", 2_000),
		core.Grant("jobs/3", "w", lease, 3_000),
		rgrant("jobs/4", "bob", "req-9", 4_000),
		core.Release("jobs/2", 2),
		core.Expire("jobs/4", 4),
		core.SetFenceKey(seed(2)),
	)
	if m.RequestRecords() != 3 || m.DataClockMS() != 4_000 {
		t.Fatalf("v3Full: %d records, clock %d", m.RequestRecords(), m.DataClockMS())
	}
	return m
}

var goldenSeed = core.FenceSeed(bytes.Repeat([]byte{0xab}, 32))

func TestEntryVersion3Goldens(t *testing.T) {
	tests := []struct {
		name string
		cmd  core.Command
		hex  string
	}{
		{"grant with request id and identity", core.Grant("k", "o", 1000, 5).WithRequest("acct", "r1"), "030701016be807016f050461636374027231"},
		{"grant with request id, anonymous", core.Grant("k", "o", 1000, 5).WithRequest("", "r1"), "030701016be807016f0500027231"},
		{"set fence key", core.SetFenceKey(goldenSeed), "0307040a" + strings.Repeat("ab", 32)},
		// Earlier commands keep their versions byte for byte.
		{"grant without request id is v1", core.Grant("k", "o", 1000, 5), "010701016be807016f05"},
		{"set cluster version 3 is v2", core.SetClusterVersion(3), "0207040903"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := core.EncodeEntry(core.Entry{RequestID: 7, Command: tc.cmd})
			if got := hex.EncodeToString(b); got != tc.hex {
				t.Fatalf("EncodeEntry = %s, want %s", got, tc.hex)
			}
			e, err := core.DecodeEntry(b)
			if err != nil || e.Command != tc.cmd || e.RequestID != 7 {
				t.Fatalf("DecodeEntry = %+v, %v", e, err)
			}
		})
	}
}

func TestEntryVersion3Rejects(t *testing.T) {
	grant := "030701016be807016f050461636374"
	seedHex := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name, hex string
		code      core.Code
	}{
		// A version 3 grant without request id has an older encoding.
		{"v3 grant with empty request id", grant + "00", core.CodeMalformed},
		{"request id of 65 bytes", grant + "41" + strings.Repeat("72", 65), core.CodeMalformed},
		{"request id with NUL", grant + "027200", core.CodeInvalidArgument},
		{"request id not UTF-8", grant + "01ff", core.CodeInvalidArgument},
		{"request id truncated", grant + "0272", core.CodeMalformed},
		{"request id in a v2 entry", "020701016be807016f050461636374027231", core.CodeMalformed},
		{"set fence key in a v2 entry", "0207040a" + seedHex, core.CodeMalformed},
		{"set fence key with a zero seed", "0307040a" + strings.Repeat("00", 32), core.CodeInvalidArgument},
		{"set fence key truncated", "0307040a" + seedHex[:62], core.CodeMalformed},
		{"set fence key trailing byte", "0307040a" + seedHex + "00", core.CodeMalformed},
		{"control op 11", "0307040b", core.CodeMalformed},
		{"renew in a v3 entry", "030705016b09d00f", core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := hex.DecodeString(tc.hex)
			e, err := core.DecodeEntry(b)
			wantCode(t, err, tc.code)
			if e != (core.Entry{}) {
				t.Fatalf("failed decode returned %+v", e)
			}
		})
	}
	// Validate refuses a request id anywhere but on a Grant.
	for _, c := range []core.Command{
		{Kind: core.KindRelease, Key: "k", Token: 1, RequestID: "r"},
		{Kind: core.KindExpire, Key: "k", Token: 1, RequestID: "r"},
		{Kind: core.KindRenew, Key: "k", Token: 1, RequestID: "r"},
		{Kind: core.KindControl, Control: core.SetClusterVersion(3).Control, RequestID: "r"},
		core.Grant("k", "", lease, 0).WithRequest("", strings.Repeat("r", core.MaxRequestIDLen+1)),
	} {
		if err := c.Validate(); err == nil {
			t.Fatalf("%+v validates", c)
		}
	}
	if err := core.Grant("k", "", lease, 0).WithRequest("", strings.Repeat("é", core.MaxRequestIDLen/2)).Validate(); err != nil {
		t.Fatalf("a request id of MaxRequestIDLen bytes: %v", err)
	}
}

func TestLockRecordVersion3(t *testing.T) {
	l := core.Lock{Key: "k", Token: 5, Owner: "o", RequestID: "r", LeaseMS: 100, GrantedAtMS: 7}
	rec := core.EncodeLockRecord(l)
	if got := hex.EncodeToString(rec); got != "03016b05016f640700"+"0172" {
		t.Fatalf("EncodeLockRecord = %s", got)
	}
	for _, x := range []core.Lock{l, {Key: "k", Token: 5, Identity: "id", RequestID: strings.Repeat("r", core.MaxRequestIDLen), LeaseMS: 100}} {
		if got, err := core.DecodeLockRecord(core.EncodeLockRecord(x)); err != nil || got != x {
			t.Fatalf("round trip of %+v: %+v, %v", x, got, err)
		}
	}
	for _, tc := range []struct {
		name string
		rec  []byte
		code core.Code
	}{
		{"v3 with an empty request id", cat([]byte{3}, rawLock("k", 5, "o", 100, 7), str(""), str("")), core.CodeMalformed},
		{"request id with NUL", cat([]byte{3}, rawLock("k", 5, "o", 100, 7), str(""), str("a\x00")), core.CodeInvalidArgument},
		{"request id too long", cat([]byte{3}, rawLock("k", 5, "o", 100, 7), str(""), str(strings.Repeat("r", 65))), core.CodeMalformed},
		{"request id missing", cat([]byte{3}, rawLock("k", 5, "o", 100, 7), str("")), core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := core.DecodeLockRecord(tc.rec)
			wantCode(t, err, tc.code)
			if got != (core.Lock{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
}

func TestEndedRequestRecord(t *testing.T) {
	e := core.EndedRequest{Request: core.RequestKey("a", "r"), KeyHash: core.RequestKeyHash("k"), Token: math.MaxUint64, EndedAtMS: math.MaxUint64}
	b := core.EncodeEndedRequest(e)
	if got, err := core.DecodeEndedRequest(b); err != nil || got != e {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if len(b) != 1+core.MaxEndedSnapshotSize {
		t.Fatalf("a maximal ended record is %d bytes, the arithmetic says %d", len(b), 1+core.MaxEndedSnapshotSize)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"version 2", cat([]byte{2}, b[1:]), core.CodeUnknownVersion},
		{"truncated", b[:len(b)-1], core.CodeMalformed},
		{"trailing byte", cat(b, []byte{0}), core.CodeMalformed},
		{"empty", nil, core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := core.DecodeEndedRequest(tc.in)
			wantCode(t, err, tc.code)
			if got != (core.EndedRequest{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
	// The request key is scoped and unambiguous: moving bytes between
	// identity and request id names another request.
	if core.RequestKey("ab", "c") == core.RequestKey("a", "bc") || core.RequestKey("a", "r") == core.RequestKey("b", "r") {
		t.Fatal("request keys collide")
	}
}

// A cluster version 3 state travels in snapshot version 4 and control
// record version 3, and comes back identical.
func TestSnapshotVersion4RoundTrip(t *testing.T) {
	m := v3Full(t)
	snap := m.Snapshot()
	if snap[3] != core.SnapshotVersion4 || m.ControlSnapshot()[3] != core.ControlStateVersion3 {
		t.Fatalf("snapshot v%d, control record v%d", snap[3], m.ControlSnapshot()[3])
	}
	st, err := core.DecodeSnapshotState(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, m.SnapshotState()) {
		t.Fatalf("decoded %+v\nwant %+v", st, m.SnapshotState())
	}
	if info, err := core.CheckSnapshot(snap); err != nil || info.Version != core.SnapshotVersion4 || info.Locks != 2 {
		t.Fatalf("CheckSnapshot = %+v, %v", info, err)
	}
	checkRequestsSurvive(t, m)
	for _, l := range []lookup{
		{"ACCOUNT_A/alice", "req-1", heldRec("jobs/1", 1)},
		{"", "req-1", endedRec("jobs/2", 2)},
		{"bob", "req-9", endedRec("jobs/4", 4)},
	} {
		x := core.NewMachine()
		if err := x.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if got := x.LookupRequest(l.identity, l.rid); got != l.want {
			t.Fatalf("restored LookupRequest(%q, %q) = %+v, want %+v", l.identity, l.rid, got, l.want)
		}
	}
	// Older versions still decode (their goldens are in encoding_test.go
	// and version_test.go); a v3 state is refused by nothing here.
	for _, old := range [][]byte{v2Machine(t).Snapshot(), grownMachine(t).Snapshot(), snapshotV1(1, []core.Lock{lk("a", 1)})} {
		if _, err := core.DecodeSnapshotState(old); err != nil {
			t.Fatalf("an old snapshot no longer decodes: %v", err)
		}
	}
}

func TestDecodeSnapshotVersion4Rejects(t *testing.T) {
	base := v3Full(t).SnapshotState()
	for _, tc := range []struct {
		name   string
		change func(s *core.SnapshotState)
	}{
		{"two locks with one request", func(s *core.SnapshotState) { s.Locks[1].RequestID, s.Locks[1].Identity = "req-1", "ACCOUNT_A/alice" }},
		{"ended token 0", func(s *core.SnapshotState) { s.Requests.Ended[0].Token = 0 }},
		{"ended token above last", func(s *core.SnapshotState) { s.Requests.Ended[0].Token = s.LastToken + 1 }},
		{"ended token held", func(s *core.SnapshotState) { s.Requests.Ended[0].Token = s.Locks[0].Token }},
		{"ended token twice", func(s *core.SnapshotState) { s.Requests.Ended[1].Token = s.Requests.Ended[0].Token }},
		{"ended out of order", func(s *core.SnapshotState) { s.Requests.Ended[0].EndedAtMS = s.Requests.Ended[1].EndedAtMS + 1 }},
		{"ended after the data clock", func(s *core.SnapshotState) { s.Requests.DataClockMS = s.Requests.Ended[1].EndedAtMS - 1 }},
		{"sequence overflows", func(s *core.SnapshotState) { s.Requests.EndedHead = math.MaxUint64 - 1 }},
		{"zero fence seed", func(s *core.SnapshotState) { s.Control.FenceKeys[0] = core.FenceSeed{} }},
		{"fence seed twice", func(s *core.SnapshotState) { s.Control.FenceKeys[0] = s.Control.FenceKeys[1] }},
		{"too many fence keys", func(s *core.SnapshotState) {
			s.Control.FenceKeys = []core.FenceSeed{seed(1), seed(2), seed(3), seed(4), seed(5)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := core.SnapshotState{LastToken: base.LastToken, Control: base.Control, Requests: base.Requests}
			s.Locks = append([]core.Lock(nil), base.Locks...)
			s.Requests.Ended = append([]core.EndedRequest(nil), base.Requests.Ended...)
			s.Control.FenceKeys = append([]core.FenceSeed(nil), base.Control.FenceKeys...)
			tc.change(&s)
			got, err := core.DecodeSnapshotState(core.EncodeSnapshotState(s))
			wantCode(t, err, core.CodeMalformed)
			if !reflect.DeepEqual(got, core.SnapshotState{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
	// A count the input could not hold.
	snap := core.EncodeSnapshotState(core.SnapshotState{Control: core.ControlState{ClusterVersion: 3}})
	body := snap[:len(snap)-4]
	lie := seal(cat(body[:len(body)-1], uv(core.MaxRequestRecords+1)))
	if _, err := core.DecodeSnapshotState(lie); err == nil {
		t.Fatal("an ended count above the limit decoded")
	}
}

func TestControlRecordVersion3(t *testing.T) {
	// An unbootstrapped state: flags, counters and four empty lists.
	body := []byte{0, 0, 0, 0, 0, 0, 0}
	for _, tc := range []struct {
		name string
		rec  []byte
		code core.Code
	}{
		{"v2 with cluster version 3", seal(cat([]byte("TKC\x02"), body, uv(3))), core.CodeMalformed},
		{"v3 with cluster version 2", seal(cat([]byte("TKC\x03"), body, uv(2), uv(0))), core.CodeMalformed},
		{"v3 with cluster version 7", seal(cat([]byte("TKC\x03"), body, uv(7), uv(0))), core.CodeUnknownVersion},
		{"fence keys missing", seal(cat([]byte("TKC\x03"), body, uv(3))), core.CodeMalformed},
		{"fence key count lie", seal(cat([]byte("TKC\x03"), body, uv(3), uv(2), goldenSeed[:])), core.CodeMalformed},
		{"five fence keys", seal(cat([]byte("TKC\x03"), body, uv(3), uv(5), bytes.Repeat(goldenSeed[:], 5))), core.CodeMalformed},
		{"zero fence seed", seal(cat([]byte("TKC\x03"), body, uv(3), uv(1), make([]byte, 32))), core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := core.DecodeControlState(tc.rec)
			wantCode(t, err, tc.code)
			if !reflect.DeepEqual(cs, core.ControlState{}) {
				t.Fatalf("failed decode returned %+v", cs)
			}
		})
	}
	good := seal(cat([]byte("TKC\x03"), body, uv(3), uv(1), goldenSeed[:]))
	cs, err := core.DecodeControlState(good)
	if err != nil || cs.ClusterVersion != 3 || len(cs.FenceKeys) != 1 || cs.FenceKeys[0] != goldenSeed {
		t.Fatalf("DecodeControlState = %+v, %v", cs, err)
	}
	if !bytes.Equal(core.EncodeControlState(cs), good) {
		t.Fatal("the hand-built record is not the encoder's")
	}
}

// A restored cluster keeps the request records; dropped locks that had a
// request id end, so a retry of their acquire is not granted again.
func TestReseedKeepsRequests(t *testing.T) {
	m := v3Full(t)
	for _, o := range []core.ReseedOptions{{Address: addr(9), BumpTokens: 100}, {DropLocks: true, Static: true}} {
		x, _ := reseeded(t, m, o)
		if x.DataClockMS() != m.DataClockMS() {
			t.Fatalf("%+v: data clock %d", o, x.DataClockMS())
		}
		want := heldRec("jobs/1", 1)
		if o.DropLocks {
			want = endedRec("jobs/1", 1)
		}
		if got := x.LookupRequest("ACCOUNT_A/alice", "req-1"); got != want {
			t.Fatalf("%+v: LookupRequest = %+v, want %+v", o, got, want)
		}
		if got := x.LookupRequest("bob", "req-9"); got != endedRec("jobs/4", 4) {
			t.Fatalf("%+v: an ended record was lost: %+v", o, got)
		}
		if x.RequestRecords() != m.RequestRecords() {
			t.Fatalf("%+v: %d records, want %d", o, x.RequestRecords(), m.RequestRecords())
		}
		if r := x.Apply(rgrant("jobs/1", "ACCOUNT_A/alice", "req-1", m.DataClockMS())); (r.Kind == core.ResultGranted) != false {
			t.Fatalf("%+v: the retry was granted again: %v", o, r)
		}
	}
}

// LoadRequests, the storage path, refuses what the snapshot decoder
// refuses, and leaves the machine unchanged when it does.
func TestLoadRequestsRejects(t *testing.T) {
	m := v3Full(t)
	rs := m.RequestState()
	fresh := func() *core.Machine {
		x := core.NewMachine()
		x.Load(m.LastToken(), m.Locks())
		if err := x.LoadControl(m.ControlSnapshot()); err != nil {
			t.Fatal(err)
		}
		return x
	}
	for name, bad := range map[string]func(r *core.RequestState){
		"token held":      func(r *core.RequestState) { r.Ended[0].Token = 1 },
		"token above":     func(r *core.RequestState) { r.Ended[0].Token = 99 },
		"after the clock": func(r *core.RequestState) { r.DataClockMS = 0 },
	} {
		r := rs
		r.Ended = append([]core.EndedRequest(nil), rs.Ended...)
		bad(&r)
		x := fresh()
		before := x.Digest()
		wantCode(t, x.LoadRequests(r), core.CodeMalformed)
		if x.Digest() != before {
			t.Fatalf("%s: a refused LoadRequests changed the machine", name)
		}
	}
	// Request records on a machine below cluster version 3.
	x := core.NewMachine()
	x.Load(m.LastToken(), nil)
	wantCode(t, x.LoadRequests(rs), core.CodeMalformed)
	// Two locks carrying one request.
	locks := m.Locks()
	locks[1].Identity, locks[1].RequestID = locks[0].Identity, locks[0].RequestID
	y := core.NewMachine()
	y.Load(m.LastToken(), locks)
	if err := y.LoadControl(m.ControlSnapshot()); err != nil {
		t.Fatal(err)
	}
	wantCode(t, y.LoadRequests(core.RequestState{DataClockMS: rs.DataClockMS}), core.CodeMalformed)
	if err := fresh().LoadRequests(rs); err != nil {
		t.Fatalf("the machine's own request state: %v", err)
	}
}
