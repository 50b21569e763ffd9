package core

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
)

// Fence signing keys: the cluster's Ed25519 keys that sign fences (the
// key, token and cluster ID of a grant) so that a protected resource can
// verify a token offline. They are part of the replicated control state
// (cluster version 3), so every member signs with the same current key,
// a new leader keeps signing with it, and snapshots and backups carry
// them: a restored cluster keeps the keys, so fences it signed before stay
// valid. The leader makes a key's seed with crypto/rand and proposes it in
// a SetFenceKey command; Apply only records the data.
//
// The seed is a secret held in the replicated state: the raft log, the
// snapshots, the control record row and every backup hold it. Whoever
// reads those files can sign fences.

// FenceSeedSize is the size of a fence key's seed (an Ed25519 seed).
const FenceSeedSize = ed25519.SeedSize

// FenceKeyIDLen is the length of a fence key's ID.
const FenceKeyIDLen = 8

// FenceSeed is the secret seed of a fence signing key. Its String and
// GoString never show the bytes, so a seed inside a command, a control
// request or a control state printed with %v or %+v, or logged, stays
// secret.
type FenceSeed [FenceSeedSize]byte

func (FenceSeed) String() string { return "[fence seed redacted]" }

// GoString is String, for %#v.
func (s FenceSeed) GoString() string { return s.String() }

// FenceKeyID names a fence signing key: the first FenceKeyIDLen bytes of
// the SHA-256 of its 32-byte Ed25519 public key (the fence package's
// KeyID; a fence carries it so a resource that trusts several keys knows
// which one signed).
type FenceKeyID [FenceKeyIDLen]byte

// String is the ID in lowercase hex.
func (id FenceKeyID) String() string { return hex.EncodeToString(id[:]) }

// FenceKeyIDOf is the ID of the key whose public half is pub.
func FenceKeyIDOf(pub ed25519.PublicKey) FenceKeyID {
	sum := sha256.Sum256(pub)
	var id FenceKeyID
	copy(id[:], sum[:FenceKeyIDLen])
	return id
}

// FenceKey is a fence signing key with its ID.
type FenceKey struct {
	ID      FenceKeyID
	Private ed25519.PrivateKey
	Public  ed25519.PublicKey
}

// FencePublicKey is the public half of a fence signing key with its ID.
type FencePublicKey struct {
	ID  FenceKeyID
	Key ed25519.PublicKey
}

// fenceKey is one key as the machine keeps it, derived once from its seed.
type fenceKey struct {
	seed FenceSeed
	priv ed25519.PrivateKey
	id   FenceKeyID
}

func newFenceKey(seed FenceSeed) fenceKey {
	priv := ed25519.NewKeyFromSeed(seed[:])
	pub, _ := priv.Public().(ed25519.PublicKey)
	return fenceKey{seed: seed, priv: priv, id: FenceKeyIDOf(pub)}
}

func fenceKeys(seeds []FenceSeed) []fenceKey {
	if len(seeds) == 0 {
		return nil
	}
	keys := make([]fenceKey, len(seeds))
	for i, s := range seeds {
		keys[i] = newFenceKey(s)
	}
	return keys
}

func fenceSeeds(keys []fenceKey) []FenceSeed {
	if len(keys) == 0 {
		return nil
	}
	seeds := make([]FenceSeed, len(keys))
	for i, k := range keys {
		seeds[i] = k.seed
	}
	return seeds
}

// validateFenceKeys checks a list of seeds as the control state carries it:
// at most MaxFenceKeys, none zero, no seed or key ID twice.
func validateFenceKeys(seeds []FenceSeed) error {
	if len(seeds) > MaxFenceKeys {
		return malformedf("%d fence keys, the limit is %d", len(seeds), MaxFenceKeys)
	}
	ids := make(map[FenceKeyID]struct{}, len(seeds))
	for i, s := range seeds {
		if s == (FenceSeed{}) {
			return malformedf("fence key %d has a zero seed", i)
		}
		id := newFenceKey(s).id
		if _, dup := ids[id]; dup {
			return malformedf("fence key %d repeats key %s", i, id)
		}
		ids[id] = struct{}{}
	}
	return nil
}

// applySetFenceKey makes seed the current fence key, dropping the oldest
// beyond MaxFenceKeys. A seed (or key ID) already kept is rejected: the
// list never holds a key twice.
func (c *control) applySetFenceKey(seed FenceSeed) Result {
	k := newFenceKey(seed)
	for _, old := range c.fenceKeys {
		if old.seed == seed || old.id == k.id {
			return rejected(ReasonFenceKeyExists)
		}
	}
	keys := append(c.fenceKeys, k)
	if len(keys) > MaxFenceKeys {
		keys = keys[len(keys)-MaxFenceKeys:]
	}
	// A fresh array: state() hands out copies, but a shared backing array
	// would make the oldest key outlive its drop in memory.
	c.fenceKeys = append([]fenceKey(nil), keys...)
	return Result{Kind: ResultControlApplied}
}

// CurrentFenceKey returns the key fences are signed with now: the newest
// one. ok is false before the first SetFenceKey applied. The private key
// is a copy the caller may keep.
func (m *Machine) CurrentFenceKey() (k FenceKey, ok bool) {
	keys := m.ctl.fenceKeys
	if len(keys) == 0 {
		return FenceKey{}, false
	}
	cur := keys[len(keys)-1]
	priv := append(ed25519.PrivateKey(nil), cur.priv...)
	pub, _ := priv.Public().(ed25519.PublicKey)
	return FenceKey{ID: cur.id, Private: priv, Public: pub}, true
}

// CurrentFenceKeyIs reports whether pub is the public half of the current
// fence key (false before the first SetFenceKey applied). It copies
// nothing: a signer already prepared for pub is kept without taking the
// key out of the state on every grant (CurrentFenceKey does).
func (m *Machine) CurrentFenceKeyIs(pub ed25519.PublicKey) bool {
	keys := m.ctl.fenceKeys
	if len(keys) == 0 {
		return false
	}
	cur := keys[len(keys)-1].priv
	return ed25519.PublicKey(cur[ed25519.SeedSize:]).Equal(pub)
}

// FencePublicKeys returns the public halves of every kept fence key,
// oldest first (the last is the current one); nil if there is none. A
// resource should trust all of them: a fence signed just before a
// rotation is still valid.
func (m *Machine) FencePublicKeys() []FencePublicKey {
	var out []FencePublicKey
	for _, k := range m.ctl.fenceKeys {
		pub, _ := k.priv.Public().(ed25519.PublicKey)
		out = append(out, FencePublicKey{ID: k.id, Key: append(ed25519.PublicKey(nil), pub...)})
	}
	return out
}
