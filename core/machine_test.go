package core_test

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

const lease = 30_000 // a valid lease in ms, used wherever the value does not matter

var (
	noop          = core.Result{Kind: core.ResultNoop}
	released      = core.Result{Kind: core.ResultReleased}
	notFound      = core.Result{Kind: core.ResultNotFound}
	expiredTrue   = core.Result{Kind: core.ResultExpired, Existed: true}
	expiredFalse  = core.Result{Kind: core.ResultExpired, Existed: false}
	granted       = func(tok uint64) core.Result { return core.Result{Kind: core.ResultGranted, Token: tok} }
	grantRejected = func(tok uint64) core.Result { return core.Result{Kind: core.ResultGrantRejected, Token: tok} }
)

// applyAll applies cmds in order and returns the results.
func applyAll(m *core.Machine, cmds ...core.Command) []core.Result {
	out := make([]core.Result, 0, len(cmds))
	for _, c := range cmds {
		out = append(out, m.Apply(c))
	}
	return out
}

// wantCode fails unless err is a *core.Error with the given code that
// errors.Is also matches against the code's sentinel.
func wantCode(t *testing.T, err error, code core.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want code %q", code)
	}
	var ce *core.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *core.Error", err, err)
	}
	if ce.Code != code {
		t.Fatalf("error %v has code %q, want %q", err, ce.Code, code)
	}
	if !errors.Is(err, &core.Error{Code: code}) {
		t.Fatalf("errors.Is(%v, code %q) = false", err, code)
	}
}

// lk is shorthand for a held lock with the default lease and no owner.
func lk(key string, tok uint64) core.Lock {
	return core.Lock{Key: key, Token: tok, LeaseMS: lease}
}

// TestApply is the table of SPEC §2-§3 transitions: each case applies setup,
// then one command, and checks its result and the whole state afterwards.
func TestApply(t *testing.T) {
	tests := []struct {
		name      string
		setup     []core.Command
		cmd       core.Command
		want      core.Result
		wantLocks []core.Lock
		wantLast  uint64
	}{
		{
			name:      "grant free key on empty machine issues token 1",
			cmd:       core.Grant("a", "", lease, 0),
			want:      granted(1),
			wantLocks: []core.Lock{lk("a", 1)},
			wantLast:  1,
		},
		{
			name:      "grant second free key issues token 2",
			setup:     []core.Command{core.Grant("a", "", lease, 0)},
			cmd:       core.Grant("b", "", lease, 0),
			want:      granted(2),
			wantLocks: []core.Lock{lk("a", 1), lk("b", 2)},
			wantLast:  2,
		},
		{
			name:      "grant records owner lease and granted_at",
			cmd:       core.Grant("a", "client-7", 1234, 99),
			want:      granted(1),
			wantLocks: []core.Lock{{Key: "a", Token: 1, Owner: "client-7", LeaseMS: 1234, GrantedAtMS: 99}},
			wantLast:  1,
		},
		{
			name:      "grant held key is rejected with the holder token",
			setup:     []core.Command{core.Grant("x", "", lease, 0), core.Grant("a", "", lease, 0)},
			cmd:       core.Grant("a", "other", lease, 0),
			want:      grantRejected(2),
			wantLocks: []core.Lock{lk("a", 2), lk("x", 1)},
			wantLast:  2,
		},
		{
			name:      "release with the exact token",
			setup:     []core.Command{core.Grant("a", "", lease, 0)},
			cmd:       core.Release("a", 1),
			want:      released,
			wantLocks: nil,
			wantLast:  1,
		},
		{
			name:      "release with a wrong token is not found and the lock stays",
			setup:     []core.Command{core.Grant("a", "", lease, 0)},
			cmd:       core.Release("a", 2),
			want:      notFound,
			wantLocks: []core.Lock{lk("a", 1)},
			wantLast:  1,
		},
		{
			name:      "release with another key's token is not found",
			setup:     []core.Command{core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0)},
			cmd:       core.Release("a", 2),
			want:      notFound,
			wantLocks: []core.Lock{lk("a", 1), lk("b", 2)},
			wantLast:  2,
		},
		{
			name:      "release of a missing key is not found",
			setup:     []core.Command{core.Grant("a", "", lease, 0)},
			cmd:       core.Release("b", 1),
			want:      notFound,
			wantLocks: []core.Lock{lk("a", 1)},
			wantLast:  1,
		},
		{
			name:     "release twice: the second is not found",
			setup:    []core.Command{core.Grant("a", "", lease, 0), core.Release("a", 1)},
			cmd:      core.Release("a", 1),
			want:     notFound,
			wantLast: 1,
		},
		{
			name:     "expire with the matching token removes the lock",
			setup:    []core.Command{core.Grant("a", "", lease, 0)},
			cmd:      core.Expire("a", 1),
			want:     expiredTrue,
			wantLast: 1,
		},
		{
			name:      "expire with a wrong token keeps the lock",
			setup:     []core.Command{core.Grant("a", "", lease, 0)},
			cmd:       core.Expire("a", 7),
			want:      expiredFalse,
			wantLocks: []core.Lock{lk("a", 1)},
			wantLast:  1,
		},
		{
			name:     "expire of a missing key",
			cmd:      core.Expire("a", 1),
			want:     expiredFalse,
			wantLast: 0,
		},
		{
			name:     "duplicate expire is idempotent",
			setup:    []core.Command{core.Grant("a", "", lease, 0), core.Expire("a", 1)},
			cmd:      core.Expire("a", 1),
			want:     expiredFalse,
			wantLast: 1,
		},
		{
			name: "late expire with an old token after re-grant: the new lock survives",
			setup: []core.Command{
				core.Grant("a", "", lease, 0),
				core.Release("a", 1),
				core.Grant("a", "", lease, 0),
			},
			cmd:       core.Expire("a", 1),
			want:      expiredFalse,
			wantLocks: []core.Lock{lk("a", 2)},
			wantLast:  2,
		},
		{
			name: "duplicated expire after the key expired and was granted again",
			setup: []core.Command{
				core.Grant("a", "", lease, 0),
				core.Expire("a", 1),
				core.Grant("a", "", lease, 0),
			},
			cmd:       core.Expire("a", 1),
			want:      expiredFalse,
			wantLocks: []core.Lock{lk("a", 2)},
			wantLast:  2,
		},
		{
			name: "late release with an old token after re-grant: the new lock survives",
			setup: []core.Command{
				core.Grant("a", "", lease, 0),
				core.Expire("a", 1),
				core.Grant("a", "", lease, 0),
			},
			cmd:       core.Release("a", 1),
			want:      notFound,
			wantLocks: []core.Lock{lk("a", 2)},
			wantLast:  2,
		},
		{
			name: "re-grant after release gets a fresh token, never the released one",
			setup: []core.Command{
				core.Grant("a", "", lease, 0),
				core.Release("a", 1),
			},
			cmd:       core.Grant("a", "", lease, 0),
			want:      granted(2),
			wantLocks: []core.Lock{lk("a", 2)},
			wantLast:  2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := core.NewMachine()
			applyAll(m, tc.setup...)
			if got := m.Apply(tc.cmd); got != tc.want {
				t.Fatalf("Apply(%+v) = %v, want %v", tc.cmd, got, tc.want)
			}
			if got := m.Locks(); !slices.Equal(got, tc.wantLocks) {
				t.Errorf("Locks() = %+v, want %+v", got, tc.wantLocks)
			}
			if got := m.LastToken(); got != tc.wantLast {
				t.Errorf("LastToken() = %d, want %d", got, tc.wantLast)
			}
			if m.Len() != len(tc.wantLocks) {
				t.Errorf("Len() = %d, want %d", m.Len(), len(tc.wantLocks))
			}
		})
	}
}

func TestApplyGrantRejectedChangesNothing(t *testing.T) {
	m := core.NewMachine()
	applyAll(m, core.Grant("a", "first", lease, 10), core.Grant("b", "", lease, 0), core.Release("b", 2))
	before := m.Snapshot()
	for i := range 3 {
		if got := m.Apply(core.Grant("a", "second", 2*lease, 20)); got != grantRejected(1) {
			t.Fatalf("attempt %d: got %v, want %v", i, got, grantRejected(1))
		}
	}
	if !bytes.Equal(m.Snapshot(), before) {
		t.Fatal("a rejected grant changed the state")
	}
	if l, _ := m.Get("a"); l.Owner != "first" || l.LeaseMS != lease || l.GrantedAtMS != 10 {
		t.Fatalf("holder overwritten: %+v", l)
	}
	// The counter did not move: the next successful grant continues at 3.
	if got := m.Apply(core.Grant("c", "", lease, 0)); got != granted(3) {
		t.Fatalf("next grant = %v, want %v", got, granted(3))
	}
}

func TestApplyTokensStrictlyIncreasing(t *testing.T) {
	m := core.NewMachine()
	var last uint64
	for round := range 50 {
		key := []string{"a", "b", "c"}[round%3]
		r := m.Apply(core.Grant(key, "", lease, uint64(round)))
		if r.Kind != core.ResultGranted || r.Token != last+1 {
			t.Fatalf("round %d: grant = %v, want granted{token:%d}", round, r, last+1)
		}
		last = r.Token
		// Alternate release and expire so both paths are exercised.
		var end core.Result
		if round%2 == 0 {
			end = m.Apply(core.Release(key, r.Token))
		} else {
			end = m.Apply(core.Expire(key, r.Token))
		}
		if end != released && end != expiredTrue {
			t.Fatalf("round %d: end = %v", round, end)
		}
	}
	if m.Len() != 0 || m.LastToken() != 50 {
		t.Fatalf("Len=%d LastToken=%d, want 0 and 50", m.Len(), m.LastToken())
	}
}

func TestApplyExpireIdempotent(t *testing.T) {
	m := core.NewMachine()
	applyAll(m, core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0))
	if got := m.Apply(core.Expire("a", 1)); got != expiredTrue {
		t.Fatalf("first expire = %v", got)
	}
	after := m.Snapshot()
	for i := range 5 {
		if got := m.Apply(core.Expire("a", 1)); got != expiredFalse {
			t.Fatalf("repeat %d = %v, want %v", i, got, expiredFalse)
		}
		if !bytes.Equal(m.Snapshot(), after) {
			t.Fatalf("repeat %d changed the state", i)
		}
	}
}

func TestZeroMachine(t *testing.T) {
	var m core.Machine
	if m.Len() != 0 || m.LastToken() != 0 || len(m.Locks()) != 0 {
		t.Fatal("zero machine is not empty")
	}
	if _, ok := m.Get("a"); ok {
		t.Fatal("zero machine holds a")
	}
	if !bytes.Equal(m.Snapshot(), core.NewMachine().Snapshot()) || m.Digest() != core.NewMachine().Digest() {
		t.Fatal("zero machine and NewMachine differ")
	}
	if got := m.Apply(core.Release("a", 1)); got != notFound {
		t.Fatalf("release on zero machine = %v", got)
	}
	if got := m.Apply(core.Grant("a", "", lease, 0)); got != granted(1) {
		t.Fatalf("grant on zero machine = %v", got)
	}
}

// invalidCommands are commands Validate rejects; Apply must turn each into
// Noop without touching the state.
func invalidCommands() map[string]core.Command {
	return map[string]core.Command{
		"grant empty key":           core.Grant("", "", lease, 0),
		"grant 513-byte key":        core.Grant(strings.Repeat("k", 513), "", lease, 0),
		"grant 10KB key":            core.Grant(strings.Repeat("k", 10<<10), "", lease, 0),
		"grant NUL in key":          core.Grant("a\x00b", "", lease, 0),
		"grant invalid UTF-8 key":   core.Grant("a\xffb", "", lease, 0),
		"grant lease 0":             core.Grant("a", "", 0, 0),
		"grant lease 99ms":          core.Grant("a", "", 99, 0),
		"grant lease over 24h":      core.Grant("a", "", core.MaxLeaseMS+1, 0),
		"grant lease max uint64":    core.Grant("a", "", math.MaxUint64, 0),
		"grant 257-byte owner":      core.Grant("a", strings.Repeat("o", 257), lease, 0),
		"grant invalid UTF-8 owner": core.Grant("a", "\xc3\x28", lease, 0),
		"grant carrying a token":    {Kind: core.KindGrant, Key: "a", LeaseMS: lease, Token: 9},
		"release zero token":        core.Release("a", 0),
		"release empty key":         core.Release("", 1),
		"release carrying an owner": {Kind: core.KindRelease, Key: "a", Token: 1, Owner: "o"},
		"release carrying a lease":  {Kind: core.KindRelease, Key: "a", Token: 1, LeaseMS: lease},
		"expire zero token":         core.Expire("a", 0),
		"expire 513-byte key":       core.Expire(strings.Repeat("k", 513), 1),
		"expire carrying a time":    {Kind: core.KindExpire, Key: "a", Token: 1, GrantedAtMS: 5},
		"control kind":              {Kind: core.KindControl, Key: "a"},
		"control without op":        {Kind: core.KindControl},
		"grant carrying control":    {Kind: core.KindGrant, Key: "a", LeaseMS: lease, Control: core.ControlRequest{Op: core.ControlMintJoin, CredentialHash: [32]byte{1}}},
		"expire carrying control":   {Kind: core.KindExpire, Key: "a", Token: 1, Control: core.ControlRequest{NodeID: 1}},
		"kind zero":                 {Kind: 0, Key: "a", Token: 1},
		"unknown kind 9":            {Kind: 9, Key: "a", Token: 1},
	}
}

func TestApplyInvalidIsNoop(t *testing.T) {
	for name, c := range invalidCommands() {
		t.Run(name, func(t *testing.T) {
			m := core.NewMachine()
			applyAll(m, core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0), core.Release("b", 2))
			before := m.Snapshot()
			if c.Validate() == nil {
				t.Fatalf("Validate accepted %+v", c)
			}
			if got := m.Apply(c); got != noop {
				t.Fatalf("Apply = %v, want noop", got)
			}
			if !bytes.Equal(m.Snapshot(), before) {
				t.Fatal("an invalid command changed the state")
			}
			if got := m.Apply(core.Grant("c", "", lease, 0)); got != granted(3) {
				t.Fatalf("an invalid command moved the counter: next grant = %v", got)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cmd  core.Command
		code core.Code // "" means valid
	}{
		{"grant minimal", core.Grant("a", "", core.MinLeaseMS, 0), ""},
		{"grant 512-byte key", core.Grant(strings.Repeat("k", 512), "", lease, 0), ""},
		{"grant multibyte key", core.Grant("잠금/키", "소유자", lease, 0), ""},
		{"grant max lease 24h", core.Grant("a", "", core.MaxLeaseMS, 0), ""},
		{"grant 256-byte owner", core.Grant("a", strings.Repeat("o", 256), lease, 0), ""},
		{"grant any granted_at", core.Grant("a", "", lease, math.MaxUint64), ""},
		{"release", core.Release("a", 1), ""},
		{"expire max token", core.Expire("a", math.MaxUint64), ""},

		{"empty key", core.Grant("", "", lease, 0), core.CodeInvalidArgument},
		{"513-byte key", core.Grant(strings.Repeat("k", 513), "", lease, 0), core.CodeInvalidArgument},
		{"10KB key", core.Grant(strings.Repeat("k", 10<<10), "", lease, 0), core.CodeInvalidArgument},
		{"invalid UTF-8 key", core.Grant("\xff", "", lease, 0), core.CodeInvalidArgument},
		{"truncated UTF-8 key", core.Grant("잠"[:2], "", lease, 0), core.CodeInvalidArgument},
		{"NUL in key", core.Release("a\x00", 1), core.CodeInvalidArgument},
		{"lease 0", core.Grant("a", "", 0, 0), core.CodeInvalidArgument},
		{"lease 99ms", core.Grant("a", "", 99, 0), core.CodeInvalidArgument},
		{"lease 24h+1ms", core.Grant("a", "", core.MaxLeaseMS+1, 0), core.CodeInvalidArgument},
		{"lease 25h", core.Grant("a", "", 25*3600*1000, 0), core.CodeInvalidArgument},
		{"owner 257 bytes", core.Grant("a", strings.Repeat("o", 257), lease, 0), core.CodeInvalidArgument},
		{"invalid UTF-8 owner", core.Grant("a", "ok\xfe", lease, 0), core.CodeInvalidArgument},
		{"token on grant", core.Command{Kind: core.KindGrant, Key: "a", LeaseMS: lease, Token: 1}, core.CodeInvalidArgument},
		{"zero token on release", core.Release("a", 0), core.CodeInvalidArgument},
		{"zero token on expire", core.Expire("a", 0), core.CodeInvalidArgument},
		{"owner on expire", core.Command{Kind: core.KindExpire, Key: "a", Token: 1, Owner: "o"}, core.CodeInvalidArgument},
		{"unknown kind", core.Command{Kind: 200, Key: "a"}, core.CodeInvalidArgument},
		{"control kind carrying a key", core.Command{Kind: core.KindControl, Key: "a"}, core.CodeInvalidArgument},
		{"control kind without op", core.Command{Kind: core.KindControl}, core.CodeInvalidArgument},
		{"grant carrying a control request", core.Command{Kind: core.KindGrant, Key: "a", LeaseMS: lease, Control: core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1}}, core.CodeInvalidArgument},
		{"release carrying a control op only", core.Command{Kind: core.KindRelease, Key: "a", Token: 1, Control: core.ControlRequest{Op: core.ControlBootstrap}}, core.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cmd.Validate()
			if tc.code == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			wantCode(t, err, tc.code)
			if tc.code == core.CodeInvalidArgument && !errors.Is(err, core.ErrInvalidArgument) {
				t.Fatalf("errors.Is(%v, ErrInvalidArgument) = false", err)
			}
			if tc.code == core.CodeUnsupported && !errors.Is(err, core.ErrUnsupported) {
				t.Fatalf("errors.Is(%v, ErrUnsupported) = false", err)
			}
		})
	}
}

func TestErrorIs(t *testing.T) {
	err := error(&core.Error{Code: core.CodeMalformed, Detail: "bad varint"})
	if !errors.Is(err, core.ErrMalformed) {
		t.Error("detail-free sentinel does not match")
	}
	if !errors.Is(err, &core.Error{Code: core.CodeMalformed, Detail: "bad varint"}) {
		t.Error("equal code and detail do not match")
	}
	if errors.Is(err, &core.Error{Code: core.CodeMalformed, Detail: "other"}) {
		t.Error("different detail matches")
	}
	for _, s := range []error{core.ErrInvalidArgument, core.ErrUnknownVersion, core.ErrUnsupported, errors.New("x")} {
		if errors.Is(err, s) {
			t.Errorf("matches %v", s)
		}
	}
	if got, want := err.Error(), "core: malformed: bad varint"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{core.KindGrant.String(), "grant"},
		{core.KindRelease.String(), "release"},
		{core.KindExpire.String(), "expire"},
		{core.KindControl.String(), "control"},
		{core.KindSettle.String(), "settle"},
		{core.Kind(12).String(), "kind(12)"},
		{granted(3).String(), "granted{token:3}"},
		{grantRejected(4).String(), "grant_rejected{token:4}"},
		{released.String(), "released"},
		{notFound.String(), "not_found"},
		{expiredTrue.String(), "expired{existed:true}"},
		{expiredFalse.String(), "expired{existed:false}"},
		{noop.String(), "noop"},
		{core.ResultKind(77).String(), "result(77)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestLocksSortedByKey(t *testing.T) {
	m := core.NewMachine()
	keys := []string{"zeta", "a", "ключ", "B", "a/b", "a0", "잠금"}
	for _, k := range keys {
		m.Apply(core.Grant(k, "", lease, 0))
	}
	got := m.Locks()
	if len(got) != len(keys) {
		t.Fatalf("%d locks, want %d", len(got), len(keys))
	}
	if !slices.IsSortedFunc(got, func(a, b core.Lock) int { return strings.Compare(a.Key, b.Key) }) {
		t.Fatalf("Locks not sorted: %+v", got)
	}
	// Locks returns a copy: mutating it does not reach the machine.
	got[0].Token = 999
	if l, _ := m.Get(got[0].Key); l.Token == 999 {
		t.Fatal("Locks aliases the table")
	}
}

// Restarts and snapshots keep the counter, so a token is never reused even
// when the table is empty at snapshot time (SPEC §4.3).
func TestSnapshotKeepsCounter(t *testing.T) {
	m := core.NewMachine()
	applyAll(m, core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0), core.Release("a", 1), core.Expire("b", 2))
	fresh := core.NewMachine()
	if err := fresh.Restore(m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if fresh.Digest() != m.Digest() {
		t.Fatal("digest differs after restore")
	}
	if got := fresh.Apply(core.Grant("a", "", lease, 0)); got != granted(3) {
		t.Fatalf("grant after restore = %v, want %v", got, granted(3))
	}
}

func TestRestoreReplacesState(t *testing.T) {
	src := core.NewMachine()
	applyAll(src, core.Grant("a", "", lease, 0))
	dst := core.NewMachine()
	applyAll(dst, core.Grant("x", "", lease, 0), core.Grant("y", "", lease, 0), core.Grant("z", "", lease, 0))
	if err := dst.Restore(src.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dst.Locks(), []core.Lock{lk("a", 1)}) || dst.LastToken() != 1 {
		t.Fatalf("restore did not discard previous state: %+v last=%d", dst.Locks(), dst.LastToken())
	}
}

func TestRestoreErrorLeavesMachineUnchanged(t *testing.T) {
	m := core.NewMachine()
	applyAll(m, core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0))
	before := m.Snapshot()
	bad := slices.Clone(before)
	bad[len(bad)-1] ^= 1
	wantCode(t, m.Restore(bad), core.CodeMalformed)
	wantCode(t, m.Restore(nil), core.CodeMalformed)
	if !bytes.Equal(m.Snapshot(), before) {
		t.Fatal("failed restore changed the state")
	}
}

func TestDigestDistinguishesStates(t *testing.T) {
	a, b := core.NewMachine(), core.NewMachine()
	applyAll(a, core.Grant("k", "", lease, 0))
	applyAll(b, core.Grant("k", "", lease, 0))
	if a.Digest() != b.Digest() {
		t.Fatal("equal histories give different digests")
	}
	applyAll(a, core.Release("k", 1))
	applyAll(b, core.Expire("k", 1))
	if a.Digest() != b.Digest() {
		t.Fatal("release and expire of the same lock give different states")
	}
	// Same table, different counter.
	applyAll(a, core.Grant("k", "", lease, 0), core.Release("k", 2))
	if a.Digest() == b.Digest() {
		t.Fatal("digest ignores the token counter")
	}
	// Same key and token, different owner.
	c, d := core.NewMachine(), core.NewMachine()
	c.Apply(core.Grant("k", "o1", lease, 0))
	d.Apply(core.Grant("k", "o2", lease, 0))
	if c.Digest() == d.Digest() {
		t.Fatal("digest ignores the owner")
	}
}

// The token counter must never wrap: a wrapped counter would issue token 0
// and then reuse every token ever issued (SPEC §4.3).
func TestGrantNeverWrapsTokenCounter(t *testing.T) {
	m := core.NewMachine()
	m.Load(math.MaxUint64-1, []core.Lock{lk("held", math.MaxUint64-1)})
	if got := m.Apply(core.Grant("a", "", lease, 0)); got != granted(math.MaxUint64) {
		t.Fatalf("last grant = %v", got)
	}
	before := m.Snapshot()
	if got := m.Apply(core.Grant("b", "", lease, 0)); got != noop {
		t.Fatalf("grant with an exhausted counter = %v, want noop", got)
	}
	if got := m.Apply(core.Grant("held", "", lease, 0)); got != grantRejected(math.MaxUint64-1) {
		t.Fatalf("grant of a held key with an exhausted counter = %v", got)
	}
	if !bytes.Equal(m.Snapshot(), before) || m.LastToken() != math.MaxUint64 {
		t.Fatal("a grant with an exhausted counter changed the state")
	}
	// Release and expire still work.
	if got := m.Apply(core.Release("a", math.MaxUint64)); got != released {
		t.Fatalf("release = %v", got)
	}
}
