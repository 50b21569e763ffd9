package plugins

import (
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

func TestEncodeApplied(t *testing.T) {
	b, err := encodeApplied(42, core.Grant("k", "o\"<", 1500, 77), core.Result{Kind: core.ResultGranted, Token: 9})
	want := `{"index":42,"command":{"kind":"grant","key":"k","owner":"o\"\u003c","lease_ms":1500,"granted_at_ms":77,"token":0},` +
		`"result":{"kind":"granted","token":9,"existed":false}}`
	if err != nil || string(b) != want {
		t.Fatalf("encodeApplied = %s, %v\nwant %s", b, err, want)
	}
	// A control command is shown by its kind only, whatever else it holds.
	b, err = encodeApplied(7, core.Command{Kind: core.KindControl, Key: "secret", Owner: "secret", Token: 5}, core.Result{Kind: core.ResultNoop})
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
