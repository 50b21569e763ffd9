package fence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"strings"
	"unicode/utf8"
)

// Limits and constants of format version 1. docs/fencing.md describes the
// same format for implementers in other languages.
const (
	// Version is the format version this module writes; it is the
	// payload's first byte and the digit of the "tf1." prefix.
	Version = 1
	// Prefix starts every version-1 fence.
	Prefix = "tf1."
	// SignatureContext is prepended to the payload before signing, so a
	// signature over a fence can never be taken for a signature over any
	// other message signed with the same key, and the reverse.
	SignatureContext = "ticketd-fence-v1\x00"

	// MaxKeyLen is the longest lock key in bytes: ticketd's own key limit
	// (docs/protocol.md, "key": 1 to 512 bytes).
	MaxKeyLen = 512
	// KeyIDLen is the length of a KeyID in bytes.
	KeyIDLen = 8
	// payloadFixedLen is the payload without the key: version 1, cluster
	// ID 8, key ID 8, token 8, key length 2.
	payloadFixedLen = 1 + 8 + KeyIDLen + 8 + 2
	// MaxPayloadLen is the longest payload.
	MaxPayloadLen = payloadFixedLen + MaxKeyLen
	// MaxLen is the longest fence string (810 bytes): anything longer is
	// refused before it is decoded.
	MaxLen = len(Prefix) + (MaxPayloadLen*8+5)/6 + 1 + (ed25519.SignatureSize*8+5)/6
)

// b64 is unpadded base64url that refuses non-zero unused bits, so every
// byte string has exactly one accepted text form. It still skips CR and
// LF, which decode64 refuses before calling it.
var b64 = base64.RawURLEncoding.Strict()

// Fence is what a verified fence says: cluster ClusterID granted Key with
// Token, and key KeyID signed it.
type Fence struct {
	ClusterID uint64
	Key       string
	Token     uint64
	KeyID     KeyID
}

// Sign returns the fence for a grant of key with token by cluster
// clusterID, signed with priv (a key from ed25519.GenerateKey or
// ed25519.NewKeyFromSeed). It refuses, with ErrInvalidArgument, a key
// outside ticketd's limits (1 to MaxKeyLen bytes of UTF-8 without NUL), a
// zero token and a private key of the wrong size.
func Sign(priv ed25519.PrivateKey, clusterID uint64, key string, token uint64) (string, error) {
	sg, err := NewSigner(priv)
	if err != nil {
		return "", err
	}
	return sg.Sign(clusterID, key, token)
}

// Signer signs fences with one private key prepared once: its key ID
// computed, and the key held in one slice for its whole life, so the
// standard library's cache of expanded Ed25519 keys (keyed by the
// slice's address) finds it on every Sign instead of hashing the seed
// again. A server that signs every grant keeps one per key; Sign gives the
// same fences. A Signer is safe for concurrent use.
type Signer struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
	id   KeyID
}

// NewSigner prepares priv (copied) for signing. It refuses a private key
// of the wrong size with ErrInvalidArgument.
func NewSigner(priv ed25519.PrivateKey) (*Signer, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, errorf(CodeInvalidArgument, "the private key is %d bytes, want %d", len(priv), ed25519.PrivateKeySize)
	}
	own := append(ed25519.PrivateKey(nil), priv...)
	pub, _ := own.Public().(ed25519.PublicKey)
	return &Signer{priv: own, pub: pub, id: keyIDOf(pub)}, nil
}

// KeyID is the ID of the signer's public key.
func (sg *Signer) KeyID() KeyID { return sg.id }

// PublicKey is the signer's raw public key; the caller must not modify it.
func (sg *Signer) PublicKey() ed25519.PublicKey { return sg.pub }

// Sign returns the fence for a grant of key with token by cluster
// clusterID, with the same refusals as the package's Sign. The signed
// message and the text are built in stack buffers: the result string and
// the signature are its only allocations.
func (sg *Signer) Sign(clusterID uint64, key string, token uint64) (string, error) {
	if err := ValidateAdvance(key, token); err != nil {
		return "", err
	}
	var msg [len(SignatureContext) + MaxPayloadLen]byte
	m := append(msg[:0], SignatureContext...)
	m = appendPayload(m, Fence{ClusterID: clusterID, Key: key, Token: token, KeyID: sg.id})
	payload := m[len(SignatureContext):]
	sig := ed25519.Sign(sg.priv, m)
	var text [MaxLen]byte
	t := append(text[:0], Prefix...)
	t = b64.AppendEncode(t, payload)
	t = append(t, '.')
	t = b64.AppendEncode(t, sig)
	return string(t), nil
}

// ParseUnverified decodes a fence WITHOUT checking its signature or
// cluster: anyone can make a fence that parses. Use a Verifier to trust
// one; this is for logs and tools.
func ParseUnverified(s string) (Fence, error) {
	f, _, _, err := parse(s)
	return f, err
}

// ValidateAdvance checks a lock key and token against the limits every
// fence obeys: the key 1 to MaxKeyLen bytes of valid UTF-8 without NUL
// (ticketd's key rules), the token at least 1. Store implementations call
// it first.
func ValidateAdvance(key string, token uint64) error {
	switch {
	case key == "":
		return errorf(CodeInvalidArgument, "the key is empty")
	case len(key) > MaxKeyLen:
		return errorf(CodeInvalidArgument, "the key is %d bytes, at most %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return errorf(CodeInvalidArgument, "the key is not valid UTF-8")
	case strings.IndexByte(key, 0) >= 0:
		return errorf(CodeInvalidArgument, "the key holds a NUL byte")
	case token == 0:
		return errorf(CodeInvalidArgument, "the token is 0; ticketd's tokens start at 1")
	}
	return nil
}

// encodePayload lays f out as the version-1 payload:
//
//	version u8 | cluster_id u64 | key_id [8] | token u64 | key_len u16 | key
//
// integers big-endian.
func encodePayload(f Fence) []byte {
	return appendPayload(make([]byte, 0, payloadFixedLen+len(f.Key)), f)
}

// appendPayload appends f's payload to p.
func appendPayload(p []byte, f Fence) []byte {
	p = append(p, Version)
	p = binary.BigEndian.AppendUint64(p, f.ClusterID)
	p = append(p, f.KeyID[:]...)
	p = binary.BigEndian.AppendUint64(p, f.Token)
	p = binary.BigEndian.AppendUint16(p, uint16(len(f.Key)))
	return append(p, f.Key...)
}

// signedMessage is what the signature covers: SignatureContext, then the
// payload.
func signedMessage(payload []byte) []byte {
	return append([]byte(SignatureContext), payload...)
}

// parse checks everything but the signature and returns the fence, the
// payload bytes and the signature.
func parse(s string) (f Fence, payload, sig []byte, err error) {
	if len(s) > MaxLen {
		return Fence{}, nil, nil, errorf(CodeMalformed, "the fence is %d bytes, at most %d", len(s), MaxLen)
	}
	version, rest, ok := strings.Cut(s, ".")
	if !ok {
		return Fence{}, nil, nil, errorf(CodeMalformed, "no \".\" after the version")
	}
	if version+"." != Prefix {
		if isVersionTag(version) {
			return Fence{}, nil, nil, errorf(CodeUnsupportedVersion, "version %q is not supported (this verifier knows %q)", version, strings.TrimSuffix(Prefix, "."))
		}
		return Fence{}, nil, nil, errorf(CodeMalformed, "it does not start with %q", Prefix)
	}
	p64, s64, ok := strings.Cut(rest, ".")
	if !ok {
		return Fence{}, nil, nil, errorf(CodeMalformed, "no \".\" before the signature")
	}
	if payload, err = decode64(p64, "payload"); err != nil {
		return Fence{}, nil, nil, err
	}
	if sig, err = decode64(s64, "signature"); err != nil {
		return Fence{}, nil, nil, err
	}
	if len(sig) != ed25519.SignatureSize {
		return Fence{}, nil, nil, errorf(CodeMalformed, "the signature is %d bytes, want %d", len(sig), ed25519.SignatureSize)
	}
	if f, err = decodePayload(payload); err != nil {
		return Fence{}, nil, nil, err
	}
	return f, payload, sig, nil
}

// isVersionTag reports whether s is "tf" and a decimal number: a fence of
// another version, as opposed to something that is no fence at all.
func isVersionTag(s string) bool {
	digits, ok := strings.CutPrefix(s, "tf")
	if !ok || digits == "" || len(digits) > 4 {
		return false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// decode64 decodes one canonical unpadded base64url field.
func decode64(s, what string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return nil, errorf(CodeMalformed, "the %s holds %q, which is not unpadded base64url", what, c)
		}
	}
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, errorf(CodeMalformed, "the %s is not canonical base64url: %v", what, err)
	}
	return b, nil
}

// decodePayload is the inverse of encodePayload; it refuses any byte
// string that encodePayload cannot produce for a valid fence.
func decodePayload(p []byte) (Fence, error) {
	if len(p) < payloadFixedLen {
		return Fence{}, errorf(CodeMalformed, "the payload is %d bytes, at least %d", len(p), payloadFixedLen)
	}
	if p[0] != Version {
		return Fence{}, errorf(CodeMalformed, "the payload's version byte is %d under prefix %q", p[0], Prefix)
	}
	var f Fence
	f.ClusterID = binary.BigEndian.Uint64(p[1:9])
	copy(f.KeyID[:], p[9:17])
	f.Token = binary.BigEndian.Uint64(p[17:25])
	n := int(binary.BigEndian.Uint16(p[25:27]))
	if len(p) != payloadFixedLen+n {
		return Fence{}, errorf(CodeMalformed, "the payload is %d bytes, its key length says %d", len(p), payloadFixedLen+n)
	}
	f.Key = string(p[payloadFixedLen:])
	if err := ValidateAdvance(f.Key, f.Token); err != nil {
		e, _ := err.(*Error)
		return Fence{}, errorf(CodeMalformed, "%s", e.Msg)
	}
	return f, nil
}
