package protocol

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// strictDecoders are the decoders before the fast path: Decode (the
// strict encoding/json Decoder) then Validate.
func strictAcquire(data []byte) (AcquireRequest, error) {
	var r AcquireRequest
	if err := Decode(data, &r); err != nil {
		return AcquireRequest{}, err
	}
	if _, _, _, err := r.Validate(); err != nil {
		return AcquireRequest{}, err
	}
	return r, nil
}

func strictRelease(data []byte) (ReleaseRequest, error) {
	var r ReleaseRequest
	if err := Decode(data, &r); err != nil {
		return ReleaseRequest{}, err
	}
	return r, r.Validate()
}

func strictGet(data []byte) (GetRequest, error) {
	var r GetRequest
	if err := Decode(data, &r); err != nil {
		return GetRequest{}, err
	}
	return r, r.Validate()
}

func strictCheck(data []byte) (CheckRequest, error) {
	var r CheckRequest
	if err := Decode(data, &r); err != nil {
		return CheckRequest{}, err
	}
	return r, r.Validate()
}

// sameOutcome fails t unless both decoders accepted with equal values or
// both rejected with the same code and message.
func sameOutcome(t *testing.T, what string, data []byte, got, want any, gerr, werr error) {
	t.Helper()
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%s %q: fast path err %v, strict err %v", what, data, gerr, werr)
	}
	if gerr != nil {
		var g, w *Error
		if !errors.As(gerr, &g) || !errors.As(werr, &w) || *g != *w {
			t.Fatalf("%s %q: fast path err %v, strict err %v", what, data, gerr, werr)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s %q: fast path %+v, strict %+v", what, data, got, want)
	}
}

func checkFastMatchesStrict(t *testing.T, data []byte) {
	a, aerr := DecodeAcquire(data)
	sa, saerr := strictAcquire(data)
	sameOutcome(t, "acquire", data, a, sa, aerr, saerr)
	r, rerr := DecodeRelease(data)
	sr, srerr := strictRelease(data)
	sameOutcome(t, "release", data, r, sr, rerr, srerr)
	g, gerr := DecodeGet(data)
	sg, sgerr := strictGet(data)
	sameOutcome(t, "get", data, g, sg, gerr, sgerr)
	c, cerr := DecodeCheck(data)
	sc, scerr := strictCheck(data)
	sameOutcome(t, "check", data, c, sc, cerr, scerr)
	o, oerr := DecodeSessionOpen(data)
	so, soerr := strictSessionOpen(data)
	sameOutcome(t, "session open", data, o, so, oerr, soerr)
	k, _, kerr := DecodeSession(data)
	sk, skerr := strictSession(data)
	sameOutcome(t, "session", data, k, sk, kerr, skerr)
}

func strictSessionOpen(data []byte) (SessionOpenRequest, error) {
	var r SessionOpenRequest
	if err := Decode(data, &r); err != nil {
		return SessionOpenRequest{}, err
	}
	return r, r.Validate()
}

func strictSession(data []byte) (SessionRequest, error) {
	var r SessionRequest
	if err := Decode(data, &r); err != nil {
		return SessionRequest{}, err
	}
	_, err := r.Validate()
	return r, err
}

// fastCases are inputs at the edges of the fast path's subset.
var fastCases = []string{
	`{"key":"a","lease_ms":100,"limit":3}`, `{"key":"a","lease_ms":100,"mode":"shared"}`, `{"key":"a","lease_ms":100,"limit":3,"mode":"shared"}`,
	`{"key":"a","lease_ms":100,"limit":-1}`, `{"key":"a","lease_ms":100,"limit":1025}`, `{"key":"a","lease_ms":100,"mode":"Shared"}`,
	`{"key":"a","lease_ms":100,"limit":"3"}`, `{"key":"a","lease_ms":100,"mode":1}`, `{"key":"a","lease_ms":100,"limit":null}`,
	`{"key":"a","lease_ms":100}`,
	`{"key":"a","owner":"w","lease_ms":1000,"wait_ms":500,"timeout_ms":2000,"wait_id":"w1"}`,
	`{"key":"a","token":3}`, `{"key":"a"}`, `{}`, ` { } `, "\t{\"key\":\"a\"}\r\n",
	`{"key":"a","key":"b","lease_ms":100}`, `{"key":"a","lease_ms":100,"lease_ms":200}`,
	`{"KEY":"a","lease_ms":100}`, `{"Key":"a","token":1}`, `{"key":"a","x":1}`,
	`{"key":"a\u0062","lease_ms":100}`, `{"key":"a\"b","lease_ms":100}`, "{\"key\":\"\xc3\xa9\",\"lease_ms\":100}",
	"{\"key\":\"\xff\",\"lease_ms\":100}", "{\"key\":\"a\x01\",\"lease_ms\":100}",
	`{"key":null,"lease_ms":100}`, `{"key":"a","lease_ms":null}`, `{"key":1,"lease_ms":100}`, `{"key":"a","lease_ms":"100"}`,
	`{"key":"a","lease_ms":1e3}`, `{"key":"a","lease_ms":100.0}`, `{"key":"a","lease_ms":0100}`, `{"key":"a","lease_ms":-0}`,
	`{"key":"a","lease_ms":-100}`, `{"key":"a","lease_ms":-}`, `{"key":"a","lease_ms":9223372036854775807}`,
	`{"key":"a","lease_ms":9223372036854775808}`, `{"key":"a","token":18446744073709551615}`,
	`{"key":"a","token":18446744073709551616}`, `{"key":"a","token":-1}`, `{"key":"a","token":-0}`, `{"key":"a","token":0}`,
	`{"key":"a","lease_ms":100}{}`, `{"key":"a","lease_ms":100}x`, `{"key":"a","lease_ms":100},`, `{"key":"a",}`,
	`{"key":"a" "lease_ms":100}`, `{"key" "a"}`, `{,}`, `{"key":"a"`, `{"key":"a","lease_ms":100`, `[]`, `null`, ``, `"a"`,
	"\v{\"key\":\"a\",\"lease_ms\":100}", "{\"key\":\"a\",\"lease_ms\":100}\u00a0", "\u00a0{\"key\":\"a\"}",
	`{"key":"` + strings.Repeat("k", MaxRequestSize) + `"}`, `{"key":"` + strings.Repeat("k", 2000) + `","lease_ms":100}`,
	`{"key":"a","wait_id":"x\ty"}`, `{"key":"a","lease_ms":100,"wait_ms":600000}`,
	`{"key":"a","lease_ms":100,"request_id":"r-1"}`, `{"key":"a","lease_ms":100,"request_id":"r 1"}`,
	`{"key":"a","lease_ms":100,"request_id":"` + strings.Repeat("r", MaxRequestIDLen+1) + `"}`, "{\"key\":\"a\",\"lease_ms\":100,\"request_id\":\"\xc3\xa9\"}",
	`{"key":"a","session":"7"}`, `{"key":"a","session":"07"}`, `{"key":"a","session":"0"}`, `{"key":"a","session":"7","lease_ms":100}`,
	`{"key":"a","session":"18446744073709551616"}`, `{"key":"a","session":7}`, `{"key":"a","lease_ms":100,"lock_delay_ms":60001}`,
	`{"key":"a","session":"7","lock_delay_ms":5}`, `{"ttl_ms":1000}`, `{"ttl_ms":999}`, `{"ttl_ms":1000,"lock_delay_ms":60000}`,
	`{"ttl_ms":1000,"lock_delay_ms":-1}`, `{"session":"12"}`, `{"session":"1 2"}`, `{"session":""}`,
}

func TestFastDecodeMatchesStrict(t *testing.T) {
	for _, c := range fastCases {
		checkFastMatchesStrict(t, []byte(c))
	}
	for _, c := range corpusSeeds(t) {
		checkFastMatchesStrict(t, c)
	}
}

// TestFastDecodeIsUsed: the plain bodies clients send take the fast path
// (they decode without Decode), every field of each request included.
func TestFastDecodeIsUsed(t *testing.T) {
	for _, tc := range []struct {
		body string
		v    any
		dec  func([]byte) bool
	}{
		{`{"key":"a","owner":"o","lease_ms":100,"wait_ms":5,"timeout_ms":9,"wait_id":"w","request_id":"r","session":"","lock_delay_ms":3,"limit":4,"mode":"exclusive"}`, AcquireRequest{Key: "a", Owner: "o", LeaseMS: 100, WaitMS: 5, TimeoutMS: 9, WaitID: "w", RequestID: "r", LockDelayMS: 3, Limit: 4, Mode: "exclusive"},
			func(b []byte) bool { var r AcquireRequest; return decodeFlat(b, acquireFields(&r)) }},
		{`{"key":"a","token":7}`, ReleaseRequest{Key: "a", Token: 7}, func(b []byte) bool { var r ReleaseRequest; return decodeFlat(b, releaseFields(&r)) }},
		{`{"key":"a"}`, GetRequest{Key: "a"}, func(b []byte) bool { var r GetRequest; return decodeFlat(b, getFields(&r)) }},
		{`{"key":"a","token":7}`, CheckRequest{Key: "a", Token: 7}, func(b []byte) bool { var r CheckRequest; return decodeFlat(b, checkFields(&r)) }},
		{`{"ttl_ms":1000,"lock_delay_ms":5}`, SessionOpenRequest{TTLMS: 1000, LockDelayMS: 5}, func(b []byte) bool { var r SessionOpenRequest; return decodeFlat(b, sessionOpenFields(&r)) }},
		{`{"session":"9"}`, SessionRequest{Session: "9"}, func(b []byte) bool { var r SessionRequest; return decodeFlat(b, sessionFields(&r)) }},
	} {
		if !tc.dec([]byte(tc.body)) {
			t.Errorf("%s: not on the fast path", tc.body)
		}
		// Every JSON field of the type is listed, so a new field cannot
		// silently send every body down the slow path.
		if n := reflect.TypeOf(tc.v).NumField(); strings.Count(tc.body, ":") != n {
			t.Errorf("%T has %d fields; the test body names %d", tc.v, n, strings.Count(tc.body, ":"))
		}
	}
}

// FuzzFastDecodeMatchesStrict: the fast path and the strict decoder agree
// on every input: the same value, or the same error.
func FuzzFastDecodeMatchesStrict(f *testing.F) {
	for _, c := range fastCases {
		f.Add([]byte(c))
	}
	for _, c := range corpusSeeds(f) {
		f.Add(c)
	}
	f.Fuzz(checkFastMatchesStrict)
}

// corpusSeeds reads the committed corpus of FuzzDecodeRequests.
func corpusSeeds(tb testing.TB) [][]byte {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzDecodeRequests", "*"))
	if err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for _, name := range files {
		fh, err := os.Open(name)
		if err != nil {
			tb.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "[]byte(") {
				continue
			}
			s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(line, "[]byte("), ")"))
			if err != nil {
				tb.Fatalf("%s: %v", name, err)
			}
			out = append(out, []byte(s))
		}
		_ = fh.Close()
	}
	if len(out) == 0 {
		tb.Fatal("no corpus read")
	}
	return out
}

var benchBodies = map[string][]byte{
	"acquire": []byte(`{"key":"lock/000123","owner":"bench-7","lease_ms":10000,"wait_ms":5000}`),
	"release": []byte(`{"key":"lock/000123","token":123456}`),
	// Outside the fast path's subset (non-ASCII key): the strict path
	// with the typed field list, what a client with such keys pays.
	"acquire-utf8": []byte(`{"key":"zamówienie/000123","owner":"bench-7","lease_ms":10000,"wait_ms":5000}`),
}

func BenchmarkDecodeAcquire(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAcquire(benchBodies["acquire"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeAcquireUTF8(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAcquire(benchBodies["acquire-utf8"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeAcquireStrict(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := strictAcquire(benchBodies["acquire"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRelease(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRelease(benchBodies["release"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeReleaseStrict(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := strictRelease(benchBodies["release"]); err != nil {
			b.Fatal(err)
		}
	}
}
