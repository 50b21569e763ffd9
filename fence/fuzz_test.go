package fence

import (
	"encoding/base64"
	"testing"
)

// FuzzParse: no input panics the parser or passes it longer than MaxLen,
// and every input it accepts is the one canonical text of what it
// decoded (so a fence cannot be re-spelled past a cache or a log search),
// with fields within the limits.
func FuzzParse(f *testing.F) {
	priv, _ := testKey(f, 0)
	for _, s := range []string{
		mustSign(f, priv, 0x0123456789abcdef, "orders/42", 7),
		mustSign(f, priv, 0, "é/ü", ^uint64(0)),
		"tf1.AQ.AA", "tf2.", "tf1..", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fc, payload, sig, err := parse(s)
		if err != nil {
			if c := CodeOf(err); c != CodeMalformed && c != CodeUnsupportedVersion {
				t.Fatalf("parse(%q): error %v with code %q", s, err, c)
			}
			return
		}
		e := base64.RawURLEncoding
		if again := Prefix + e.EncodeToString(payload) + "." + e.EncodeToString(sig); again != s {
			t.Fatalf("parse accepted %q, whose canonical form is %q", s, again)
		}
		if string(encodePayload(fc)) != string(payload) {
			t.Fatalf("parse(%q) = %+v, which encodes to another payload", s, fc)
		}
		if len(s) > MaxLen || ValidateAdvance(fc.Key, fc.Token) != nil {
			t.Fatalf("parse accepted %q (%d bytes) with fields %+v", s, len(s), fc)
		}
	})
}

// FuzzParsePublicKey: every accepted text is the key's canonical text.
func FuzzParsePublicKey(f *testing.F) {
	_, pub := testKey(f, 0)
	f.Add(pub.String())
	f.Add("tfk1.")
	f.Add("tfk1.A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbh")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParsePublicKey(s)
		if err != nil {
			return
		}
		if k.String() != s {
			t.Fatalf("ParsePublicKey accepted %q, whose canonical form is %q", s, k.String())
		}
	})
}
