package fence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// testKey is a fixed key: seed bytes 0, 1, ..., 31 (the test vector's).
func testKey(t testing.TB, first byte) (ed25519.PrivateKey, PublicKey) {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = first + byte(i)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub, err := PublicKeyFromPrivate(priv)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

func mustSign(t testing.TB, priv ed25519.PrivateKey, cluster uint64, key string, token uint64) string {
	t.Helper()
	s, err := Sign(priv, cluster, key, token)
	if err != nil {
		t.Fatalf("Sign(%d, %q, %d): %v", cluster, key, token, err)
	}
	return s
}

// signRaw signs any payload bytes, valid or not, the way Sign would:
// the forger that holds the key, to test that the parser's checks do not
// rest on the signature.
func signRaw(priv ed25519.PrivateKey, payload []byte) string {
	e := base64.RawURLEncoding
	return Prefix + e.EncodeToString(payload) + "." + e.EncodeToString(ed25519.Sign(priv, signedMessage(payload)))
}

func TestSignVerifyRoundTrip(t *testing.T) {
	priv, pub := testKey(t, 0)
	longest := strings.Repeat("é", MaxKeyLen/2)
	for _, tc := range []struct {
		name    string
		cluster uint64
		key     string
		token   uint64
	}{
		{"plain", 0x0123456789abcdef, "orders/42", 7},
		{"cluster 0 (created before cluster IDs)", 0, "k", 1},
		{"highest cluster and token", ^uint64(0), "k", ^uint64(0)},
		{"longest key", 42, longest, 1 << 33},
		{"key with spaces, dots and slashes", 42, "a b.c/d..e", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustSign(t, priv, tc.cluster, tc.key, tc.token)
			if len(s) > MaxLen {
				t.Fatalf("fence is %d bytes, above MaxLen %d", len(s), MaxLen)
			}
			v, err := NewVerifier(tc.cluster, pub)
			if err != nil {
				t.Fatal(err)
			}
			f, err := v.Verify(s)
			if err != nil {
				t.Fatalf("Verify(%s): %v", s, err)
			}
			want := Fence{ClusterID: tc.cluster, Key: tc.key, Token: tc.token, KeyID: pub.ID()}
			if f != want {
				t.Fatalf("Verify = %+v, want %+v", f, want)
			}
			if u, err := ParseUnverified(s); err != nil || u != want {
				t.Fatalf("ParseUnverified = %+v, %v; want %+v", u, err, want)
			}
		})
	}
}

// TestMaxLen: the longest key gives a fence of exactly MaxLen bytes, so
// MaxLen refuses nothing Sign can make.
func TestMaxLen(t *testing.T) {
	priv, _ := testKey(t, 0)
	if s := mustSign(t, priv, 1, strings.Repeat("k", MaxKeyLen), 1); len(s) != MaxLen || MaxLen != 810 {
		t.Fatalf("longest fence is %d bytes, MaxLen %d, docs/fencing.md says 810", len(s), MaxLen)
	}
}

func TestSignRefusesInvalidArguments(t *testing.T) {
	priv, _ := testKey(t, 0)
	for _, tc := range []struct {
		name  string
		priv  ed25519.PrivateKey
		key   string
		token uint64
	}{
		{"no private key", nil, "k", 1},
		{"a seed instead of a private key", priv.Seed(), "k", 1},
		{"empty key", priv, "", 1},
		{"key one byte too long", priv, strings.Repeat("k", MaxKeyLen+1), 1},
		{"invalid UTF-8", priv, "\xc3", 1},
		{"NUL", priv, "a\x00", 1},
		{"token 0", priv, "k", 0},
	} {
		if s, err := Sign(tc.priv, 1, tc.key, tc.token); !errors.Is(err, ErrInvalidArgument) || s != "" {
			t.Errorf("%s: Sign = %q, %v; want fence_invalid_argument", tc.name, s, err)
		}
	}
}

// payload builds a payload field by field, for the parser's tests.
func payload(version byte, cluster uint64, id KeyID, token uint64, keyLen uint16, key string) []byte {
	p := []byte{version}
	p = binary.BigEndian.AppendUint64(p, cluster)
	p = append(p, id[:]...)
	p = binary.BigEndian.AppendUint64(p, token)
	p = binary.BigEndian.AppendUint16(p, keyLen)
	return append(p, key...)
}

func TestVerifyRefuses(t *testing.T) {
	const cluster = 0x0123456789abcdef
	priv, pub := testKey(t, 0)
	otherPriv, _ := testKey(t, 100)
	v, err := NewVerifier(cluster, pub)
	if err != nil {
		t.Fatal(err)
	}
	good := mustSign(t, priv, cluster, "orders/42", 7)
	p64, s64 := strings.Split(good, ".")[1], strings.Split(good, ".")[2]
	e := base64.RawURLEncoding
	goodPayload, _ := e.DecodeString(p64)
	sig, _ := e.DecodeString(s64)

	// Another token in the payload, the signature left as it was.
	changed := append([]byte(nil), goodPayload...)
	changed[24] = 8
	// A signature with one bit flipped.
	flipped := append([]byte(nil), sig...)
	flipped[10] ^= 1
	// The signature's last character with a non-zero unused bit (64
	// bytes leave 4 unused bits): it decodes to the same bytes, so only a
	// strict decoder notices.
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, s64[len(s64)-1])
	nonCanonical := s64[:len(s64)-1] + string(alphabet[last|1])
	if last&1 != 0 {
		t.Fatal("test setup: the signature's last character already has its low bit set")
	}
	id := pub.ID()

	for _, tc := range []struct {
		name  string
		fence string
		want  Code
	}{
		{"empty", "", CodeMalformed},
		{"prefix only", "tf1.", CodeMalformed},
		{"no signature part", "tf1." + p64, CodeMalformed},
		{"upper-case prefix", "TF1." + p64 + "." + s64, CodeMalformed},
		{"other scheme", "Bearer " + good, CodeMalformed},
		{"unknown version", "tf2." + p64 + "." + s64, CodeUnsupportedVersion},
		{"unknown version, no more parts", "tf9.", CodeUnsupportedVersion},
		{"trailing dot", good + ".", CodeMalformed},
		{"trailing part", good + ".AAAA", CodeMalformed},
		{"trailing newline", good + "\n", CodeMalformed},
		{"newline inside the payload", "tf1." + p64[:10] + "\n" + p64[10:] + "." + s64, CodeMalformed},
		{"CR inside the signature", "tf1." + p64 + "." + s64[:5] + "\r" + s64[5:], CodeMalformed},
		{"padding", "tf1." + p64 + "." + s64 + "==", CodeMalformed},
		{"standard base64 alphabet", "tf1." + base64.RawStdEncoding.EncodeToString(goodPayload) + "." + base64.RawStdEncoding.EncodeToString(sig), CodeMalformed},
		{"non-canonical base64", "tf1." + p64 + "." + nonCanonical, CodeMalformed},
		{"leading space", " " + good, CodeMalformed},
		{"signature 63 bytes", "tf1." + p64 + "." + e.EncodeToString(sig[:63]), CodeMalformed},
		{"signature 65 bytes", "tf1." + p64 + "." + e.EncodeToString(append(sig, 0)), CodeMalformed},
		{"longer than MaxLen", good + strings.Repeat("A", MaxLen), CodeMalformed},
		{"payload shorter than its fixed part", signRaw(priv, goodPayload[:26]), CodeMalformed},
		{"payload version 2 under tf1", signRaw(priv, payload(2, cluster, id, 7, 1, "k")), CodeMalformed},
		{"key length above the key", signRaw(priv, payload(1, cluster, id, 7, 5, "k")), CodeMalformed},
		{"key length below the key (trailing bytes)", signRaw(priv, payload(1, cluster, id, 7, 1, "kk")), CodeMalformed},
		{"empty key", signRaw(priv, payload(1, cluster, id, 7, 0, "")), CodeMalformed},
		{"key above MaxKeyLen", signRaw(priv, payload(1, cluster, id, 7, MaxKeyLen+1, strings.Repeat("k", MaxKeyLen+1))), CodeMalformed},
		{"key not UTF-8", signRaw(priv, payload(1, cluster, id, 7, 2, "\xff\xfe")), CodeMalformed},
		{"key with NUL", signRaw(priv, payload(1, cluster, id, 7, 2, "a\x00")), CodeMalformed},
		{"token 0", signRaw(priv, payload(1, cluster, id, 0, 1, "k")), CodeMalformed},
		{"another key", mustSign(t, otherPriv, cluster, "orders/42", 7), CodeUnknownKey},
		{"another key claiming the trusted key's ID", signRaw(otherPriv, payload(1, cluster, id, 7, 1, "k")), CodeForged},
		{"payload changed", "tf1." + e.EncodeToString(changed) + "." + s64, CodeForged},
		{"signature changed", "tf1." + p64 + "." + e.EncodeToString(flipped), CodeForged},
		{"signature of another payload", "tf1." + p64 + "." + strings.Split(mustSign(t, priv, cluster, "orders/42", 8), ".")[2], CodeForged},
		{"another cluster", mustSign(t, priv, cluster+1, "orders/42", 7), CodeWrongCluster},
		{"another cluster, forged", "tf1." + e.EncodeToString(payload(1, cluster+1, id, 7, 1, "k")) + "." + s64, CodeForged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := v.Verify(tc.fence)
			if CodeOf(err) != tc.want || f != (Fence{}) {
				t.Fatalf("Verify(%q) = %+v, %v; want code %s", tc.fence, f, err, tc.want)
			}
			if tc.want == CodeMalformed || tc.want == CodeUnsupportedVersion {
				if _, err := ParseUnverified(tc.fence); CodeOf(err) != tc.want {
					t.Fatalf("ParseUnverified = %v, want code %s", err, tc.want)
				}
			}
		})
	}
}

func TestKeyRotation(t *testing.T) {
	oldPriv, oldPub := testKey(t, 0)
	newPriv, newPub := testKey(t, 50)
	oldFence := mustSign(t, oldPriv, 9, "k", 1)
	newFence := mustSign(t, newPriv, 9, "k", 2)

	both, err := NewVerifier(9, oldPub, newPub, oldPub)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{oldFence, newFence} {
		if _, err := both.Verify(s); err != nil {
			t.Fatalf("during the rotation: %v", err)
		}
	}
	after, err := NewVerifier(9, newPub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := after.Verify(oldFence); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("the old key's fence after the rotation: %v, want fence_unknown_key", err)
	}
	if f, err := after.Verify(newFence); err != nil || f.KeyID != newPub.ID() {
		t.Fatalf("the new key's fence: %+v, %v", f, err)
	}
}

func TestNewVerifierRefuses(t *testing.T) {
	_, pub := testKey(t, 0)
	_, other := testKey(t, 1)
	many := make([]PublicKey, MaxTrustedKeys+1)
	for i := range many {
		many[i] = pub
	}
	collide := PublicKey{key: other.key, id: pub.id} // two keys, one ID
	for _, tc := range []struct {
		name string
		keys []PublicKey
	}{
		{"no key", nil},
		{"the zero key", []PublicKey{{}}},
		{"too many keys", many},
		{"two keys with one ID", []PublicKey{pub, collide}},
	} {
		if v, err := NewVerifier(1, tc.keys...); !errors.Is(err, ErrInvalidArgument) || v != nil {
			t.Errorf("%s: NewVerifier = %v, %v; want fence_invalid_argument", tc.name, v, err)
		}
	}
}

func TestErrors(t *testing.T) {
	err := error(Stale("k", 3, 5))
	var fe *Error
	if !errors.Is(err, ErrStale) || errors.Is(err, ErrForged) || !errors.As(err, &fe) || fe.Current != 5 || CodeOf(err) != CodeStale {
		t.Fatalf("Stale: %v", err)
	}
	if got := err.Error(); got != `fence: fence_stale: token 3 for key "k" is below the current token 5: its holder lost the lock` {
		t.Fatalf("Stale message: %s", got)
	}
	// A sentinel does not match an error with details and another code;
	// an error with details is no sentinel.
	if errors.Is(ErrStale, err) || CodeOf(errors.New("x")) != "" {
		t.Fatal("an error with details matched as a sentinel")
	}
}

// BenchmarkSign and BenchmarkVerify: the server signs every grant; a
// resource verifies every fenced request.
func BenchmarkSign(b *testing.B) {
	priv, _ := testKey(b, 0)
	for b.Loop() {
		if _, err := Sign(priv, 1, "orders/42", 7); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	priv, pub := testKey(b, 0)
	v, _ := NewVerifier(1, pub)
	s := mustSign(b, priv, 1, "orders/42", 7)
	for b.Loop() {
		if _, err := v.Verify(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSigner(b *testing.B) {
	priv, _ := testKey(b, 0)
	sg, err := NewSigner(priv)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sg.Sign(1, "orders/42", 7); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSignerMatchesSign: a prepared Signer writes exactly Sign's fences,
// refuses what Sign refuses, and stays within its allocation budget (the
// result and the signature; the expanded key is not rebuilt per call,
// which cost the server a SHA-512 and a cache entry per grant).
func TestSignerMatchesSign(t *testing.T) {
	priv, pub := testKey(t, 0)
	sg, err := NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	if sg.KeyID() != pub.ID() || !sg.PublicKey().Equal(pub.Ed25519()) {
		t.Fatal("the signer's key ID or public key is not the key's")
	}
	for _, key := range []string{"a", "orders/42", strings.Repeat("k", MaxKeyLen)} {
		for _, token := range []uint64{1, 7, 1 << 63} {
			want, err := Sign(priv, 99, key, token)
			if err != nil {
				t.Fatal(err)
			}
			got, err := sg.Sign(99, key, token)
			if err != nil || got != want {
				t.Fatalf("Signer.Sign(%q, %d) = %q, %v; Sign gave %q", key, token, got, err, want)
			}
		}
	}
	if _, err := sg.Sign(1, "", 1); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := sg.Sign(1, "k", 0); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("zero token: %v", err)
	}
	if _, err := NewSigner(priv[:10]); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("short key: %v", err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = sg.Sign(1, "orders/42", 7) }); n > 3 {
		t.Fatalf("Signer.Sign makes %v allocations, want at most 3", n)
	}
}
