package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

var tricky = []string{
	"", "plain", `quote " and \ backslash`, "tab\tnew\nline\rcr", "\b\f\x00\x01\x1f\x7f",
	"<html>&amp;</html>", "héllo wörld ☃ 𝄞", "\u2028\u2029", "bad \xff utf8 \xc3", "/slash/",
	strings.Repeat("x", 600),
}

// The hand-written encoders must produce exactly what encoding/json does.
func TestEncodersMatchEncodingJSON(t *testing.T) {
	for _, s := range tricky {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
		for _, v := range []Verdict{{Allow: true}, {Reason: s}, {Allow: true, Reason: s, Error: s}, {Error: s}} {
			want, _ := json.Marshal(v)
			if got := appendVerdict(nil, v); !bytes.Equal(got, want) {
				t.Errorf("appendVerdict(%+v) = %s, want %s", v, got, want)
			}
		}
		for _, r := range []appliedResponse{
			{}, {Events: []Event{}}, {Error: s},
			{Events: []Event{{Type: s}, {Type: "t", Data: json.RawMessage(`{"k":1}`)}, {Type: "f", Data: Fields{{"k", s}}}}},
		} {
			want, _ := json.Marshal(r)
			got, err := appendApplied(nil, r)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("appendApplied(%+v) = %s, %v; want %s", r, got, err, want)
			}
		}
	}
}

func TestFieldsEncoding(t *testing.T) {
	f := Fields{
		{"s", "a\"<b>"}, {"b", true}, {"i", -3}, {"i8", int8(-8)}, {"i16", int16(-16)}, {"i32", int32(-7)},
		{"i64", int64(math.MinInt64)}, {"u", uint(8)}, {"u8", uint8(8)}, {"u16", uint16(16)}, {"u32", uint32(7)},
		{"u64", uint64(math.MaxUint64)}, {"nil", nil}, {"list", []any{1, "x", nil, Fields{{"n", true}}}},
		{"raw", json.RawMessage(`{"r":[1]}`)}, {"nested", Fields{{"deep", Fields{}}}},
		{"f64", 1.5}, {"f64big", 1e21}, {"f64small", 1e-7}, {"f64neg", -0.000001}, {"f32", float32(3.25)},
		{"f32big", float32(1e22)}, {"zero", 0.0},
	}
	got, err := json.Marshal(f)
	// encoding/json's encoding of the same object, as a map keeps no order:
	// compare member by member through a decode.
	var fromFields, fromJSON map[string]any
	if err != nil || json.Unmarshal(got, &fromFields) != nil {
		t.Fatalf("Fields = %s, %v", got, err)
	}
	plain := map[string]any{}
	for _, fl := range f {
		plain[fl.Name] = fl.Value
	}
	want, _ := json.Marshal(plain)
	_ = json.Unmarshal(want, &fromJSON)
	if fmt.Sprint(fromFields) != fmt.Sprint(fromJSON) {
		t.Fatalf("Fields = %s\nencoding/json = %s", got, want)
	}
	// Scalars must be byte-identical to encoding/json.
	for _, fl := range f {
		if _, ok := fl.Value.(Fields); ok {
			continue
		}
		if _, ok := fl.Value.([]any); ok {
			continue
		}
		w, _ := json.Marshal(fl.Value)
		g, err := appendValue(nil, fl.Value)
		if err != nil || !bytes.Equal(g, w) {
			t.Errorf("%s: appendValue = %s, %v; encoding/json %s", fl.Name, g, err, w)
		}
	}
	for _, bad := range []any{make(chan int), math.NaN(), math.Inf(1), map[string]int{}, []int{1}, struct{}{}} {
		if _, err := appendValue(nil, bad); err == nil {
			t.Errorf("appendValue(%T) succeeded", bad)
		}
	}
	out, err := appendApplied(nil, appliedResponse{Events: []Event{{Type: "x", Data: f}}})
	if err != nil || string(out) != `{"events":[{"type":"x","data":`+string(got)+`}]}` {
		t.Fatalf("appendApplied with Fields = %s, %v", out, err)
	}
	if _, err := (Fields{{"c", make(chan int)}}).MarshalJSON(); err == nil {
		t.Fatal("Fields with a channel encoded")
	}
}

// The hand-written decoders must agree with encoding/json on whatever the
// host sends, and fall back to it for anything else.
func TestDecodersMatchEncodingJSON(t *testing.T) {
	var inputs []string
	for _, s := range tricky {
		g, _ := json.Marshal(GrantRequest{Key: s, Owner: s + "!", Identity: "ACC/" + s, LeaseMS: 12345, Limit: 8, Mode: s})
		a, _ := json.Marshal(Applied{Index: 9, Command: Command{Kind: "grant", Key: s, Owner: s, LeaseMS: 1, GrantedAtMS: 2, Token: 3, Limit: math.MaxUint32, Mode: s},
			Result: Result{Kind: "granted", Token: math.MaxUint64, Existed: true, Limit: 1024}})
		inputs = append(inputs, string(g), string(a))
	}
	inputs = append(inputs,
		`{}`, ` { "key" : "k" , "owner":null, "lease_ms": 0 } `, `{"KEY":"upper"}`, `{"key":"a","key":"b"}`,
		`{"future":{"x":[1,2.5e3,-1,{"y":null}],"z":true},"key":"k"}`, `{"lease_ms":-1}`, `{"lease_ms":1.5}`,
		`{"lease_ms":18446744073709551616}`, `{"lease_ms":012}`, `{"key":"\ud834\udd1e \u00e9 \u0041"}`, `{"key":"\ud834"}`, `{"key":"\ud834\u0041"}`, `{"key":"\udd1e\ud834\udd1e"}`, `{"key":"\ud834\ud834\udd1e"}`,
		"{\"key\":\"bad \xff\\n \xc3\"}", "{\"key\":\"\xed\xa0\x80\"}", `{"key":"\u12"}`, `{"key":"\x"}`, `{"n":-0.5e+3}`, `{"n":-}`, `{"n":1.}`, `{"n":1e}`, `{"n":01}`, `{"n":-01}`,
		`{"key":"unterminated}`, `{"key":1}`, `[]`, `null`, `{"key":"k"} trailing`, `{"key":"k",}`, `{"key":"\x01"}`,
		`{"index":1,"command":null,"result":{"existed":false,"kind":"expired"}}`, `{"command":{"kind":"release","token":"7"}}`,
		`{"limit":4294967295,"mode":"shared"}`, `{"limit":4294967296}`, `{"limit":-1}`, `{"limit":null,"mode":null}`, `{"LIMIT":3,"Mode":"x"}`,
		`{"limit":3,"limit":99999999999}`, `{"mode":3}`, `{"command":{"limit":4294967296}}`, `{"result":{"kind":"limit_mismatch","limit":5}}`,
	)
	for _, in := range inputs {
		var wantG GrantRequest
		wantErr := json.Unmarshal([]byte(in), &wantG)
		gotG, gotErr := decodeGrantRequest([]byte(in))
		if (wantErr != nil) != (gotErr != nil) || (wantErr == nil && gotG != wantG) {
			t.Errorf("decodeGrantRequest(%s) = %+v, %v; encoding/json: %+v, %v", in, gotG, gotErr, wantG, wantErr)
		}
		var wantA Applied
		wantErr = json.Unmarshal([]byte(in), &wantA)
		gotA, gotErr := decodeApplied([]byte(in))
		if (wantErr != nil) != (gotErr != nil) || (wantErr == nil && gotA != wantA) {
			t.Errorf("decodeApplied(%s) = %+v, %v; encoding/json: %+v, %v", in, gotA, gotErr, wantA, wantErr)
		}
	}
}

func FuzzDecodeApplied(f *testing.F) {
	f.Add(`{"index":1,"command":{"kind":"grant","key":"k","owner":"o","lease_ms":1,"granted_at_ms":2,"token":0},"result":{"kind":"granted","token":3,"existed":false}}`)
	f.Add(`{"index":1,"command":{"kind":"grant","key":"k","owner":"o","lease_ms":1,"granted_at_ms":2,"token":0,"limit":3,"mode":"exclusive"},"result":{"kind":"limit_mismatch","token":3,"existed":false,"limit":5}}`)
	f.Fuzz(func(t *testing.T, in string) {
		var want Applied
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := decodeApplied([]byte(in))
		if (wantErr != nil) != (err != nil) || (err == nil && got != want) {
			t.Fatalf("decodeApplied(%q) = %+v, %v; encoding/json: %+v, %v", in, got, err, want, wantErr)
		}
	})
}

func FuzzDecodeGrantRequest(f *testing.F) {
	f.Add(`{"key":"k","owner":"o","lease_ms":1000}`)
	f.Add(`{"key":"\u00e9\n","owner":"","lease_ms":0,"x":[{}]}`)
	f.Add(`{"key":"k","owner":"o","identity":"TENANT_A/alice","lease_ms":1000}`)
	f.Add(`{"key":"k","owner":"o","identity":"","lease_ms":1000,"limit":8,"mode":"shared"}`)
	f.Add(`{"key":"k","limit":4294967296,"mode":null}`)
	f.Fuzz(func(t *testing.T, in string) {
		var want GrantRequest
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := decodeGrantRequest([]byte(in))
		if (wantErr != nil) != (err != nil) || (err == nil && got != want) {
			t.Fatalf("decodeGrantRequest(%q) = %+v, %v; encoding/json: %+v, %v", in, got, err, want, wantErr)
		}
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendString(%q) = %s, want %s", s, got, want)
		}
	})
}

func TestDispatch(t *testing.T) {
	defer func() { grantHandler, appliedHandler = nil, nil }()
	grantHandler, appliedHandler = nil, nil
	if hooks() != 0 {
		t.Fatalf("hooks() = %d with no handlers", hooks())
	}
	if got := string(validateGrantJSON(nil, []byte(`{}`))); !strings.Contains(got, `"error":"sdk: no validate_grant handler`) {
		t.Errorf("no handler: %s", got)
	}
	if got := string(onAppliedJSON(nil, []byte(`{}`))); !strings.Contains(got, `"error":"sdk: no on_applied handler`) {
		t.Errorf("no handler: %s", got)
	}

	HandleValidateGrant(func(r GrantRequest) Verdict {
		if r.Owner == "" {
			return Deny(strings.Repeat("é", 200)) // 400 bytes: truncated on a rune boundary
		}
		return Allow()
	})
	HandleOnApplied(func(a Applied) []Event {
		if a.Command.Key == "none" {
			return nil
		}
		return []Event{{Type: "lock." + a.Result.Kind, Data: Fields{{"key", a.Command.Key}, {"index", a.Index}}}}
	})
	if hooks() != HookValidateGrant|HookOnApplied {
		t.Fatalf("hooks() = %d", hooks())
	}
	if got := string(validateGrantJSON(nil, []byte(`{"key":"k","owner":"o","lease_ms":5}`))); got != `{"allow":true}` {
		t.Errorf("allow: %s", got)
	}
	var v Verdict
	if err := json.Unmarshal(validateGrantJSON(nil, []byte(`{"key":"k"}`)), &v); err != nil || v.Allow || len(v.Reason) != 256 {
		t.Errorf("deny: %+v (%d bytes), %v", v, len(v.Reason), err)
	}
	if got := string(validateGrantJSON(nil, []byte(`not json`))); !strings.Contains(got, `"error":"sdk: cannot decode request`) {
		t.Errorf("bad request: %s", got)
	}
	in := `{"index":4,"command":{"kind":"release","key":"k","owner":"","lease_ms":0,"granted_at_ms":0,"token":7},"result":{"kind":"released","token":0,"existed":false}}`
	if got := string(onAppliedJSON(nil, []byte(in))); got != `{"events":[{"type":"lock.released","data":{"key":"k","index":4}}]}` {
		t.Errorf("events: %s", got)
	}
	if got := string(onAppliedJSON(nil, []byte(`{"command":{"key":"none"}}`))); got != `{"events":[]}` {
		t.Errorf("no events: %s", got)
	}
	HandleOnApplied(func(Applied) []Event { return []Event{{Type: "x", Data: Fields{{"c", make(chan int)}}}} })
	if got := string(onAppliedJSON(nil, []byte(`{}`))); !strings.Contains(got, `"error":"sdk: cannot encode events`) {
		t.Errorf("unencodable data: %s", got)
	}
}
