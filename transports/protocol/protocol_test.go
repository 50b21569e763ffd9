package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/plugins/audit"
)

func TestDecodeAcquire(t *testing.T) {
	cases := []struct {
		name string
		body string
		code Code // "" = accepted
	}{
		{"minimal", `{"key":"a","lease_ms":100}`, ""},
		{"full", `{"key":"a","owner":"w","lease_ms":1000,"wait_ms":500,"timeout_ms":2000}`, ""},
		{"whitespace", " \n{\"key\":\"a\",\"lease_ms\":100}\n ", ""},
		{"empty", ``, CodeMalformed},
		{"null", `null`, CodeMalformed},
		{"array", `[]`, CodeMalformed},
		{"truncated", `{"key":"a"`, CodeMalformed},
		{"trailing object", `{"key":"a","lease_ms":100}{}`, CodeMalformed},
		{"unknown field", `{"key":"a","lease_ms":100,"x":1}`, CodeMalformed},
		{"wrong type", `{"key":1,"lease_ms":100}`, CodeMalformed},
		{"float lease", `{"key":"a","lease_ms":1.5}`, CodeMalformed},
		{"huge lease", `{"key":"a","lease_ms":99999999999999999999}`, CodeMalformed},
		{"empty key", `{"key":"","lease_ms":100}`, CodeInvalidArgument},
		{"lease 99", `{"key":"a","lease_ms":99}`, CodeInvalidArgument},
		{"lease negative", `{"key":"a","lease_ms":-5}`, CodeInvalidArgument},
		{"lease over a day", `{"key":"a","lease_ms":86400001}`, CodeInvalidArgument},
		{"wait negative", `{"key":"a","lease_ms":100,"wait_ms":-1}`, CodeInvalidArgument},
		{"wait too long", `{"key":"a","lease_ms":100,"wait_ms":300001}`, CodeInvalidArgument},
		{"timeout below wait", `{"key":"a","lease_ms":100,"wait_ms":1000,"timeout_ms":999}`, CodeInvalidArgument},
		{"timeout negative", `{"key":"a","lease_ms":100,"timeout_ms":-1}`, CodeInvalidArgument},
		{"key NUL", `{"key":"a\u0000b","lease_ms":100}`, CodeInvalidArgument},
		{"too large", `{"key":"` + strings.Repeat("k", MaxRequestSize) + `","lease_ms":100}`, CodeTooLarge},
		// docs/protocol.md §2: what encoding/json alone would let through.
		{"key invalid byte", "{\"key\":\"bad\xff\",\"lease_ms\":100}", CodeInvalidArgument},
		{"key lone high surrogate", `{"key":"bad\ud800","lease_ms":100}`, CodeInvalidArgument},
		{"key lone low surrogate", `{"key":"bad\udc00","lease_ms":100}`, CodeInvalidArgument},
		{"key high surrogate then letter", `{"key":"bad\ud800x","lease_ms":100}`, CodeInvalidArgument},
		{"key two high surrogates", `{"key":"\ud800\ud800","lease_ms":100}`, CodeInvalidArgument},
		{"owner invalid byte", "{\"key\":\"a\",\"owner\":\"\xc3\",\"lease_ms\":100}", CodeInvalidArgument},
		{"surrogate pair", `{"key":"\ud83d\ude00","lease_ms":100}`, ""},
		{"escaped backslash then u", `{"key":"a\\ud800","lease_ms":100}`, ""},
		{"owner null", `{"key":"a","owner":null,"lease_ms":100}`, CodeMalformed},
		{"wait_id null", `{"key":"a","lease_ms":100,"wait_id":null}`, CodeMalformed},
		{"wait_ms null", `{"key":"a","lease_ms":100,"wait_ms":null}`, CodeMalformed},
		{"timeout_ms null", `{"key":"a","lease_ms":100,"timeout_ms":null}`, CodeMalformed},
		{"key null", `{"key":null,"lease_ms":100}`, CodeMalformed},
		{"other case", `{"key":"a","Lease_Ms":100}`, CodeMalformed},
		{"both cases", `{"lease_ms":1000,"Lease_Ms":100,"key":"a"}`, CodeMalformed},
		{"upper key", `{"KEY":"a","lease_ms":100}`, CodeMalformed},
		{"duplicate key", `{"key":"A","key":"B","lease_ms":100}`, CodeMalformed},
		{"duplicate lease", `{"key":"a","lease_ms":1000,"lease_ms":100}`, CodeMalformed},
		{"duplicate escaped name", `{"key":"a","lease_ms":1000,"lease\u005fms":100}`, CodeMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAcquire([]byte(tc.body))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != tc.code {
				t.Fatalf("got %v, want code %s", err, tc.code)
			}
		})
	}
}

func TestAcquireDefaults(t *testing.T) {
	r := AcquireRequest{Key: "a", LeaseMS: 1000, WaitMS: 3000}
	lease, wait, timeout, err := r.Validate()
	if err != nil {
		t.Fatal(err)
	}
	if lease != time.Second || wait != 3*time.Second || timeout != 3*time.Second+DefaultReplyMargin {
		t.Fatalf("lease %v wait %v timeout %v", lease, wait, timeout)
	}
}

func TestDecodeReleaseAndGet(t *testing.T) {
	if _, err := DecodeRelease([]byte(`{"key":"a","token":3}`)); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"key":"a","token":0}`, `{"key":"a"}`, `{"key":"","token":1}`} {
		if _, err := DecodeRelease([]byte(body)); !errors.Is(err, &Error{Code: CodeInvalidArgument}) {
			t.Errorf("%s: got %v, want invalid_argument", body, err)
		}
	}
	if _, err := DecodeRelease([]byte(`{"key":"a","token":-1}`)); !errors.Is(err, &Error{Code: CodeMalformed}) {
		t.Errorf("negative token: got %v", err)
	}
	if _, err := DecodeGet([]byte(`{"key":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeGet([]byte(`{"key":"a","token":1}`)); !errors.Is(err, &Error{Code: CodeMalformed}) {
		t.Errorf("unknown field on get: got %v", err)
	}
}

func TestParseReply(t *testing.T) {
	var ar AcquireReply
	if err := ParseReply([]byte(`{"key":"a","token":5,"lease_ms":100,"index":9}`), &ar); err != nil || ar.Token != 5 {
		t.Fatalf("%+v %v", ar, err)
	}
	err := ParseReply([]byte(`{"error":{"code":"held","message":"x"}}`), &ar)
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeHeld {
		t.Fatalf("got %v", err)
	}
	if err := ParseReply([]byte(`not json`), &ar); !errors.Is(err, ErrUnreadableReply) {
		t.Fatalf("got %v, want ErrUnreadableReply", err)
	}
	if c := CodeNotLeader; !c.Retryable() || CodeIndeterminate.Retryable() || CodeHeld.Retryable() {
		t.Fatal("retryable classification wrong")
	}
}

// FuzzDecodeRequests: no payload panics a decoder, and an accepted one is
// within every limit.
func FuzzDecodeRequests(f *testing.F) {
	for _, s := range []string{
		`{"key":"a","lease_ms":100}`,
		`{"key":"a","owner":"w","lease_ms":1000,"wait_ms":500,"timeout_ms":2000}`,
		`{"key":"a","token":3}`,
		`{"key":"\u00e9\u4e16","lease_ms":86400000}`,
		`{"key":"a","lease_ms":1e3}`,
		`{"key":"a","lease_ms":100}   `,
		`{}`, `[]`, `null`, ``, `{"key":`,
		`{"key":"a","token":3,"lease_ms":60000}`,
		`{"prefix":"a/","after":"a/1","limit":1000}`,
		`{"prefix":"a/","after":"a/1","after_token":7,"limit":10}`,
		`{"key":"a","wait_id":"w-1"}`,
		`{"key":"a","lease_ms":100,"wait_ms":50,"wait_id":"w-1"}`,
		`{"key":"a","session":"3"}`, `{"key":"a","lease_ms":100,"lock_delay_ms":15000}`, `{"ttl_ms":10000,"lock_delay_ms":15000}`, `{"session":"3"}`,
		`{"key":"a","lease_ms":100,"limit":3}`, `{"key":"a","lease_ms":100,"mode":"shared"}`, `{"key":"a","session":"3","limit":1024}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := DecodeAcquire(data); err == nil {
			if limit, mode := r.Kind(); limit == 1 || limit > MaxLimit || (limit > 1 && mode == core.ModeShared) || core.ValidateKind(limit, mode) != nil {
				t.Fatalf("accepted bad kind %+v", r)
			}
			lease, wait, timeout, err := r.Validate()
			if r.Session != "" {
				if err != nil || lease != 0 || r.LockDelayMS != 0 || r.SessionID() == 0 {
					t.Fatalf("accepted bad session acquire %+v", r)
				}
			} else if err != nil || lease < 100*time.Millisecond || lease > 24*time.Hour || r.LockDelayMS < 0 || r.LockDelayMS > MaxLockDelayMS || wait < 0 || wait > MaxWait || timeout < wait || timeout > MaxTimeout+DefaultReplyMargin {
				t.Fatalf("accepted out-of-limit acquire %+v", r)
			}
		} else {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" || pe.Message == "" {
				t.Fatalf("untyped rejection %v", err)
			}
		}
		if r, err := DecodeRelease(data); err == nil && (r.Token == 0 || r.Key == "") {
			t.Fatalf("accepted bad release %+v", r)
		}
		if r, err := DecodeGet(data); err == nil && r.Key == "" {
			t.Fatalf("accepted bad get %+v", r)
		}
		if r, err := DecodeRenew(data); err == nil && (r.Token == 0 || r.Key == "" || r.LeaseMS < 0 || r.LeaseMS > 24*3600*1000) {
			t.Fatalf("accepted bad renew %+v", r)
		}
		if r, err := DecodeList(data); err == nil {
			if limit, err := r.Validate(); err != nil || limit < 1 || limit > MaxListLimit || r.AfterToken != 0 && r.After == "" {
				t.Fatalf("accepted bad list %+v", r)
			}
		}
		if r, err := DecodeWithdraw(data); err == nil && (r.Key == "" || (r.WaitID == "" && r.RequestID == "") || len(r.WaitID) > MaxWaitIDLen || len(r.RequestID) > MaxRequestIDLen) {
			t.Fatalf("accepted bad withdraw %+v", r)
		}
		if r, err := DecodeSessionOpen(data); err == nil && (r.TTLMS < MinSessionTTLMS || r.TTLMS > MaxSessionTTLMS || r.LockDelayMS < 0 || r.LockDelayMS > MaxLockDelayMS) {
			t.Fatalf("accepted bad session open %+v", r)
		}
		if r, id, err := DecodeSession(data); err == nil && (id == 0 || FormatSessionID(id) != r.Session) {
			t.Fatalf("accepted bad session %+v", r)
		}
		// docs/protocol.md §2's rules beyond encoding/json, checked on
		// every accepted body by an independent reading.
		for _, d := range []struct {
			v   any
			err error
		}{
			{&AcquireRequest{}, second(DecodeAcquire(data))}, {&ReleaseRequest{}, second(DecodeRelease(data))},
			{&GetRequest{}, second(DecodeGet(data))}, {&RenewRequest{}, second(DecodeRenew(data))},
			{&ListRequest{}, second(DecodeList(data))}, {&WithdrawRequest{}, second(DecodeWithdraw(data))},
			{&SessionOpenRequest{}, second(DecodeSessionOpen(data))}, {&SessionRequest{}, third(DecodeSession(data))},
		} {
			if d.err == nil {
				checkStrictRules(t, data, d.v)
			}
		}
	})
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

// checkStrictRules fails t unless data, accepted as a request of v's type,
// is valid UTF-8 without a lone surrogate escape and is one object whose
// field names are v's json names exactly, each at most once and none null.
// It reads data with encoding/json's tokenizer, not with strict.go.
func checkStrictRules(t *testing.T, data []byte, v any) {
	t.Helper()
	if !utf8.Valid(data) {
		t.Fatalf("%T accepted invalid UTF-8 %q", v, data)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%T accepted %q, not an object", v, data)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%T accepted %q: %v", v, data, err)
		}
		name := tok.(string)
		if seen[name] || findField(fieldsOf(v), []byte(name)) < 0 {
			t.Fatalf("%T accepted %q: field %q twice or unknown", v, data, name)
		}
		seen[name] = true
		val, err := dec.Token()
		if err != nil || val == nil {
			t.Fatalf("%T accepted %q: field %q is null (%v)", v, data, name, err)
		}
		// encoding/json turns a lone surrogate into U+FFFD; an accepted
		// U+FFFD must have been in the body as itself.
		if s, ok := val.(string); ok && strings.ContainsRune(s, utf8.RuneError) &&
			!bytes.ContainsRune(data, utf8.RuneError) && !bytes.Contains(bytes.ToLower(data), []byte(`\ufffd`)) {
			t.Fatalf("%T accepted %q: field %q decodes to U+FFFD", v, data, name)
		}
	}
	if _, err := dec.Token(); err != nil {
		t.Fatalf("%T accepted %q: %v", v, data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("%T accepted %q with trailing data", v, data)
	}
}

// The audit publisher cannot import this package (only the NATS edge, the
// SDK and the CLI speak the client protocol), so it keeps its own copy of
// the subject; this keeps the two equal.
func TestAuditSubjectMatchesPublisher(t *testing.T) {
	if audit.SubjectPrefix != SubjectAuditPrefix {
		t.Fatalf("plugins/audit publishes on %q, the protocol documents %q", audit.SubjectPrefix, SubjectAuditPrefix)
	}
}

func TestDecodeLifecycle(t *testing.T) {
	cases := []struct {
		name   string
		decode func([]byte) error
		body   string
		code   Code
	}{
		{"renew", func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a","token":1}`, ""},
		{"renew lease", func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a","token":1,"lease_ms":5000}`, ""},
		{"renew no token", func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a"}`, CodeInvalidArgument},
		{"renew short lease", func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a","token":1,"lease_ms":5}`, CodeInvalidArgument},
		{"renew negative lease", func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a","token":1,"lease_ms":-1}`, CodeInvalidArgument},
		{"list empty", func(b []byte) error { _, err := DecodeList(b); return err }, `{}`, ""},
		{"list page", func(b []byte) error { _, err := DecodeList(b); return err }, `{"prefix":"a/","after":"a/3","limit":1000}`, ""},
		{"list resume in a key", func(b []byte) error { _, err := DecodeList(b); return err }, `{"prefix":"a/","after":"a/3","after_token":12,"limit":10}`, ""},
		{"list token without key", func(b []byte) error { _, err := DecodeList(b); return err }, `{"after_token":12}`, CodeInvalidArgument},
		{"list negative token", func(b []byte) error { _, err := DecodeList(b); return err }, `{"after":"a","after_token":-1}`, CodeMalformed},
		{"list over limit", func(b []byte) error { _, err := DecodeList(b); return err }, `{"limit":1001}`, CodeInvalidArgument},
		{"list negative", func(b []byte) error { _, err := DecodeList(b); return err }, `{"limit":-1}`, CodeInvalidArgument},
		{"list unknown", func(b []byte) error { _, err := DecodeList(b); return err }, `{"prefixes":"a"}`, CodeMalformed},
		{"withdraw", func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a","wait_id":"w1"}`, ""},
		{"withdraw no id", func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a"}`, CodeInvalidArgument},
		{"withdraw long id", func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a","wait_id":"` + strings.Repeat("w", MaxWaitIDLen+1) + `"}`, CodeInvalidArgument},
		{"withdraw by request id", func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a","request_id":"r1"}`, ""},
		{"withdraw bad request id", func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a","request_id":"r 1"}`, CodeInvalidArgument},
		{"acquire wait id space", func(b []byte) error { _, err := DecodeAcquire(b); return err }, `{"key":"a","lease_ms":100,"wait_id":"a b"}`, CodeInvalidArgument},
		{"acquire wait id", func(b []byte) error { _, err := DecodeAcquire(b); return err }, `{"key":"a","lease_ms":100,"wait_id":"c1-7"}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode([]byte(tc.body))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if !errors.Is(err, &Error{Code: tc.code}) {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
		})
	}
}

func TestWatchSubject(t *testing.T) {
	cases := []struct{ key, want string }{
		{"orders/42", "ticketd.v1.watch.k.orders/42"},
		{"a.b", "ticketd.v1.watch.k.a.b"},
		{"a..b", ""},
		{"a b", ""},
		{"a.*", ""},
		{"x>", ""},
		{".a", ""},
		{"ключ", ""},
	}
	for _, tc := range cases {
		got := WatchSubject(tc.key)
		if tc.want != "" && got != tc.want {
			t.Errorf("%q: got %q want %q", tc.key, got, tc.want)
		}
		if tc.want == "" && (!strings.HasPrefix(got, SubjectWatchPrefix+".h.") || len(got) != len(SubjectWatchPrefix)+3+32) {
			t.Errorf("%q: got %q, want the hashed form", tc.key, got)
		}
	}
	if WatchSubject("a") == WatchSubject("b") {
		t.Fatal("distinct keys share a subject")
	}
}

// TestEveryDecoderIsStrict: the rules of docs/protocol.md §2 that
// encoding/json alone would not enforce hold for every request a client
// can send, not only acquire.
func TestEveryDecoderIsStrict(t *testing.T) {
	decoders := map[string]struct {
		dec  func([]byte) error
		good string // a valid body whose first field is "key" or "prefix"
	}{
		"release":  {func(b []byte) error { _, err := DecodeRelease(b); return err }, `{"key":"a","token":1}`},
		"get":      {func(b []byte) error { _, err := DecodeGet(b); return err }, `{"key":"a"}`},
		"renew":    {func(b []byte) error { _, err := DecodeRenew(b); return err }, `{"key":"a","token":1}`},
		"withdraw": {func(b []byte) error { _, err := DecodeWithdraw(b); return err }, `{"key":"a","wait_id":"w"}`},
		"list":     {func(b []byte) error { _, err := DecodeList(b); return err }, `{"prefix":"a"}`},
		"acquire":  {func(b []byte) error { _, err := DecodeAcquire(b); return err }, `{"key":"a","lease_ms":100}`},
	}
	for name, d := range decoders {
		if err := d.dec([]byte(d.good)); err != nil {
			t.Fatalf("%s: good body %s rejected: %v", name, d.good, err)
		}
		field := d.good[2 : strings.Index(d.good[2:], `"`)+2] // "key" or "prefix"
		rest := d.good[strings.Index(d.good, `":"a"`)+5:]     // what follows the first field
		for _, tc := range []struct {
			body string
			code Code
		}{
			{`{"` + field + "\":\"a\xff\"" + rest, CodeInvalidArgument},
			{`{"` + field + `":"a\udfff"` + rest, CodeInvalidArgument},
			{`{"` + field + `":null` + rest, CodeMalformed},
			{`{"` + strings.ToUpper(field) + `":"a"` + rest, CodeMalformed},
			{`{"` + field + `":"b","` + field + `":"a"` + rest, CodeMalformed},
		} {
			err := d.dec([]byte(tc.body))
			if !errors.Is(err, &Error{Code: tc.code}) {
				t.Errorf("%s %q: got %v, want %s", name, tc.body, err, tc.code)
			}
		}
	}
}

// An acquire's limit and mode: the range, the two modes, no shared
// semaphore; Kind writes limit 1 as 0 (a mutex).
func TestAcquireKind(t *testing.T) {
	for _, tc := range []struct {
		body      string
		wantErr   string
		wantLimit uint32
		wantMode  core.Mode
	}{
		{body: `{"key":"a","lease_ms":100}`},
		{body: `{"key":"a","lease_ms":100,"limit":1}`},
		{body: `{"key":"a","lease_ms":100,"limit":3}`, wantLimit: 3},
		{body: `{"key":"a","lease_ms":100,"limit":1024}`, wantLimit: 1024},
		{body: `{"key":"a","lease_ms":100,"mode":"shared"}`, wantMode: core.ModeShared},
		{body: `{"key":"a","lease_ms":100,"mode":"exclusive"}`},
		{body: `{"key":"a","lease_ms":100,"limit":1025}`, wantErr: "limit 1025 is outside [0, 1024]"},
		{body: `{"key":"a","lease_ms":100,"limit":-1}`, wantErr: "outside"},
		{body: `{"key":"a","lease_ms":100,"mode":"read"}`, wantErr: `mode "read"`},
		{body: `{"key":"a","lease_ms":100,"limit":2,"mode":"shared"}`, wantErr: "no shared mode"},
	} {
		r, err := DecodeAcquire([]byte(tc.body))
		if tc.wantErr != "" {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeInvalidArgument || !strings.Contains(pe.Message, tc.wantErr) {
				t.Errorf("%s: %v, want invalid_argument %q", tc.body, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if l, m := r.Kind(); l != tc.wantLimit || m != tc.wantMode {
			t.Errorf("%s: kind %d %v, want %d %v", tc.body, l, m, tc.wantLimit, tc.wantMode)
		}
	}
}
