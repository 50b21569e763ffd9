package protocol

import "strconv"

// A fast path for the hot request bodies (acquire, release, get), which
// encoding/json's strict Decoder (Decode) made about a tenth of the
// leader's CPU under load.
//
// It never decides anything on its own: it accepts only a plain subset of
// JSON — one flat object, lower-case known keys written exactly, strings of
// printable ASCII without escapes, integers without fraction, exponent or
// leading zeros, JSON whitespace — and fills the struct exactly as the
// strict decoder would. On anything else (too large, unknown or
// differently cased keys, a key twice, escapes, non-ASCII, null, wrong types, overflow,
// trailing data, bad syntax) it gives up and the caller runs Decode on the
// untouched input, whose answer stands. So a body is accepted and decoded
// to the same value, or rejected with the same error, as before
// (FuzzFastDecodeMatchesStrict checks this on every input).

// flatField is one field of a flat request object: exactly one of str,
// i64 and u64 is set.
type flatField struct {
	name string
	str  *string
	i64  *int64
	u64  *uint64
}

// decodeFlat fills fields from data if data is in the plain subset and
// reports whether it did; on false the fields may be partly written and
// the caller must start again from a zero value.
func decodeFlat(data []byte, fields []flatField) bool {
	if len(data) > MaxRequestSize {
		return false
	}
	i := skipWS(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipWS(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipWS(data, i+1) == len(data)
	}
	var seen uint64 // fields already set, by index (a request has < 64)
	for {
		name, j, ok := plainString(data, i)
		if !ok {
			return false
		}
		i = skipWS(data, j)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipWS(data, i+1)
		k := findField(fields, name)
		if k < 0 || seen&(1<<k) != 0 {
			return false // unknown or duplicate: the strict path says which
		}
		seen |= 1 << k
		f := &fields[k]
		if i, ok = f.value(data, i); !ok {
			return false
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case '}':
			return skipWS(data, i+1) == len(data)
		default:
			return false
		}
	}
}

func findField(fields []flatField, name []byte) int {
	for k := range fields {
		if fields[k].name == string(name) { // no allocation: compared in place
			return k
		}
	}
	return -1
}

// value decodes f's value at data[i:] and returns the index after it.
func (f *flatField) value(data []byte, i int) (int, bool) {
	if f.str != nil {
		s, j, ok := plainString(data, i)
		if ok {
			*f.str = string(s)
		}
		return j, ok
	}
	j := i
	if j < len(data) && data[j] == '-' {
		if f.u64 != nil {
			return 0, false
		}
		j++
	}
	start := j
	for j < len(data) && data[j] >= '0' && data[j] <= '9' {
		j++
	}
	if j == start || data[start] == '0' && j-start > 1 {
		return 0, false
	}
	if j < len(data) && (data[j] == '.' || data[j] == 'e' || data[j] == 'E') {
		return 0, false
	}
	lit := string(data[i:j]) // short; the compiler keeps it off the heap
	var err error
	if f.u64 != nil {
		*f.u64, err = strconv.ParseUint(lit, 10, 64)
	} else {
		*f.i64, err = strconv.ParseInt(lit, 10, 64)
	}
	return j, err == nil
}

// plainString returns the content of the JSON string at data[i:] and the
// index after its closing quote, if it is printable ASCII without escapes.
func plainString(data []byte, i int) ([]byte, int, bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return data[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20 || c > 0x7e:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipWS skips JSON whitespace (which bytes.TrimSpace in Decode also
// trims) from data[i:].
func skipWS(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// The fields of each request, named as their json tags. A field missing
// here only sends the bodies that carry it down the strict path.
func acquireFields(r *AcquireRequest) []flatField {
	return []flatField{
		{name: "key", str: &r.Key}, {name: "owner", str: &r.Owner}, {name: "lease_ms", i64: &r.LeaseMS},
		{name: "wait_ms", i64: &r.WaitMS}, {name: "timeout_ms", i64: &r.TimeoutMS}, {name: "wait_id", str: &r.WaitID},
		{name: "request_id", str: &r.RequestID}, {name: "session", str: &r.Session}, {name: "lock_delay_ms", i64: &r.LockDelayMS},
		{name: "limit", i64: &r.Limit}, {name: "mode", str: &r.Mode},
	}
}

func releaseFields(r *ReleaseRequest) []flatField {
	return []flatField{{name: "key", str: &r.Key}, {name: "token", u64: &r.Token}}
}

func getFields(r *GetRequest) []flatField { return []flatField{{name: "key", str: &r.Key}} }

// decodeAcquireBody decodes an acquire body, fast when it can.
func decodeAcquireBody(data []byte, r *AcquireRequest) error {
	fields := acquireFields(r)
	if decodeFlat(data, fields) {
		return nil
	}
	*r = AcquireRequest{}
	return decodeStrict(data, r, fields)
}

// decodeReleaseBody decodes a release body, fast when it can.
func decodeReleaseBody(data []byte, r *ReleaseRequest) error {
	fields := releaseFields(r)
	if decodeFlat(data, fields) {
		return nil
	}
	*r = ReleaseRequest{}
	return decodeStrict(data, r, fields)
}

// decodeGetBody decodes a get body, fast when it can.
func decodeGetBody(data []byte, r *GetRequest) error {
	fields := getFields(r)
	if decodeFlat(data, fields) {
		return nil
	}
	*r = GetRequest{}
	return decodeStrict(data, r, fields)
}
