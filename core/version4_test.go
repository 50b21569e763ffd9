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

// v4Full is a cluster version 4 machine with every kind of version 4
// state on top of v3Full's: sessions (one refreshed, one closed, one
// expired with a delay), session locks with and without request ids, a
// plain lock with a lock-delay, and delayed keys from a lease expiry and
// a session expiry.
func v4Full(t testing.TB) *core.Machine {
	t.Helper()
	m := v3Full(t)
	mustOK := func(r core.Result) {
		t.Helper()
		switch r.Kind {
		case core.ResultNoop, core.ResultSessionNotFound, core.ResultGrantRejected:
			t.Fatalf("v4Full: %v", r)
		}
	}
	for _, c := range []core.Command{
		core.SetClusterVersion(4),
		core.OpenSession("ACCOUNT_A/alice", ttl, delay), // 1
		core.OpenSession("", 2*ttl, 0),                  // 2
		core.OpenSession("bob", ttl, 1),                 // 3
		core.Grant("s/1", "w1", 0, 5_000).InSession(1).WithRequest("ACCOUNT_A/alice", "req-s1"), // 5
		core.Grant("s/2", "", 0, 5_000).InSession(1),                                            // 6
		core.Grant("s/3", "w3", 0, 5_000).InSession(2),                                          // 7
		core.Grant("s/4", "", 0, 5_000).InSession(3),                                            // 8
		core.Grant("d/1", "", lease, 5_000).WithLockDelay(delay),                                // 9
		core.Grant("d/2", "", lease, 5_000).WithLockDelay(core.MaxLockDelayMS),                  // 10
		core.Expire("d/2", 10),
		core.RefreshSession(2),
		core.ExpireSession(3, 1),
		core.OpenSession("carol", ttl, 0), // 4
		core.CloseSession(4, "carol"),
	} {
		mustOK(m.Apply(c))
	}
	if m.SessionCount() != 2 || m.DelayCount() != 2 || m.LastSessionID() != 4 || m.LastDelaySeq() != 2 {
		t.Fatalf("v4Full: %+v", m.SessionState())
	}
	return m
}

func TestEntryVersion4Goldens(t *testing.T) {
	tests := []struct {
		name string
		cmd  core.Command
		hex  string
	}{
		{"grant in a session", core.Grant("k", "o", 1000, 5).InSession(3), "040701016b00016f0500000300"},
		{"grant with a lock-delay", core.Grant("k", "o", 1000, 5).WithLockDelay(15000), "040701016be807016f050000009875"},
		{"grant in a session with a request id", core.Grant("k", "o", 1000, 5).WithRequest("acct", "r1").InSession(300),
			"040701016b00016f050461636374027231ac0200"},
		{"open session", core.OpenSession("acct", 10000, 15000), "0407060461636374904e9875"},
		{"close session", core.CloseSession(3, "acct"), "040707030461636374"},
		{"expire session", core.ExpireSession(3, 2), "0407080302"},
		{"refresh session", core.RefreshSession(3), "04070903"},
		{"clear delay", core.ClearDelay("k", 9), "04070a016b09"},
		// Earlier commands keep their versions byte for byte.
		{"set cluster version 4 is v2", core.SetClusterVersion(4), "0207040904"},
		{"grant with request id is v3", core.Grant("k", "o", 1000, 5).WithRequest("", "r1"), "030701016be807016f0500027231"},
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

func TestEntryVersion4Rejects(t *testing.T) {
	grant := "040701016b00016f0500" // a v4 grant up to its request id
	for _, tc := range []struct {
		name, hex string
		code      core.Code
	}{
		// A version 4 grant without session nor delay has an older encoding.
		{"v4 grant without session or delay", "040701016be807016f0500" + "000000", core.CodeMalformed},
		{"session grant with a lease", "040701016be807016f0500000300", core.CodeInvalidArgument},
		{"session grant with a delay", grant + "000301", core.CodeInvalidArgument},
		{"grant without lease nor session", grant + "000001", core.CodeInvalidArgument},
		{"grant delay above the maximum", "040701016be807016f050000" + "00" + "e1d403", core.CodeInvalidArgument},
		{"grant session id not canonical", grant + "00" + "8300" + "00", core.CodeMalformed},
		{"grant truncated", grant + "0003", core.CodeMalformed},
		{"open session in a v3 entry", "0307060461636374904e9875", core.CodeMalformed},
		{"open session with a short ttl", "0407060461636374e70700", core.CodeInvalidArgument},
		{"open session trailing byte", "0407060461636374904e987500", core.CodeMalformed},
		{"close session 0", "040707000461636374", core.CodeInvalidArgument},
		{"expire session epoch 0", "0407080300", core.CodeInvalidArgument},
		{"refresh session 0", "04070900", core.CodeInvalidArgument},
		{"refresh truncated", "040709", core.CodeMalformed},
		{"clear delay seq 0", "04070a016b00", core.CodeInvalidArgument},
		{"clear delay empty key", "04070a0009", core.CodeInvalidArgument},
		{"kind 11", "04070b016b09", core.CodeMalformed},
		{"release in a v4 entry", "040702016b09", core.CodeMalformed},
		{"set cluster version in a v4 entry", "0407040904", core.CodeMalformed},
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
}

func TestLockRecordVersion4(t *testing.T) {
	for _, tc := range []struct {
		l   core.Lock
		hex string
	}{
		{core.Lock{Key: "k", Token: 5, Owner: "o", GrantedAtMS: 7, SessionID: 3}, "04016b05016f000700000300"},
		{core.Lock{Key: "k", Token: 5, Owner: "o", LeaseMS: 100, GrantedAtMS: 7, LockDelayMS: 200}, "04016b05016f6407000000c801"},
	} {
		rec := core.EncodeLockRecord(tc.l)
		if got := hex.EncodeToString(rec); got != tc.hex {
			t.Fatalf("EncodeLockRecord(%+v) = %s, want %s", tc.l, got, tc.hex)
		}
		if got, err := core.DecodeLockRecord(rec); err != nil || got != tc.l {
			t.Fatalf("round trip of %+v: %+v, %v", tc.l, got, err)
		}
	}
	for _, tc := range []struct {
		name string
		rec  []byte
		code core.Code
	}{
		{"v4 without session or delay", cat([]byte{4}, rawLock("k", 5, "o", 100, 7), str(""), str(""), uv(0), uv(0)), core.CodeMalformed},
		{"session lock with a lease", cat([]byte{4}, rawLock("k", 5, "o", 100, 7), str(""), str(""), uv(3), uv(0)), core.CodeInvalidArgument},
		{"session lock with a delay", cat([]byte{4}, rawLock("k", 5, "o", 0, 7), str(""), str(""), uv(3), uv(1)), core.CodeInvalidArgument},
		{"lease lock with lease 0", cat([]byte{4}, rawLock("k", 5, "o", 0, 7), str(""), str(""), uv(0), uv(1)), core.CodeInvalidArgument},
		{"delay above the maximum", cat([]byte{4}, rawLock("k", 5, "o", 100, 7), str(""), str(""), uv(0), uv(core.MaxLockDelayMS+1)), core.CodeInvalidArgument},
		{"delay missing", cat([]byte{4}, rawLock("k", 5, "o", 100, 7), str(""), str(""), uv(3)), core.CodeMalformed},
		{"trailing byte", cat([]byte{4}, rawLock("k", 5, "o", 0, 7), str(""), str(""), uv(3), uv(0), []byte{0}), core.CodeMalformed},
		{"v3 session lock", cat([]byte{3}, rawLock("k", 5, "o", 0, 7), str(""), str("r")), core.CodeInvalidArgument},
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

func TestSessionAndDelayRecords(t *testing.T) {
	x := core.Session{ID: 3, Identity: "a", TTLMS: 10000, LockDelayMS: 15000, Epoch: 2}
	if got := hex.EncodeToString(core.EncodeSessionRecord(x)); got != "01030161904e987502" {
		t.Fatalf("EncodeSessionRecord = %s", got)
	}
	d := core.Delay{Key: "k", DelayMS: 15000, Seq: 9}
	if got := hex.EncodeToString(core.EncodeDelayRecord(d)); got != "01016b987509" {
		t.Fatalf("EncodeDelayRecord = %s", got)
	}
	big := core.Session{ID: math.MaxUint64, Identity: strings.Repeat("i", core.MaxIdentityLen), TTLMS: core.MaxSessionTTLMS,
		LockDelayMS: core.MaxLockDelayMS, Epoch: math.MaxUint64}
	bigDelay := core.Delay{Key: strings.Repeat("k", core.MaxKeyLen), DelayMS: core.MaxLockDelayMS, Seq: math.MaxUint64}
	if n := len(core.EncodeSessionRecord(big)); n != 1+core.MaxSessionSnapshotSize {
		t.Fatalf("a maximal session record is %d bytes, the arithmetic says %d", n, 1+core.MaxSessionSnapshotSize)
	}
	if n := len(core.EncodeDelayRecord(bigDelay)); n != 1+core.MaxDelaySnapshotSize {
		t.Fatalf("a maximal delay record is %d bytes, the arithmetic says %d", n, 1+core.MaxDelaySnapshotSize)
	}
	// The decoders bound a count by the smallest encodings: they must be
	// no larger than the smallest valid record.
	small := core.EncodeSessionRecord(core.Session{ID: 1, TTLMS: core.MinSessionTTLMS, Epoch: 1})
	smallDelay := core.EncodeDelayRecord(core.Delay{Key: "k", DelayMS: 1, Seq: 1})
	if len(small)-1 < core.MinSessionSizeForTest || len(smallDelay)-1 < core.MinDelaySizeForTest {
		t.Fatalf("smallest session %d bytes, delay %d; the decoder assumes %d and %d", len(small)-1, len(smallDelay)-1,
			core.MinSessionSizeForTest, core.MinDelaySizeForTest)
	}
	for _, s := range []core.Session{x, big} {
		if got, err := core.DecodeSessionRecord(core.EncodeSessionRecord(s)); err != nil || got != s {
			t.Fatalf("round trip of %+v: %+v, %v", s, got, err)
		}
	}
	for _, dd := range []core.Delay{d, bigDelay} {
		if got, err := core.DecodeDelayRecord(core.EncodeDelayRecord(dd)); err != nil || got != dd {
			t.Fatalf("round trip of %+v: %+v, %v", dd, got, err)
		}
	}
	for _, tc := range []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"session version 2", []byte{2, 3, 1, 'a', 0x90, 0x4e, 0, 2}, core.CodeUnknownVersion},
		{"session id 0", cat([]byte{1}, uv(0), str("a"), uv(10000), uv(0), uv(2)), core.CodeMalformed},
		{"session epoch 0", cat([]byte{1}, uv(3), str("a"), uv(10000), uv(0), uv(0)), core.CodeMalformed},
		{"session ttl too short", cat([]byte{1}, uv(3), str("a"), uv(999), uv(0), uv(1)), core.CodeInvalidArgument},
		{"session delay too long", cat([]byte{1}, uv(3), str("a"), uv(10000), uv(core.MaxLockDelayMS+1), uv(1)), core.CodeInvalidArgument},
		{"session identity with NUL", cat([]byte{1}, uv(3), str("a\x00"), uv(10000), uv(0), uv(1)), core.CodeInvalidArgument},
		{"session truncated", cat([]byte{1}, uv(3), str("a"), uv(10000), uv(0)), core.CodeMalformed},
		{"session trailing byte", cat(core.EncodeSessionRecord(x), []byte{0}), core.CodeMalformed},
		{"session empty", nil, core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := core.DecodeSessionRecord(tc.in)
			wantCode(t, err, tc.code)
			if got != (core.Session{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
	for _, tc := range []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"delay version 2", []byte{2, 1, 'k', 1, 1}, core.CodeUnknownVersion},
		{"delay of 0", cat([]byte{1}, str("k"), uv(0), uv(1)), core.CodeMalformed},
		{"delay seq 0", cat([]byte{1}, str("k"), uv(1), uv(0)), core.CodeMalformed},
		{"delay too long", cat([]byte{1}, str("k"), uv(core.MaxLockDelayMS+1), uv(1)), core.CodeInvalidArgument},
		{"delay empty key", cat([]byte{1}, str(""), uv(1), uv(1)), core.CodeInvalidArgument},
		{"delay key too long", cat([]byte{1}, str(strings.Repeat("k", core.MaxKeyLen+1)), uv(1), uv(1)), core.CodeMalformed},
		{"delay trailing byte", cat(core.EncodeDelayRecord(d), []byte{0}), core.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := core.DecodeDelayRecord(tc.in)
			wantCode(t, err, tc.code)
			if got != (core.Delay{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
}

// A cluster version 4 state travels in snapshot version 5 (control
// record still version 3), through the streaming encoder too, and comes
// back identical.
func TestSnapshotVersion5RoundTrip(t *testing.T) {
	m := v4Full(t)
	snap := m.Snapshot()
	if snap[3] != core.SnapshotVersion5 || m.ControlSnapshot()[3] != core.ControlStateVersion3 {
		t.Fatalf("snapshot v%d, control record v%d", snap[3], m.ControlSnapshot()[3])
	}
	st, err := core.DecodeSnapshotState(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, m.SnapshotState()) {
		t.Fatalf("decoded %+v\nwant %+v", st, m.SnapshotState())
	}
	if info, err := core.CheckSnapshot(snap); err != nil || info.Version != core.SnapshotVersion5 || info.Locks != uint64(m.Len()) {
		t.Fatalf("CheckSnapshot = %+v, %v", info, err)
	}
	for _, records := range []bool{false, true} {
		got, err := encodeState(t, st, records)
		if err != nil || !bytes.Equal(got, snap) {
			t.Fatalf("streaming encoder (records %t): %v, bytes equal %t", records, err, bytes.Equal(got, snap))
		}
	}
	checkSessionsSurvive(t, m)
	// What a restored machine answers, it answers as the original does.
	x := core.NewMachine()
	if err := x.Restore(snap); err != nil {
		t.Fatal(err)
	}
	for _, c := range []core.Command{core.ExpireSession(2, 1), core.ExpireSession(2, 2), core.Grant("d/2", "", lease, 0),
		core.ClearDelay("d/2", 1), core.Expire("d/1", 9), core.Grant("s/1", "", lease, 0), core.OpenSession("", ttl, 0)} {
		if a, b := m.Apply(c), x.Apply(c); a != b || m.Digest() != x.Digest() {
			t.Fatalf("%+v: original %v, restored %v", c, a, b)
		}
	}
}

func TestDecodeSnapshotVersion5Rejects(t *testing.T) {
	base := v4Full(t).SnapshotState()
	key := func(s *core.SnapshotState, k string) *core.Lock {
		for i := range s.Locks {
			if s.Locks[i].Key == k {
				return &s.Locks[i]
			}
		}
		t.Fatalf("no lock %q", k)
		return nil
	}
	for _, tc := range []struct {
		name   string
		change func(s *core.SnapshotState)
	}{
		{"a lock of a session not open", func(s *core.SnapshotState) { key(s, "s/3").SessionID = 3 }},
		{"a delayed key held", func(s *core.SnapshotState) { s.Sessions.Delays[0].Key = "d/1" }},
		{"a session above the counter", func(s *core.SnapshotState) { s.Sessions.LastSessionID = 1 }},
		{"a delay above the counter", func(s *core.SnapshotState) { s.Sessions.LastDelaySeq = 1 }},
		{"sessions out of order", func(s *core.SnapshotState) {
			s.Sessions.Sessions[0], s.Sessions.Sessions[1] = s.Sessions.Sessions[1], s.Sessions.Sessions[0]
		}},
		{"delays out of order", func(s *core.SnapshotState) {
			s.Sessions.Delays[0], s.Sessions.Delays[1] = s.Sessions.Delays[1], s.Sessions.Delays[0]
		}},
		{"two delays with one seq", func(s *core.SnapshotState) { s.Sessions.Delays[1].Seq = s.Sessions.Delays[0].Seq }},
		{"a session with epoch 0", func(s *core.SnapshotState) { s.Sessions.Sessions[0].Epoch = 0 }},
		{"a session lock with a lease", func(s *core.SnapshotState) { key(s, "s/3").LeaseMS = lease }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			s.Locks = append([]core.Lock(nil), base.Locks...)
			s.Sessions.Sessions = append([]core.Session(nil), base.Sessions.Sessions...)
			s.Sessions.Delays = append([]core.Delay(nil), base.Sessions.Delays...)
			tc.change(&s)
			b := snapshotV5(s)
			got, err := core.DecodeSnapshotState(b)
			if err == nil {
				t.Fatal("decoded")
			}
			checkDecodeError(t, err)
			if !reflect.DeepEqual(got, core.SnapshotState{}) {
				t.Fatalf("failed decode returned %+v", got)
			}
		})
	}
	// Each snapshot version carries its own cluster version: a version 4
	// snapshot of a cluster at version 4, a version 5 one at version 3.
	s := core.SnapshotState{Control: core.ControlState{ClusterVersion: 4}}
	b := snapshotV5(s)
	v3 := core.EncodeSnapshotState(core.SnapshotState{Control: core.ControlState{ClusterVersion: 3}})
	for name, wrong := range map[string][]byte{
		"v4 at cluster version 4": seal(cat([]byte("TKS\x04"), b[4:len(b)-4-4])), // without the empty session section
		"v5 at cluster version 3": seal(cat([]byte("TKS\x05"), v3[4:len(v3)-4], uv(0), uv(0), uv(0), uv(0))),
	} {
		if _, err := core.DecodeSnapshotState(wrong); err == nil {
			t.Fatalf("%s decoded", name)
		}
	}
	if _, err := core.DecodeSnapshotState(seal(cat([]byte("TKS\x05"), b[4:len(b)-4]))); err != nil {
		t.Fatalf("the resealed empty v5 snapshot: %v", err)
	}
	// Counts the input could not hold.
	body := b[:len(b)-4]
	for _, lie := range [][]byte{
		seal(cat(body[:len(body)-2], uv(core.MaxSessions+1), uv(0))),
		seal(cat(body[:len(body)-1], uv(core.MaxDelayedKeys+1))),
		seal(cat(body[:len(body)-1], uv(3))),
	} {
		if _, err := core.DecodeSnapshotState(lie); err == nil {
			t.Fatal("a count above the limit or the input decoded")
		}
	}
}

// snapshotV5 encodes s in snapshot version 5 (its cluster version is 4):
// the encoder writes what it is given; only the decoder validates.
func snapshotV5(s core.SnapshotState) []byte { return core.EncodeSnapshotState(s) }

func TestSnapshotEncoderVersion5Refuses(t *testing.T) {
	v5 := core.ControlState{ClusterVersion: 4}
	x := core.Session{ID: 2, TTLMS: ttl, Epoch: 1}
	d := core.Delay{Key: "k", DelayMS: 1, Seq: 2}
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"session lock before version 4", func() error {
			_, err := encodeVia(t, []core.Lock{{Key: "a", Token: 1, SessionID: 1}}, true, true)
			return err
		}},
		{"lock-delay before version 4 (Add)", func() error {
			_, err := encodeVia(t, []core.Lock{{Key: "a", Token: 1, LeaseMS: lease, LockDelayMS: 1}}, true, false)
			return err
		}},
		{"sessions before version 4", func() error {
			return core.NewSnapshotEncoder(5, 0, core.ControlState{ClusterVersion: 3}, 0).BeginSessions(1, 0, 0, 0)
		}},
		{"session before begin", func() error { return core.NewSnapshotEncoder(5, 0, v5, 0).AddSession(x) }},
		{"delay before begin", func() error { return core.NewSnapshotEncoder(5, 0, v5, 0).AddDelay(d) }},
		{"begun twice", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(2, 2, 0, 0)
			return e.BeginSessions(2, 2, 0, 0)
		}},
		{"requests after sessions", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(2, 2, 0, 0)
			return e.BeginRequests(0, 0, 0)
		}},
		{"locks missing", func() error { return core.NewSnapshotEncoder(5, 1, v5, 0).BeginSessions(2, 2, 0, 0) }},
		{"session above the counter", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(1, 2, 1, 0)
			return e.AddSession(x)
		}},
		{"sessions out of order", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 2, 2, 0)
			_ = e.AddSession(x)
			return e.AddSession(core.Session{ID: 1, TTLMS: ttl, Epoch: 1})
		}},
		{"invalid session", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 2, 1, 0)
			return e.AddSession(core.Session{ID: 1, TTLMS: 1, Epoch: 1})
		}},
		{"more sessions than declared", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 2, 0, 0)
			return e.AddSession(x)
		}},
		{"delay before the sessions are done", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 2, 1, 1)
			return e.AddDelay(d)
		}},
		{"session after a delay", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 2, 0, 1)
			_ = e.AddDelay(d)
			return e.AddSession(x)
		}},
		{"delay above the counter", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 1, 0, 1)
			return e.AddDelay(d)
		}},
		{"delays out of order", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 3, 0, 2)
			_ = e.AddDelay(d)
			return e.AddDelay(core.Delay{Key: "a", DelayMS: 1, Seq: 3})
		}},
		{"fewer delays than declared", func() error {
			e := core.NewSnapshotEncoder(5, 0, v5, 0)
			_ = e.BeginSessions(3, 3, 0, 2)
			_ = e.AddDelay(d)
			_, err := e.Finish()
			return err
		}},
		{"too many sessions declared", func() error {
			return core.NewSnapshotEncoder(5, 0, v5, 0).BeginSessions(3, 3, core.MaxSessions+1, 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
