package fence

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestPublicKeyText(t *testing.T) {
	_, pub := testKey(t, 0)
	s := pub.String()
	if len(s) != 48 || !strings.HasPrefix(s, PublicKeyPrefix) {
		t.Fatalf("text form %q: want 48 characters starting %q", s, PublicKeyPrefix)
	}
	back, err := ParsePublicKey(s)
	if err != nil || back.ID() != pub.ID() || !back.Ed25519().Equal(pub.Ed25519()) {
		t.Fatalf("ParsePublicKey(%q) = %v, %v", s, back, err)
	}
	// In a JSON (or YAML, TOML) configuration file.
	var cfg struct{ Keys []PublicKey }
	if err := json.Unmarshal([]byte(`{"Keys":["`+s+`"]}`), &cfg); err != nil || cfg.Keys[0].String() != s {
		t.Fatalf("JSON: %v, %v", cfg, err)
	}
	if out, err := json.Marshal(cfg); err != nil || string(out) != `{"Keys":["`+s+`"]}` {
		t.Fatalf("JSON out: %s, %v", out, err)
	}
	if _, err := (PublicKey{}).MarshalText(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("the zero key marshalled: %v", err)
	}

	body := strings.TrimPrefix(s, PublicKeyPrefix)
	for _, bad := range []string{
		"",
		body,                           // no prefix
		"tfk2." + body,                 // another version
		"TFK1." + body,                 // case
		s + "A",                        // too long
		s[:len(s)-1],                   // too short
		s + "=",                        // padding
		s[:20] + "\n" + s[20:len(s)-1], // a newline for a character
		s[:20] + "+" + s[21:],          // standard alphabet
		" " + s,
	} {
		if bad == s {
			continue
		}
		if k, err := ParsePublicKey(bad); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidArgument) || k.String() != "" {
			t.Errorf("ParsePublicKey(%q) = %v, %v; want refused", bad, k, err)
		}
	}
	if _, err := NewPublicKey(make([]byte, 31)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a 31-byte key: %v", err)
	}
}

// TestPublicKeyNonCanonical: a 32-byte key leaves 2 unused bits in its
// last character; a text with one of them set decodes to the same key
// and must be refused, so each key has one text form.
func TestPublicKeyNonCanonical(t *testing.T) {
	_, pub := testKey(t, 0)
	s := pub.String()
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, s[len(s)-1])
	if last&3 != 0 {
		t.Fatalf("test setup: %q has unused bits set", s)
	}
	for _, bit := range []int{1, 2} {
		bad := s[:len(s)-1] + string(alphabet[last|bit])
		if _, err := ParsePublicKey(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParsePublicKey(%q) = %v, want fence_malformed", bad, err)
		}
	}
}

func TestClusterIDText(t *testing.T) {
	for _, id := range []uint64{0, 1, 0x0123456789abcdef, ^uint64(0)} {
		s := FormatClusterID(id)
		if back, err := ParseClusterID(s); err != nil || back != id || len(s) != 16 {
			t.Fatalf("%d -> %q -> %d, %v", id, s, back, err)
		}
	}
	for _, bad := range []string{"", "123", "0123456789abcdeg", "+123456789abcdef", "0123456789abcdef0", "0x23456789abcdef"} {
		if _, err := ParseClusterID(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseClusterID(%q) = %v, want fence_invalid_argument", bad, err)
		}
	}
}
