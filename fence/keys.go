package fence

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// PublicKeyPrefix starts the text form of a version-1 public key.
const PublicKeyPrefix = "tfk1."

// KeyID names a signing key: the first 8 bytes of the SHA-256 of its
// 32-byte Ed25519 public key. A fence carries the ID of the key that
// signed it, so a resource that trusts several keys (during a rotation)
// knows which one to verify with.
type KeyID [KeyIDLen]byte

// String is the ID in lowercase hex (16 characters).
func (id KeyID) String() string { return hex.EncodeToString(id[:]) }

func keyIDOf(pub ed25519.PublicKey) KeyID {
	sum := sha256.Sum256(pub)
	var id KeyID
	copy(id[:], sum[:KeyIDLen])
	return id
}

// PublicKey is a cluster's public signing key, as a resource configures
// it. The zero value is no key; make one with NewPublicKey,
// PublicKeyFromPrivate or ParsePublicKey.
type PublicKey struct {
	key ed25519.PublicKey
	id  KeyID
}

// NewPublicKey wraps a raw Ed25519 public key (32 bytes).
func NewPublicKey(pub ed25519.PublicKey) (PublicKey, error) {
	if len(pub) != ed25519.PublicKeySize {
		return PublicKey{}, errorf(CodeInvalidArgument, "the public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	k := make(ed25519.PublicKey, ed25519.PublicKeySize)
	copy(k, pub)
	return PublicKey{key: k, id: keyIDOf(k)}, nil
}

// PublicKeyFromPrivate is the public half of priv (a key from
// ed25519.GenerateKey or ed25519.NewKeyFromSeed).
func PublicKeyFromPrivate(priv ed25519.PrivateKey) (PublicKey, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return PublicKey{}, errorf(CodeInvalidArgument, "the private key is %d bytes, want %d", len(priv), ed25519.PrivateKeySize)
	}
	pub, _ := priv.Public().(ed25519.PublicKey)
	return NewPublicKey(pub)
}

// ParsePublicKey reads the text form "tfk1." + base64url(32-byte key),
// unpadded and canonical, 48 characters in all.
func ParsePublicKey(s string) (PublicKey, error) {
	rest, ok := strings.CutPrefix(s, PublicKeyPrefix)
	if !ok {
		return PublicKey{}, errorf(CodeMalformed, "a public key starts with %q", PublicKeyPrefix)
	}
	if len(rest) != b64.EncodedLen(ed25519.PublicKeySize) {
		return PublicKey{}, errorf(CodeMalformed, "a public key has %d characters after %q, not %d", len(rest), PublicKeyPrefix, b64.EncodedLen(ed25519.PublicKeySize))
	}
	raw, err := decode64(rest, "public key")
	if err != nil {
		return PublicKey{}, err
	}
	return NewPublicKey(raw)
}

// String is the text form ParsePublicKey reads, "" for the zero value.
func (k PublicKey) String() string {
	if k.key == nil {
		return ""
	}
	return PublicKeyPrefix + b64.EncodeToString(k.key)
}

// ID is the key's KeyID.
func (k PublicKey) ID() KeyID { return k.id }

// Ed25519 returns a copy of the raw key.
func (k PublicKey) Ed25519() ed25519.PublicKey { return append(ed25519.PublicKey(nil), k.key...) }

// MarshalText is String, for configuration files.
func (k PublicKey) MarshalText() ([]byte, error) {
	if k.key == nil {
		return nil, errorf(CodeInvalidArgument, "the zero PublicKey has no text form")
	}
	return []byte(k.String()), nil
}

// UnmarshalText is ParsePublicKey.
func (k *PublicKey) UnmarshalText(b []byte) error {
	p, err := ParsePublicKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

// MaxTrustedKeys bounds the keys one Verifier trusts: a rotation needs
// two or three, never thousands.
const MaxTrustedKeys = 64

// Verifier decides whether a fence is authentic and from the trusted
// cluster. It is immutable and safe for concurrent use.
type Verifier struct {
	clusterID uint64
	keys      map[KeyID]ed25519.PublicKey
}

// NewVerifier returns a Verifier that accepts fences of cluster clusterID
// signed by any of keys (1 to MaxTrustedKeys; the same key twice is
// fine). To rotate, trust the new key and the old one until no fence
// signed by the old one is in use any more, then drop it.
func NewVerifier(clusterID uint64, keys ...PublicKey) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errorf(CodeInvalidArgument, "a verifier needs at least one public key")
	}
	if len(keys) > MaxTrustedKeys {
		return nil, errorf(CodeInvalidArgument, "%d public keys, at most %d", len(keys), MaxTrustedKeys)
	}
	v := &Verifier{clusterID: clusterID, keys: make(map[KeyID]ed25519.PublicKey, len(keys))}
	for _, k := range keys {
		if k.key == nil {
			return nil, errorf(CodeInvalidArgument, "the zero PublicKey is no key")
		}
		if old, ok := v.keys[k.id]; ok && !old.Equal(k.key) {
			return nil, errorf(CodeInvalidArgument, "two different public keys share the key ID %s", k.id)
		}
		v.keys[k.id] = k.key
	}
	return v, nil
}

// FormatClusterID is ticketd's text form of a cluster ID: 16 lowercase hex
// digits (as `ticketd snapshot restore` prints cluster_id).
func FormatClusterID(id uint64) string { return fmt.Sprintf("%016x", id) }

// ParseClusterID reads FormatClusterID's form: exactly 16 hex digits.
func ParseClusterID(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, errorf(CodeInvalidArgument, "a cluster ID is 16 hex digits, got %d characters", len(s))
	}
	id, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, errorf(CodeInvalidArgument, "a cluster ID is 16 hex digits: %q is not", s)
	}
	return id, nil
}

// ClusterID is the cluster whose fences v accepts.
func (v *Verifier) ClusterID() uint64 { return v.clusterID }

// Verify returns what fence s says if s is well formed, signed by one of
// the trusted keys, and issued by the trusted cluster. The checks run in
// this order, and the first that fails decides the error: ErrMalformed or
// ErrUnsupportedVersion (the shape), ErrUnknownKey (the key ID), ErrForged
// (the signature), ErrWrongCluster (the cluster ID). So ErrWrongCluster
// is only ever said of an authentic fence.
//
// A verified fence proves that the cluster granted Key with Token at some
// time, not that the grant is still held: comparing Token with the
// highest token accepted for Key (a Store) is what refuses a former
// holder.
func (v *Verifier) Verify(s string) (Fence, error) {
	f, payload, sig, err := parse(s)
	if err != nil {
		return Fence{}, err
	}
	pub, ok := v.keys[f.KeyID]
	if !ok {
		return Fence{}, errorf(CodeUnknownKey, "signed by key %s, which is not among the %d trusted public keys", f.KeyID, len(v.keys))
	}
	if !ed25519.Verify(pub, signedMessage(payload), sig) {
		return Fence{}, errorf(CodeForged, "the signature does not verify with key %s", f.KeyID)
	}
	if f.ClusterID != v.clusterID {
		return Fence{}, errorf(CodeWrongCluster, "issued by cluster %s, this resource trusts cluster %s", FormatClusterID(f.ClusterID), FormatClusterID(v.clusterID))
	}
	return f, nil
}
