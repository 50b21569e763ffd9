package plugin

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A hand-written JSON codec for the fixed request and response shapes.
// The SDK does not use encoding/json: its reflection is slow once compiled
// to WebAssembly (~100µs to decode one GrantRequest) and it adds about a
// megabyte to every module, which costs compile and instantiation time on
// the host. The decoders accept any JSON and agree with encoding/json on
// every input (wire_test.go checks this, including by fuzzing); the
// encoders produce byte-for-byte what encoding/json would.

// decodeGrantRequest decodes a validate_grant request.
func decodeGrantRequest(b []byte) (GrantRequest, error) {
	var r GrantRequest
	s := scanner{b: string(b)}
	ok := s.object(func(key string) bool {
		switch {
		case strings.EqualFold(key, "key"):
			return s.str(&r.Key)
		case strings.EqualFold(key, "owner"):
			return s.str(&r.Owner)
		case strings.EqualFold(key, "identity"):
			return s.str(&r.Identity)
		case strings.EqualFold(key, "lease_ms"):
			return s.uint(&r.LeaseMS)
		case strings.EqualFold(key, "limit"):
			return s.uint32(&r.Limit)
		case strings.EqualFold(key, "mode"):
			return s.str(&r.Mode)
		}
		return s.skip()
	}) && s.end()
	if !ok {
		return GrantRequest{}, s.err()
	}
	return r, nil
}

// decodeApplied decodes an on_applied request.
func decodeApplied(b []byte) (Applied, error) {
	var a Applied
	s := scanner{b: string(b)}
	ok := s.object(func(key string) bool {
		switch {
		case strings.EqualFold(key, "index"):
			return s.uint(&a.Index)
		case strings.EqualFold(key, "command"):
			c := &a.Command
			return s.object(func(key string) bool {
				switch {
				case strings.EqualFold(key, "kind"):
					return s.str(&c.Kind)
				case strings.EqualFold(key, "key"):
					return s.str(&c.Key)
				case strings.EqualFold(key, "owner"):
					return s.str(&c.Owner)
				case strings.EqualFold(key, "lease_ms"):
					return s.uint(&c.LeaseMS)
				case strings.EqualFold(key, "granted_at_ms"):
					return s.uint(&c.GrantedAtMS)
				case strings.EqualFold(key, "token"):
					return s.uint(&c.Token)
				case strings.EqualFold(key, "limit"):
					return s.uint32(&c.Limit)
				case strings.EqualFold(key, "mode"):
					return s.str(&c.Mode)
				}
				return s.skip()
			})
		case strings.EqualFold(key, "result"):
			r := &a.Result
			return s.object(func(key string) bool {
				switch {
				case strings.EqualFold(key, "kind"):
					return s.str(&r.Kind)
				case strings.EqualFold(key, "token"):
					return s.uint(&r.Token)
				case strings.EqualFold(key, "existed"):
					return s.boolean(&r.Existed)
				case strings.EqualFold(key, "limit"):
					return s.uint32(&r.Limit)
				}
				return s.skip()
			})
		}
		return s.skip()
	}) && s.end()
	if !ok {
		return Applied{}, s.err()
	}
	return a, nil
}

// scanner reads JSON. Any method returning false
// means "not understood": decoding fails with err.
type scanner struct {
	b string // one copy of the request: decoded strings are substrings
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) lit(word string) bool {
	s.ws()
	if !strings.HasPrefix(s.b[s.i:], word) {
		return false
	}
	s.i += len(word)
	return true
}

func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// object reads {"k": v, ...}, calling field for each key with the scanner
// positioned at the value. A null object is accepted as no fields.
func (s *scanner) object(field func(key string) bool) bool {
	if s.peek() == 'n' {
		return s.lit("null")
	}
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		var key string
		if s.peek() != '"' || !s.str(&key) || s.peek() != ':' {
			return false
		}
		s.i++
		if !field(key) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str reads a string (or null, leaving *dst alone, as encoding/json does).
// Invalid UTF-8 bytes and unpaired surrogates become U+FFFD, as with
// encoding/json.
func (s *scanner) str(dst *string) bool {
	switch s.peek() {
	case 'n':
		return s.lit("null")
	case '"':
	default:
		return false
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			if !utf8.ValidString(raw) {
				*dst = string(appendValid(nil, raw))
				return true
			}
			*dst = raw // a substring of the one copy of the request
			return true
		case c == '\\':
			return s.strSlow(start, dst)
		case c < 0x20:
			return false
		}
		s.i++
	}
	return false
}

// strSlow finishes a string that has escapes.
func (s *scanner) strSlow(start int, dst *string) bool {
	buf := appendValid(nil, s.b[start:s.i])
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			*dst = string(buf)
			return true
		case c < 0x20:
			return false
		case c != '\\':
			j := s.i + 1
			for j < len(s.b) && s.b[j] != '"' && s.b[j] != '\\' && s.b[j] >= 0x20 {
				j++
			}
			buf = appendValid(buf, s.b[s.i:j])
			s.i = j
			continue
		}
		if s.i+1 >= len(s.b) {
			return false
		}
		e := s.b[s.i+1]
		s.i += 2
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := s.hex4(s.i)
			if !ok {
				return false
			}
			s.i += 4
			if utf16.IsSurrogate(r) {
				// A valid pair is one rune; otherwise this half becomes
				// U+FFFD and whatever follows is read on its own.
				if r2, ok := s.hex4(s.i + 2); ok && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						s.i += 6
						buf = utf8.AppendRune(buf, d)
						continue
					}
				}
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return false
		}
	}
	return false
}

// appendValid appends s with each invalid UTF-8 byte replaced by U+FFFD.
func appendValid(dst []byte, s string) []byte {
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && size == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, s[:size]...)
		}
		s = s[size:]
	}
	return dst
}

// hex4 reads four hex digits at i.
func (s *scanner) hex4(i int) (rune, bool) {
	if i < 0 || i+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s.b[i : i+4]) {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// uint reads a non-negative integer (or null).
func (s *scanner) uint(dst *uint64) bool {
	c := s.peek()
	if c == 'n' {
		return s.lit("null")
	}
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	digits := s.b[start:s.i]
	if len(digits) == 0 || (len(digits) > 1 && digits[0] == '0') {
		return false
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return false
	}
	v, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return false
	}
	*dst = v
	return true
}

// uint32 reads an unsigned integer that fits 32 bits (or null), as
// encoding/json does into a uint32: a larger one is an error.
func (s *scanner) uint32(dst *uint32) bool {
	v := uint64(*dst)
	if !s.uint(&v) || v > math.MaxUint32 {
		return false
	}
	*dst = uint32(v)
	return true
}

// boolean reads true, false or null.
func (s *scanner) boolean(dst *bool) bool {
	switch s.peek() {
	case 't':
		if s.lit("true") {
			*dst = true
			return true
		}
	case 'f':
		if s.lit("false") {
			*dst = false
			return true
		}
	case 'n':
		return s.lit("null")
	}
	return false
}

// skip reads any value of an unknown field.
func (s *scanner) skip() bool {
	switch c := s.peek(); {
	case c == '"':
		var x string
		return s.str(&x)
	case c == '{':
		return s.object(func(string) bool { return s.skip() })
	case c == '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			if !s.skip() {
				return false
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	return false
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scanner) number() bool {
	digits := func() bool {
		start := s.i
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i > start
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case !digits():
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !digits() {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !digits() {
			return false
		}
	}
	return true
}

// err describes where decoding stopped.
func (s *scanner) err() error {
	return errors.New("sdk: malformed or unexpected JSON at byte " + strconv.Itoa(s.i))
}

// appendVerdict encodes v exactly as json.Marshal(v) would.
func appendVerdict(dst []byte, v Verdict) []byte {
	dst = append(dst, `{"allow":`...)
	dst = strconv.AppendBool(dst, v.Allow)
	if v.Reason != "" {
		dst = append(dst, `,"reason":`...)
		dst = appendString(dst, v.Reason)
	}
	if v.Error != "" {
		dst = append(dst, `,"error":`...)
		dst = appendString(dst, v.Error)
	}
	return append(dst, '}')
}

// appendApplied encodes r as json.Marshal(r) would.
func appendApplied(dst []byte, r appliedResponse) ([]byte, error) {
	dst = append(dst, `{"events":`...)
	if r.Events == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, e := range r.Events {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"type":`...)
			dst = appendString(dst, e.Type)
			if e.Data != nil {
				var err error
				dst = append(dst, `,"data":`...)
				if dst, err = appendValue(dst, e.Data); err != nil {
					return nil, err
				}
			}
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if r.Error != "" {
		dst = append(dst, `,"error":`...)
		dst = appendString(dst, r.Error)
	}
	return append(dst, '}'), nil
}

const hexDigits = "0123456789abcdef"

// appendString encodes s as encoding/json does by default (HTML-safe:
// <, > and & escaped; invalid UTF-8 replaced by U+FFFD; U+2028 and U+2029
// escaped).
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Marshaler is implemented by values that encode themselves to JSON
// (encoding/json.Marshaler has the same method, and json.RawMessage
// implements it).
type Marshaler interface {
	MarshalJSON() ([]byte, error)
}

// Field is one member of a Fields object.
type Field struct {
	Name  string
	Value any
}

// Fields is event data: an ordered JSON object. A Value may be nil, a
// string, a bool, any integer or float type, a Fields (a nested object),
// a []any of those, or a Marshaler; anything else fails to encode. Names
// should be unique.
type Fields []Field

// MarshalJSON implements Marshaler.
func (f Fields) MarshalJSON() ([]byte, error) { return f.appendJSON(nil) }

func (f Fields) appendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, '{')
	for i, fl := range f {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, fl.Name)
		dst = append(dst, ':')
		var err error
		if dst, err = appendValue(dst, fl.Value); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

// appendValue encodes one value as encoding/json would.
func appendValue(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case string:
		return appendString(dst, v), nil
	case bool:
		return strconv.AppendBool(dst, v), nil
	case int:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int8:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int16:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(dst, v, 10), nil
	case uint:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case uint8:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case uint16:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case uint32:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case uint64:
		return strconv.AppendUint(dst, v, 10), nil
	case float32:
		return appendFloat(dst, float64(v), 32)
	case float64:
		return appendFloat(dst, v, 64)
	case Fields:
		return v.appendJSON(dst)
	case []any:
		dst = append(dst, '[')
		for i, x := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendValue(dst, x); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case Marshaler:
		b, err := v.MarshalJSON()
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			return nil, errors.New("sdk: MarshalJSON returned nothing")
		}
		return append(dst, b...), nil
	}
	return nil, errors.New("sdk: cannot encode a value of this type; use plugin.Fields, a basic type or a Marshaler")
}

// appendFloat formats like encoding/json: no NaN or infinities, 'f'
// notation for 1e-6 <= |f| < 1e21, else 'e' with a short exponent.
func appendFloat(dst []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, errors.New("sdk: cannot encode NaN or an infinity")
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	dst = strconv.AppendFloat(dst, f, format, -1, bits)
	if format == 'e' {
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, nil
}
