package core

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
)

// The state digest, kept up to date incrementally.
//
// Status reports a digest of the whole state on every call, and replicas
// compare them. Hashing a full snapshot per call costs O(table) (147 ms at
// 30k locks), so the lock table's part is a multiset hash instead
// (AdHash, Bellare–Micciancio): the sum modulo 2^256 of SHA-256 of each
// lock's canonical encoding. Adding or removing one lock adds or subtracts
// one term, the sum does not depend on the order of the terms (so no map
// order can leak into it), and Digest combines it in O(1) with the token
// counter, the lock count and the hash of the control record:
//
//	digest = SHA-256("ticketd state digest v1" | last_token:8 | count:8 | lock_sum:32 | control_sum:32)
//	lock_sum = Σ SHA-256(lock record v2 encoding of the lock) mod 2^256
//	control_sum = SHA-256(EncodeControlState(control state))
//
// It detects replicas that diverged, which is what it is for; it is not a
// commitment an adversary could not forge.

const digestDomain = "ticketd state digest v1"

// lockSum is a 256-bit accumulator, little-endian 64-bit limbs.
type lockSum [4]uint64

func lockTerm(l Lock) [4]uint64 {
	// The version 2 record layout with the identity always present, so that
	// an identity (even empty) is part of the term.
	var buf [64 + MaxKeyLen + MaxOwnerLen + MaxIdentityLen]byte
	b := appendString(appendLock(buf[:0], l), l.Identity)
	h := sha256.Sum256(b)
	var t [4]uint64
	for i := range t {
		t[i] = binary.LittleEndian.Uint64(h[8*i:])
	}
	return t
}

func (s *lockSum) add(l Lock) {
	t := lockTerm(l)
	var c uint64
	for i := range s {
		s[i], c = bits.Add64(s[i], t[i], c)
	}
}

func (s *lockSum) sub(l Lock) {
	t := lockTerm(l)
	var b uint64
	for i := range s {
		s[i], b = bits.Sub64(s[i], t[i], b)
	}
}

func controlSum(cs ControlState) [32]byte { return sha256.Sum256(EncodeControlState(cs)) }

func stateDigest(lastToken uint64, count int, ls *lockSum, ctl *[32]byte) [32]byte {
	var b [len(digestDomain) + 8 + 8 + 32 + 32]byte
	n := copy(b[:], digestDomain)
	binary.BigEndian.PutUint64(b[n:], lastToken)
	binary.BigEndian.PutUint64(b[n+8:], uint64(count))
	for i, limb := range ls {
		binary.LittleEndian.PutUint64(b[n+16+8*i:], limb)
	}
	copy(b[n+48:], ctl[:])
	return sha256.Sum256(b[:])
}
