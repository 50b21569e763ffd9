package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"unicode/utf8"
)

// The rules encoding/json does not enforce on its own, checked on a
// request body before it is decoded (docs/protocol.md §2):
//
//   - every string is valid UTF-8, raw or escaped: encoding/json would
//     replace an invalid byte or a lone surrogate escape with U+FFFD, so
//     two different invalid keys would name one lock;
//   - field names match exactly (encoding/json matches them without
//     regard to case, so "Lease_Ms" would set lease_ms);
//   - no field appears twice (encoding/json keeps the last);
//   - no field is null (encoding/json leaves the field as it was, which
//     would read null as "absent").

// checkStrict checks data, already known to be at most MaxRequestSize
// bytes starting with '{', against those rules for a request with the
// given fields (only their names are read). It returns nil when data is
// not valid JSON at all: the decoder that runs next reports that. It is
// one pass over the bytes: the strict path is what every body outside the
// fast path's subset takes.
func checkStrict(data []byte, fields []flatField) error {
	if !validStrings(data) {
		return Errorf(CodeInvalidArgument, "request contains a string that is not valid UTF-8")
	}
	var seen uint64 // by index into fields; a request has far fewer than 64
	i := skipWS(data, 1)
	if i < len(data) && data[i] == '}' {
		return nil
	}
	for i < len(data) {
		end, ok := stringEnd(data, i)
		if !ok {
			return nil
		}
		raw := data[i+1 : end-1] // compared in place unless escaped
		if bytes.IndexByte(raw, '\\') >= 0 {
			if raw, ok = unescape(data[i:end]); !ok {
				return nil
			}
		}
		k := findField(fields, raw)
		switch {
		case k < 0:
			return Errorf(CodeMalformed, "bad request JSON: json: unknown field %q", raw)
		case k < 64 && seen&(1<<k) != 0:
			return Errorf(CodeMalformed, "field %q appears more than once", raw)
		case k < 64:
			seen |= 1 << k
		}
		i = skipWS(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil
		}
		i = skipWS(data, i+1)
		if bytes.HasPrefix(data[i:], []byte("null")) {
			return Errorf(CodeMalformed, "field %q is null: leave a field out instead", raw)
		}
		if i, ok = valueEnd(data, i); !ok {
			return nil
		}
		i = skipWS(data, i)
		if i >= len(data) || data[i] != ',' {
			return nil // '}' or a syntax error: the decoder decides
		}
		i = skipWS(data, i+1)
	}
	return nil
}

// unescape decodes the JSON string lit (quotes included).
func unescape(lit []byte) ([]byte, bool) {
	var s string
	if json.Unmarshal(lit, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}

// stringEnd returns the index after the JSON string starting at data[i].
func stringEnd(data []byte, i int) (int, bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// valueEnd returns the index after the JSON value starting at data[i]:
// a string, or anything up to the next ',' or '}' outside strings at the
// same depth (the decoder checks its syntax).
func valueEnd(data []byte, i int) (int, bool) {
	depth := 0
	for i < len(data) {
		switch data[i] {
		case '"':
			end, ok := stringEnd(data, i)
			if !ok {
				return 0, false
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, true
			}
			depth--
		case ',':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return 0, false
}

// fieldsOf names the JSON fields of the struct v points to, from its json
// tags (only the names are set). Requests are flat structs of a handful of
// fields; the hot decoders pass their own lists (fastdecode.go) instead.
func fieldsOf(v any) []flatField {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	fields := make([]flatField, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields = append(fields, flatField{name: name})
	}
	return fields
}

// validStrings reports whether every JSON string in data is valid UTF-8
// once decoded: no invalid byte and no \u escape of a lone surrogate.
// Bytes outside strings are left to the JSON decoder.
func validStrings(data []byte) bool {
	for i := 0; i < len(data); i++ {
		if data[i] != '"' {
			continue
		}
		// Inside a string until its closing quote.
		for i++; i < len(data) && data[i] != '"'; i++ {
			c := data[i]
			switch {
			case c == '\\':
				if i+1 < len(data) && data[i+1] == 'u' {
					n, ok := surrogateEscape(data, i)
					if !ok {
						return false
					}
					i += n - 1
					continue
				}
				i++ // the escaped byte
			case c >= utf8.RuneSelf:
				r, size := utf8.DecodeRune(data[i:])
				if r == utf8.RuneError && size <= 1 {
					return false
				}
				i += size - 1
			}
		}
	}
	return true
}

// surrogateEscape looks at the \u escape at data[i:] and returns how many
// bytes it spans (6, or 12 for a surrogate pair) and whether it is valid:
// a high surrogate must be followed at once by a low one, and a low one
// must not stand alone. A malformed escape counts as valid here: the JSON
// decoder rejects it.
func surrogateEscape(data []byte, i int) (int, bool) {
	r, ok := hex4(data, i+2)
	if !ok {
		return 2, true
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 6, false
	case r >= 0xD800 && r <= 0xDBFF:
		if i+12 > len(data) || data[i+6] != '\\' || data[i+7] != 'u' {
			return 6, false
		}
		lo, ok := hex4(data, i+8)
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return 6, false
		}
		return 12, true
	}
	return 6, true
}

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
