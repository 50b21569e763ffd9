package plugins

import (
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

func TestEncodeApplied(t *testing.T) {
	b, err := encodeApplied(1, 42, core.Grant("k", "o\"<", 1500, 77), core.Result{Kind: core.ResultGranted, Token: 9})
	want := `{"index":42,"command":{"kind":"grant","key":"k","owner":"o\"\u003c","lease_ms":1500,"granted_at_ms":77,"token":0},` +
		`"result":{"kind":"granted","token":9,"existed":false}}`
	if err != nil || string(b) != want {
		t.Fatalf("encodeApplied = %s, %v\nwant %s", b, err, want)
	}
	// A control command is shown by its kind only, whatever else it holds.
	b, err = encodeApplied(1, 7, core.Command{Kind: core.KindControl, Key: "secret", Owner: "secret", Token: 5}, core.Result{Kind: core.ResultNoop})
	if err != nil || strings.Contains(string(b), "secret") || !strings.Contains(string(b), `"kind":"control","key":"","owner":"","lease_ms":0,"granted_at_ms":0,"token":0`) {
		t.Fatalf("control: %s, %v", b, err)
	}
}

func TestDecodeVerdict(t *testing.T) {
	for in, want := range map[string]Verdict{
		`{"allow":true}`:                         {Allow: true},
		` {"allow":false,"reason":"no"} `:        {Reason: "no"},
		`{"allow":false,"reason":"","error":""}`: {},
	} {
		if v, err := decodeVerdict([]byte(in)); err != nil || v != want {
			t.Errorf("decodeVerdict(%s) = %+v, %v; want %+v", in, v, err, want)
		}
	}
	for _, in := range []string{``, `null`, `{}`, `{"allow":1}`, `{"Allow":true,"allow":true,"x":0}`, `{"allow":true}x`, `{"allow":true,"error":"e"}`} {
		if v, err := decodeVerdict([]byte(in)); err == nil {
			t.Errorf("decodeVerdict(%s) = %+v, want an error", in, v)
		}
	}
}

func TestDecodeEvents(t *testing.T) {
	evs, err := decodeEvents([]byte(`{"events":[{"type":"a.b-c_D9"},{"type":"x","data":{ "k" : [1, 2] }}]}`), 3, "p")
	if err != nil || len(evs) != 2 || string(evs[0].Data) != "{}" || string(evs[1].Data) != `{"k":[1,2]}` || evs[1].Index != 3 || evs[1].Plugin != "p" {
		t.Fatalf("decodeEvents = %v, %v", evs, err)
	}
	if evs, err := decodeEvents([]byte(`{"events":[]}`), 3, "p"); err != nil || evs != nil {
		t.Fatalf("no events = %v, %v", evs, err)
	}
	long := strings.Repeat("t", MaxEventTypeBytes+1)
	for _, in := range []string{`{"events":[{"type":"` + long + `"}]}`, `{"events":[{"type":"é"}]}`, `{"events":[{"type":"x","data":1}]}`,
		`{"events":[{"type":"x","extra":1}]}`, `{"events":null}`, `{"events":[],"error":"e"}`} {
		if _, err := decodeEvents([]byte(in), 1, "p"); err == nil {
			t.Errorf("decodeEvents(%s) succeeded", in)
		}
	}
}

// A version-1 module gets exactly the version-1 requests, whatever the
// kind; a version-2 module gets the kind (the limit a Grant asks for, or
// the holder's for a Release the audit publisher filled in) and a
// limit_mismatch's current limit.
func TestEncodeKinds(t *testing.T) {
	g := Grant{Key: "k", Owner: "o", Identity: "A", LeaseMS: 1000, Limit: 3}
	for _, tc := range []struct {
		abi  uint32
		g    Grant
		want string
	}{
		{1, g, `{"key":"k","owner":"o","identity":"A","lease_ms":1000}`},
		{2, g, `{"key":"k","owner":"o","identity":"A","lease_ms":1000,"limit":3,"mode":"exclusive"}`},
		{2, Grant{Key: "k", Mode: core.ModeShared}, `{"key":"k","owner":"","identity":"","lease_ms":0,"limit":0,"mode":"shared"}`},
	} {
		if b, err := encodeGrant(tc.abi, tc.g); err != nil || string(b) != tc.want {
			t.Errorf("encodeGrant(%d, %+v) = %s, %v; want %s", tc.abi, tc.g, b, err, tc.want)
		}
	}
	rel := core.Release("k", 9)
	rel.Limit = 3
	mismatch := core.Result{Kind: core.ResultLimitMismatch, Limit: 5, Token: 4}
	for _, tc := range []struct {
		abi  uint32
		cmd  core.Command
		res  core.Result
		want string
	}{
		{1, rel, core.Result{Kind: core.ResultReleased}, `{"index":1,"command":{"kind":"release","key":"k","owner":"","lease_ms":0,"granted_at_ms":0,"token":9},"result":{"kind":"released","token":0,"existed":false}}`},
		{2, rel, core.Result{Kind: core.ResultReleased}, `{"index":1,"command":{"kind":"release","key":"k","owner":"","lease_ms":0,"granted_at_ms":0,"token":9,"limit":3,"mode":"exclusive"},"result":{"kind":"released","token":0,"existed":false,"limit":0}}`},
		{2, core.Grant("k", "o", 1000, 0).WithKind(3, core.ModeExclusive), mismatch,
			`{"index":1,"command":{"kind":"grant","key":"k","owner":"o","lease_ms":1000,"granted_at_ms":0,"token":0,"limit":3,"mode":"exclusive"},"result":{"kind":"limit_mismatch","token":4,"existed":false,"limit":5}}`},
		{2, core.Grant("k", "o", 1000, 0).WithKind(0, core.ModeShared), core.Result{Kind: core.ResultGranted, Token: 9},
			`{"index":1,"command":{"kind":"grant","key":"k","owner":"o","lease_ms":1000,"granted_at_ms":0,"token":0,"limit":0,"mode":"shared"},"result":{"kind":"granted","token":9,"existed":false,"limit":0}}`},
	} {
		if b, err := encodeApplied(tc.abi, 1, tc.cmd, tc.res); err != nil || string(b) != tc.want {
			t.Errorf("encodeApplied(%d, %v, %v) =\n%s, %v; want\n%s", tc.abi, tc.cmd, tc.res, b, err, tc.want)
		}
	}
}
