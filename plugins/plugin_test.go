package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	sdk "github.com/ticketd/ticketd/sdk/plugin"
)

var ctx = context.Background()

func TestOwnerPrefixAllowDeny(t *testing.T) {
	p := load(t, "ownerprefix", Config{})
	if !p.HasPolicy() || p.HasAudit() {
		t.Fatalf("HasPolicy=%v HasAudit=%v, want true false", p.HasPolicy(), p.HasAudit())
	}
	for _, tc := range []struct {
		key, owner string
		allow      bool
		reason     string
	}{
		{"payments/invoice-7", "svc-payments-api-1", true, ""},
		{"payments/invoice-7", "svc-orders-1", false, `keys under "payments/" need an owner starting with "svc-payments-"`},
		{"payments/invoice-7", "", false, `keys under "payments/" need an owner starting with "svc-payments-"`},
		{"payments/refunds/42", "svc-refunds-worker", true, ""},
		{"payments/refunds/42", "svc-payments-api-1", false, `keys under "payments/refunds/" need an owner starting with "svc-refunds-"`},
		{"inventory/sku-1", "svc-inventory-x", true, ""},
		{"inventory/sku-1", "svc-payments-api-1", false, `keys under "inventory/" need an owner starting with "svc-inventory-"`},
		{"misc/anything", "", true, ""},
		{"paymentsX", "nobody", true, ""},
	} {
		v, err := p.ValidateGrant(ctx, Grant{Key: tc.key, Owner: tc.owner, Identity: "", LeaseMS: 1000})
		if err != nil {
			t.Fatalf("ValidateGrant(%q, %q): %v", tc.key, tc.owner, err)
		}
		if v.Allow != tc.allow || v.Reason != tc.reason {
			t.Errorf("ValidateGrant(%q, %q) = %+v, want allow=%v reason=%q", tc.key, tc.owner, v, tc.allow, tc.reason)
		}
	}
}

func TestAuditEvents(t *testing.T) {
	p := load(t, "audit", Config{Name: "audit"})
	if p.HasPolicy() || !p.HasAudit() {
		t.Fatalf("HasPolicy=%v HasAudit=%v, want false true", p.HasPolicy(), p.HasAudit())
	}
	for _, tc := range []struct {
		cmd  core.Command
		res  core.Result
		typ  string
		data string
	}{
		{core.Grant("k", "o", 1500, 77), core.Result{Kind: core.ResultGranted, Token: 9},
			"lock.granted", `{"key":"k","owner":"o","token":9,"lease_ms":1500,"granted_at_ms":77}`},
		{core.Grant("k", "o2", 1500, 78), core.Result{Kind: core.ResultGrantRejected, Token: 9},
			"lock.grant_rejected", `{"key":"k","owner":"o2","held_token":9}`},
		{core.Release("k", 9), core.Result{Kind: core.ResultReleased},
			"lock.released", `{"key":"k","token":9}`},
		{core.Release("k", 8), core.Result{Kind: core.ResultNotFound},
			"lock.release_unknown", `{"key":"k","token":8}`},
		{core.Expire("k", 9), core.Result{Kind: core.ResultExpired, Existed: true},
			"lock.expired", `{"key":"k","token":9}`},
		{core.Expire("k", 9), core.Result{Kind: core.ResultExpired},
			"lock.expire_stale", `{"key":"k","token":9}`},
		{core.Command{Kind: core.KindControl}, core.Result{Kind: core.ResultNoop},
			"command.applied", `{"kind":"control","result":"noop"}`},
	} {
		evs, err := p.OnApplied(ctx, 42, tc.cmd, tc.res)
		if err != nil {
			t.Fatalf("OnApplied(%v, %v): %v", tc.cmd.Kind, tc.res, err)
		}
		want := []Event{{Type: tc.typ, Data: json.RawMessage(tc.data), Index: 42, Plugin: "audit"}}
		if fmt.Sprint(evs) != fmt.Sprint(want) {
			t.Errorf("OnApplied(%v, %v) =\n %s\nwant\n %s", tc.cmd.Kind, tc.res, evs, want)
		}
	}
}

// wantFailClosed checks the fail-closed contract of ValidateGrant.
func wantFailClosed(t *testing.T, v Verdict, err error, sentinel error) *CallError {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	if v.Allow || !strings.HasPrefix(v.Reason, "plugin error: ") {
		t.Fatalf("verdict = %+v, want a deny with reason \"plugin error: ...\"", v)
	}
	var ce *CallError
	if !errors.As(err, &ce) {
		t.Fatalf("err %T is not a *CallError", err)
	}
	if !strings.HasPrefix(err.Error(), "plugins: ") {
		t.Errorf("err %q lacks the plugins: prefix", err)
	}
	return ce
}

// wantAllows checks that the plugin is usable (a fresh instance after a
// failure).
func wantAllows(t *testing.T, p *Plugin, key string) {
	t.Helper()
	v, err := p.ValidateGrant(ctx, Grant{Key: key, Owner: "owner", Identity: "", LeaseMS: 1000})
	if err != nil || !v.Allow {
		t.Fatalf("ValidateGrant(%q) after a failure = %+v, %v; want allow", key, v, err)
	}
}

func TestTrapFailsClosed(t *testing.T) {
	p := load(t, "trap", Config{})
	for _, key := range []string{"panic", "nil", "exit"} {
		v, err := p.ValidateGrant(ctx, Grant{Key: key, Owner: "owner", Identity: "", LeaseMS: 1000})
		ce := wantFailClosed(t, v, err, ErrPluginTrap)
		if errors.Is(err, ErrPluginTimeout) || errors.Is(err, ErrPluginABI) {
			t.Errorf("%s: err %v matches another sentinel", key, err)
		}
		if key == "panic" && !strings.Contains(ce.Stderr, "boom: trap guest asked to panic") {
			t.Errorf("stderr = %q, want the panic message", ce.Stderr)
		}
		if strings.Contains(v.Reason, "boom") {
			t.Errorf("reason %q leaks guest output", v.Reason)
		}
		wantAllows(t, p, "fine")
	}
	// The audit hook fails the same way and recovers too.
	if _, err := p.OnApplied(ctx, 1, core.Release("panic", 1), core.Result{Kind: core.ResultNotFound}); !errors.Is(err, ErrPluginTrap) {
		t.Fatalf("OnApplied trap: err = %v, want ErrPluginTrap", err)
	}
	if evs, err := p.OnApplied(ctx, 2, core.Release("fine", 1), core.Result{Kind: core.ResultNotFound}); err != nil || len(evs) != 1 {
		t.Fatalf("OnApplied after trap = %v, %v", evs, err)
	}
}

func TestInfiniteLoopIsCutOff(t *testing.T) {
	const timeout = 50 * time.Millisecond
	p := load(t, "loop", Config{CallTimeout: timeout})
	start := time.Now()
	v, err := p.ValidateGrant(ctx, Grant{Key: "loop", Owner: "owner", Identity: "", LeaseMS: 1000})
	elapsed := time.Since(start)
	wantFailClosed(t, v, err, ErrPluginTimeout)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v does not match context.DeadlineExceeded", err)
	}
	if elapsed < timeout || elapsed > timeout+2*time.Second {
		t.Errorf("cut off after %v, want about %v", elapsed, timeout)
	}
	t.Logf("cut off after %v (deadline %v)", elapsed, timeout)
	wantAllows(t, p, "fine")

	// A caller's deadline shorter than CallTimeout wins.
	p2 := load(t, "loop", Config{CallTimeout: time.Minute})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	v, err = p2.ValidateGrant(cctx, Grant{Key: "loop", Owner: "owner", Identity: "", LeaseMS: 1000})
	wantFailClosed(t, v, err, ErrPluginTimeout)
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("caller deadline honoured only after %v", elapsed)
	}
	if _, err := p.OnApplied(ctx, 1, core.Release("loop", 1), core.Result{Kind: core.ResultNotFound}); !errors.Is(err, ErrPluginTimeout) {
		t.Fatalf("OnApplied loop: err = %v, want ErrPluginTimeout", err)
	}
}

func TestCanceledContext(t *testing.T) {
	p := load(t, "ownerprefix", Config{})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	v, err := p.ValidateGrant(cctx, Grant{Key: "payments/x", Owner: "svc-payments-1", Identity: "", LeaseMS: 1000})
	wantFailClosed(t, v, err, ErrCanceled)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err %v does not match context.Canceled", err)
	}

	// Canceled while running.
	lp := load(t, "loop", Config{CallTimeout: time.Minute})
	cctx, cancel = context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	v, err = lp.ValidateGrant(cctx, Grant{Key: "loop", Owner: "owner", Identity: "", LeaseMS: 1000})
	wantFailClosed(t, v, err, ErrCanceled)
	wantAllows(t, lp, "fine")
}

func TestMemoryBomb(t *testing.T) {
	// The test CallTimeout (not the 50ms default) lets the guest reach the
	// memory limit however loaded the machine is.
	p := load(t, "membomb", Config{MemoryLimitPages: 256})
	start := time.Now()
	v, err := p.ValidateGrant(ctx, Grant{Key: "bomb", Owner: "owner", Identity: "", LeaseMS: 1000})
	ce := wantFailClosed(t, v, err, ErrPluginMemory)
	if !errors.Is(err, ErrPluginTrap) {
		t.Errorf("err %v does not also match ErrPluginTrap", err)
	}
	t.Logf("memory bomb stopped after %v: %v; stderr %q", time.Since(start), err, firstLine(ce.Stderr))
	wantAllows(t, p, "fine")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func TestBadABIResponses(t *testing.T) {
	p := load(t, "badabi", Config{})
	for _, tc := range []struct{ key, detail string }{
		{"oob", "outside the"},
		{"huge", "the limit is 65536"},
		{"empty", "empty response"},
		{"json", "not a verdict"},
		{"unknown", `unknown field "extra"`},
		{"noallow", `no "allow" field`},
		{"trailing", "trailing data"},
		{"longreason", "the limit is 256"},
		{"error", "cannot think today"},
		{"array", "not a verdict"},
	} {
		v, err := p.ValidateGrant(ctx, Grant{Key: tc.key, Owner: "owner", Identity: "", LeaseMS: 1000})
		ce := wantFailClosed(t, v, err, ErrPluginABI)
		if !strings.Contains(ce.Detail, tc.detail) {
			t.Errorf("%s: detail %q, want it to mention %q", tc.key, ce.Detail, tc.detail)
		}
		wantAllows(t, p, "ok")
	}
}

func TestBadABIEvents(t *testing.T) {
	p := load(t, "badabi", Config{Name: "bad"})
	for _, tc := range []struct{ key, detail string }{
		{"many", "the limit is 16"},
		{"badtype", "outside [A-Za-z0-9._-]"},
		{"emptytype", "want 1..64"},
		{"array", "not a JSON object"},
		{"string", "not a JSON object"},
		{"noevents", `no "events" field`},
	} {
		evs, err := p.OnApplied(ctx, 5, core.Release(tc.key, 1), core.Result{Kind: core.ResultReleased})
		var ce *CallError
		if !errors.As(err, &ce) || ce.Err != ErrPluginABI || evs != nil {
			t.Fatalf("%s: OnApplied = %v, %v; want ErrPluginABI", tc.key, evs, err)
		}
		if !strings.Contains(ce.Detail, tc.detail) {
			t.Errorf("%s: detail %q, want it to mention %q", tc.key, ce.Detail, tc.detail)
		}
	}
	evs, err := p.OnApplied(ctx, 6, core.Release("nulldata", 1), core.Result{Kind: core.ResultReleased})
	if err != nil || len(evs) != 1 || string(evs[0].Data) != "{}" {
		t.Fatalf("null data: %v, %v; want one event with {}", evs, err)
	}
	evs, err = p.OnApplied(ctx, 7, core.Release("ok", 1), core.Result{Kind: core.ResultReleased})
	want := []Event{{Type: "test.ok", Data: json.RawMessage(`{"a":1}`), Index: 7, Plugin: "bad"}}
	if err != nil || fmt.Sprint(evs) != fmt.Sprint(want) {
		t.Fatalf("ok: %s, %v; want %s (data compacted)", evs, err, want)
	}
}

func TestNoHook(t *testing.T) {
	op := load(t, "ownerprefix", Config{})
	if _, err := op.OnApplied(ctx, 1, core.Release("k", 1), core.Result{Kind: core.ResultReleased}); !errors.Is(err, ErrNoHook) {
		t.Errorf("OnApplied on a policy-only plugin: %v, want ErrNoHook", err)
	}
	au := load(t, "audit", Config{})
	v, err := au.ValidateGrant(ctx, Grant{Key: "k", Owner: "o", Identity: "", LeaseMS: 1000})
	if !errors.Is(err, ErrNoHook) || v.Allow {
		t.Errorf("ValidateGrant on an audit-only plugin: %+v, %v; want deny and ErrNoHook", v, err)
	}
}

func TestDeterminism(t *testing.T) {
	// Two separate Loads (separate runtimes, separate instances; the
	// machine code comes from the shared cache) must agree on every
	// input, call after call.
	wasm := guest(t, "ownerprefix")
	a, b := loadBytes(t, wasm, Config{}), loadBytes(t, wasm, Config{MaxInstances: 1})
	owners := []string{"", "svc-payments-1", "svc-refunds-1", "svc-inventory-1", "x"}
	keys := []string{"payments/a", "payments/refunds/b", "inventory/c", "other/d"}
	for round := 0; round < 3; round++ {
		for _, k := range keys {
			for _, o := range owners {
				va, errA := a.ValidateGrant(ctx, Grant{Key: k, Owner: o, Identity: "", LeaseMS: 1000})
				vb, errB := b.ValidateGrant(ctx, Grant{Key: k, Owner: o, Identity: "", LeaseMS: 1000})
				if va != vb || errA != nil || errB != nil {
					t.Fatalf("ValidateGrant(%q, %q): %+v, %v vs %+v, %v", k, o, va, errA, vb, errB)
				}
			}
		}
	}
	aw := guest(t, "audit")
	x, y := loadBytes(t, aw, Config{Name: "audit"}), loadBytes(t, aw, Config{Name: "audit"})
	for i := uint64(1); i <= 20; i++ {
		cmd, res := core.Grant(fmt.Sprintf("k%d", i), "o", 1000, i*7), core.Result{Kind: core.ResultGranted, Token: i}
		ex, errX := x.OnApplied(ctx, i, cmd, res)
		ey, errY := y.OnApplied(ctx, i, cmd, res)
		if fmt.Sprint(ex) != fmt.Sprint(ey) || errX != nil || errY != nil {
			t.Fatalf("OnApplied(%d): %s, %v vs %s, %v", i, ex, errX, ey, errY)
		}
	}
}

func TestConcurrentValidateGrant(t *testing.T) {
	p := load(t, "ownerprefix", Config{MaxInstances: 3})
	tp := load(t, "trap", Config{MaxInstances: 2})
	const goroutines, calls = 16, 32
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				owner := "svc-payments-1"
				if (g+i)%3 == 0 {
					owner = "intruder"
				}
				v, err := p.ValidateGrant(ctx, Grant{Key: "payments/k", Owner: owner, Identity: "", LeaseMS: 1000})
				if err != nil || v.Allow != (owner != "intruder") {
					errs <- fmt.Errorf("ownerprefix %q: %+v, %v", owner, v, err)
					return
				}
				// Traps interleaved with good calls: instances are
				// discarded and replaced under contention.
				key := "fine"
				if i%8 == 0 {
					key = "panic"
				}
				v, err = tp.ValidateGrant(ctx, Grant{Key: key, Owner: "o", Identity: "", LeaseMS: 1000})
				if (key == "panic") != errors.Is(err, ErrPluginTrap) || v.Allow != (key == "fine") {
					errs <- fmt.Errorf("trap %q: %+v, %v", key, v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(p.slots); n > 3 {
		t.Errorf("%d live instances, the cap is 3", n)
	}
}

func TestSHA256Stable(t *testing.T) {
	wasm := guest(t, "ownerprefix")
	sum := sha256.Sum256(wasm)
	want := hex.EncodeToString(sum[:])
	a, b := loadBytes(t, wasm, Config{}), loadBytes(t, wasm, Config{})
	if a.SHA256() != want || b.SHA256() != want {
		t.Fatalf("SHA256 = %s, %s; want %s", a.SHA256(), b.SHA256(), want)
	}
	if a.Name() != "sha256:"+want[:12] {
		t.Errorf("default Name = %q", a.Name())
	}
	if c := load(t, "audit", Config{}); c.SHA256() == want {
		t.Errorf("two different modules share a SHA256")
	}
	// Rebuilding from the same source gives the same module.
	again, err := buildGuest(ctx, "ownerprefix-again", guestDirs["ownerprefix"])
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(again); hex.EncodeToString(sum[:]) != want {
		t.Errorf("rebuilding ownerprefix changed its SHA256")
	}
}

func TestClose(t *testing.T) {
	p := load(t, "ownerprefix", Config{})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	v, err := p.ValidateGrant(ctx, Grant{Key: "payments/x", Owner: "svc-payments-1", Identity: "", LeaseMS: 1000})
	wantFailClosed(t, v, err, ErrClosed)
}

func TestSet(t *testing.T) {
	op := load(t, "ownerprefix", Config{Name: "ownerprefix"})
	au := load(t, "audit", Config{Name: "audit"})
	tp := load(t, "trap", Config{Name: "trap"})

	if v, err := NewSet().ValidateGrant(ctx, Grant{Key: "k", Owner: "o", Identity: "", LeaseMS: 1000}); err != nil || !v.Allow {
		t.Errorf("empty set: %+v, %v; want allow", v, err)
	}
	s := NewSet(au, op, tp)
	if v, err := s.ValidateGrant(ctx, Grant{Key: "payments/x", Owner: "svc-payments-1", Identity: "", LeaseMS: 1000}); err != nil || !v.Allow {
		t.Errorf("all allow: %+v, %v", v, err)
	}
	if v, err := s.ValidateGrant(ctx, Grant{Key: "payments/x", Owner: "intruder", Identity: "", LeaseMS: 1000}); err != nil || v.Allow || !strings.Contains(v.Reason, "svc-payments-") {
		t.Errorf("ownerprefix denies: %+v, %v", v, err)
	}
	v, err := s.ValidateGrant(ctx, Grant{Key: "panic", Owner: "o", Identity: "", LeaseMS: 1000})
	wantFailClosed(t, v, err, ErrPluginTrap)
	if !strings.Contains(v.Reason, "trap") {
		t.Errorf("reason %q does not name the failing plugin", v.Reason)
	}

	evs, err := s.OnApplied(ctx, 3, core.Release("k", 4), core.Result{Kind: core.ResultReleased})
	if err != nil || len(evs) != 2 || evs[0].Plugin != "audit" || evs[1].Plugin != "trap" {
		t.Fatalf("OnApplied = %s, %v; want audit's then trap's event", evs, err)
	}
	evs, err = s.OnApplied(ctx, 4, core.Release("panic", 4), core.Result{Kind: core.ResultNotFound})
	if !errors.Is(err, ErrPluginTrap) || len(evs) != 1 || evs[0].Type != "lock.release_unknown" {
		t.Fatalf("OnApplied with a failing plugin = %s, %v; want audit's event and ErrPluginTrap", evs, err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{MemoryLimitPages: 65537},
		{CallTimeout: -1},
		{InitTimeout: -1},
		{MaxInstances: -1},
	} {
		if _, err := Load(ctx, rawAllowModule().encode(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Load(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
}

// The SDK's copy of the limits must match the host's.
func TestSDKConstantsMatch(t *testing.T) {
	for _, c := range []struct {
		name      string
		host, sdk int
	}{
		{"ABIVersion", ABIVersion, sdk.ABIVersion},
		{"MaxResponseBytes", MaxResponseBytes, sdk.MaxResponseBytes},
		{"MaxReasonBytes", MaxReasonBytes, sdk.MaxReasonBytes},
		{"MaxEvents", MaxEvents, sdk.MaxEvents},
		{"MaxEventTypeBytes", MaxEventTypeBytes, sdk.MaxEventTypeBytes},
		{"HookValidateGrant", int(hookValidateGrant), int(sdk.HookValidateGrant)},
		{"HookOnApplied", int(hookOnApplied), int(sdk.HookOnApplied)},
	} {
		if c.host != c.sdk {
			t.Errorf("%s: host %d, sdk %d", c.name, c.host, c.sdk)
		}
	}
}

func grantFixture() (core.Command, core.Result) {
	return core.Grant("payments/invoice-7", "svc-payments-api-1", 1500, 1_700_000_000_000),
		core.Result{Kind: core.ResultGranted, Token: 1234}
}

// The authenticated identity reaches validate_grant; a request without one
// carries "" (what a module built before the field never reads anyway:
// guests skip fields they do not know, TestDecodersMatchEncodingJSON).
func TestValidateGrantSeesIdentity(t *testing.T) {
	p := load(t, "trap", Config{Name: "trap"})
	for _, id := range []string{"TENANT_A/alice", ""} {
		v, err := p.ValidateGrant(ctx, Grant{Key: "identity", Owner: "o", Identity: id, LeaseMS: 1000})
		if err != nil || v.Allow || v.Reason != "identity="+id {
			t.Fatalf("ValidateGrant with identity %q = %+v, %v; want a deny naming it", id, v, err)
		}
	}
}
