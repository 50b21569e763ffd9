package plugins

import (
	"context"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// TestABIVersionsAndKinds: a module of ABI version 1 still loads and
// decides, and gets the version-1 requests whatever the lock's kind (the
// abi1 guest denies, or emits abi1.unexpected, on any member version 1
// did not have); a module of version 2, built with the SDK, sees limit and
// mode and decides on them.
func TestABIVersionsAndKinds(t *testing.T) {
	ctx := context.Background()
	old := load(t, "abi1", Config{Name: "abi1"})
	pol := load(t, "kinds", Config{Name: "kinds"})
	if old.ABIVersion() != 1 || pol.ABIVersion() != 2 {
		t.Fatalf("ABI versions %d and %d, want 1 and 2", old.ABIVersion(), pol.ABIVersion())
	}
	shared, sem := core.ModeShared, core.ModeExclusive
	for _, tc := range []struct {
		p      *Plugin
		g      Grant
		reason string // "" for allow
	}{
		{old, Grant{Key: "k", Owner: "o", LeaseMS: 1000}, ""},
		{old, Grant{Key: "k", Owner: "o", LeaseMS: 1000, Limit: 1024, Mode: sem}, ""},
		{old, Grant{Key: "exclusive/k", Owner: "o", Identity: "A", LeaseMS: 1000, Mode: shared}, ""},
		{old, Grant{Key: "deny/k", Owner: "o", LeaseMS: 1000, Limit: 3}, "abi1: keys under deny/ are refused"},
		{pol, Grant{Key: "k", LeaseMS: 1000}, ""},
		{pol, Grant{Key: "k", LeaseMS: 1000, Limit: 8}, ""},
		{pol, Grant{Key: "k", LeaseMS: 1000, Limit: 9}, "semaphores are limited to 8 holders"},
		{pol, Grant{Key: "exclusive/k", LeaseMS: 1000}, ""},
		{pol, Grant{Key: "exclusive/k", LeaseMS: 1000, Mode: shared}, "keys under exclusive/ are exclusive only"},
		{pol, Grant{Key: "reports/k", LeaseMS: 1000, Mode: shared}, ""},
	} {
		v, err := tc.p.ValidateGrant(ctx, tc.g)
		if err != nil || v.Allow != (tc.reason == "") || v.Reason != tc.reason {
			t.Errorf("%s %+v = %+v, %v; want reason %q", tc.p.Name(), tc.g, v, err, tc.reason)
		}
	}
	rel := core.Release("k", 9)
	rel.Limit = 3 // as the audit publisher fills it in
	for _, a := range []struct {
		cmd core.Command
		res core.Result
	}{
		{core.Grant("k", "o", 1000, 0).WithKind(3, core.ModeExclusive), core.Result{Kind: core.ResultLimitMismatch, Limit: 5, Token: 2}},
		{rel, core.Result{Kind: core.ResultReleased}},
	} {
		evs, err := old.OnApplied(ctx, 7, a.cmd, a.res)
		if err != nil || len(evs) != 1 || evs[0].Type != "abi1.applied" {
			t.Errorf("abi1 OnApplied(%v, %v) = %v, %v; want one abi1.applied", a.cmd, a.res, evs, err)
		}
	}
	// The version-2 module sees the holder's kind on a release too.
	evs, err := pol.OnApplied(ctx, 8, rel, core.Result{Kind: core.ResultReleased})
	if err != nil || len(evs) != 1 || evs[0].Type != "kinds.release" || string(evs[0].Data) != `{"key":"k","token":9,"limit":3,"mode":"exclusive"}` {
		t.Errorf("kinds OnApplied(release of a slot) = %v, %v", evs, err)
	}
	if evs, err := pol.OnApplied(ctx, 9, core.Release("m", 4), core.Result{Kind: core.ResultReleased}); err != nil || len(evs) != 0 {
		t.Errorf("kinds OnApplied(release of a mutex) = %v, %v; want none", evs, err)
	}
	// The set asks both: the version-1 module's deny still counts.
	s := NewSet(old, pol)
	for g, want := range map[Grant]string{
		{Key: "deny/k", Limit: 4}:            "abi1:",
		{Key: "k", Limit: 16}:                "limited to 8",
		{Key: "exclusive/k", Mode: shared}:   "exclusive only",
		{Key: "k", Limit: 4, LeaseMS: 1000}:  "",
		{Key: "k", Mode: shared, Owner: "o"}: "",
	} {
		v, err := s.ValidateGrant(ctx, g)
		if err != nil || v.Allow != (want == "") || !strings.Contains(v.Reason, want) {
			t.Errorf("set %+v = %+v, %v; want %q", g, v, err, want)
		}
	}
}

// TestAuditSettleEventMatchesRelease: the audit example, run as the wasm
// module it is built into, turns a Settle that released a holder into the
// event a Release of that holder gives (lock.released with its key and
// token, and the holder's limit or mode, which the audit publisher fills
// in for both from what the node read at apply), for a semaphore slot, a
// shared hold and a mutex. A Settle names no token: the released one is
// its result's.
func TestAuditSettleEventMatchesRelease(t *testing.T) {
	au := load(t, "audit", Config{Name: "audit"})
	for _, k := range []struct {
		name  string
		limit uint32
		mode  core.Mode
		data  string
	}{
		{"semaphore slot", 4, core.ModeExclusive, `{"key":"k","token":9,"limit":4}`},
		{"shared hold", 0, core.ModeShared, `{"key":"k","token":9,"mode":"shared"}`},
		{"mutex", 0, core.ModeExclusive, `{"key":"k","token":9}`},
	} {
		rel, settle := core.Release("k", 9), core.Settle("k", "A", "r1", 5)
		rel.Limit, rel.Mode = k.limit, k.mode // as the audit publisher fills them in
		settle.Limit, settle.Mode = k.limit, k.mode
		re, err := au.OnApplied(ctx, 10, rel, core.Result{Kind: core.ResultReleased})
		if err != nil || len(re) != 1 {
			t.Fatalf("%s: release: %v, %v", k.name, re, err)
		}
		se, err := au.OnApplied(ctx, 10, settle, core.Result{Kind: core.ResultReleased, Token: 9})
		if err != nil || len(se) != 1 {
			t.Fatalf("%s: settle: %v, %v", k.name, se, err)
		}
		if re[0].Type != "lock.released" || string(re[0].Data) != k.data {
			t.Errorf("%s: release event %s %s, want lock.released %s", k.name, re[0].Type, re[0].Data, k.data)
		}
		if se[0].Type != re[0].Type || string(se[0].Data) != string(re[0].Data) {
			t.Errorf("%s: settle event %s %s, release event %s %s; want the same", k.name, se[0].Type, se[0].Data, re[0].Type, re[0].Data)
		}
	}
}
