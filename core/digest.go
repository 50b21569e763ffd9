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
//	lock_sum = Σ SHA-256(lock record v2 encoding of the lock [| request_id:str]) mod 2^256
//	control_sum = SHA-256(EncodeControlState(control state))
//
// From cluster version 3 on it also covers the request state: the data
// clock, the FIFO of ended request records (each term bound to its
// sequence number, so their order counts) and, through the lock terms,
// every held lock's request id; and the control record then carries the
// fence keys:
//
//	digest = SHA-256("ticketd state digest v2" | last_token:8 | count:8 | lock_sum:32 | control_sum:32
//	                 | data_clock:8 | ended_head:8 | ended_count:8 | ended_sum:32)
//	ended_sum = Σ SHA-256(seq:8 | EncodeEndedRequest(record)) mod 2^256
//
// From cluster version 4 on it also covers the sessions and lock-delays
// (sessions.go): the two counters, the counts, and one more multiset sum
// over every session and every delayed key; and, through the lock terms,
// each lock's session and lock-delay:
//
//	digest = SHA-256("ticketd state digest v3" | the v2 fields
//	                 | last_session_id:8 | last_delay_seq:8 | sessions:8 | delays:8 | session_sum:32)
//	session_sum = Σ SHA-256(0x01 | session record) + Σ SHA-256(0x02 | delay record) mod 2^256
//
// (the records without their version byte, encoding_sessions.go).
//
// From cluster version 5 on it also covers the multi-holder keys
// (kinds.go): their holder and delayed slot counts and one more multiset
// sum, a term per holder and per delayed slot, each with its key's kind:
//
//	digest = SHA-256("ticketd state digest v4" | the v3 digest:32
//	                 | holders:8 | slots:8 | kinds_sum:32)
//	kinds_sum = Σ SHA-256(0x03 | key:str | limit:uvarint | mode:1 | holder)
//	          + Σ SHA-256(0x04 | key:str | limit:uvarint | mode:1 | slot) mod 2^256
//
// (holder and slot as in the kinds section, encoding_kinds.go). count, the
// v1 field, then counts the holders too (Len).
//
// A state of an earlier cluster version has no request ids, request
// records, fence keys, sessions or lock-delays, and its digest is what the
// binaries of that version compute: members of a cluster in a rolling
// upgrade agree.
//
// It detects replicas that diverged, which is what it is for; it is not a
// commitment an adversary could not forge.

const (
	digestDomain   = "ticketd state digest v1"
	digestDomainV2 = "ticketd state digest v2"
	digestDomainV3 = "ticketd state digest v3"
	digestDomainV4 = "ticketd state digest v4"
)

// sum256 is a 256-bit accumulator, little-endian 64-bit limbs.
type sum256 [4]uint64

func termOf(h [32]byte) [4]uint64 {
	var t [4]uint64
	for i := range t {
		t[i] = binary.LittleEndian.Uint64(h[8*i:])
	}
	return t
}

func lockTerm(l Lock) [4]uint64 {
	// The version 2 record layout with the identity always present, so that
	// an identity (even empty) is part of the term; a request id follows
	// when there is one, and the session and lock-delay after it (the
	// request id then always, even empty) when either is set. Every field
	// is length prefixed or a varint, so this stays unambiguous, and a
	// lock without the later fields keeps the term of earlier versions.
	var buf [96 + MaxKeyLen + MaxOwnerLen + MaxIdentityLen + MaxRequestIDLen]byte
	b := appendString(appendLock(buf[:0], l), l.Identity)
	if l.RequestID != "" || l.SessionID != 0 || l.LockDelayMS != 0 {
		b = appendString(b, l.RequestID)
	}
	if l.SessionID != 0 || l.LockDelayMS != 0 {
		b = binary.AppendUvarint(b, l.SessionID)
		b = binary.AppendUvarint(b, l.LockDelayMS)
	}
	return termOf(sha256.Sum256(b))
}

func endedTerm(seq uint64, e *EndedRequest) [4]uint64 {
	var buf [8 + 1 + MaxEndedSnapshotSize]byte
	b := binary.BigEndian.AppendUint64(buf[:0], seq)
	return termOf(sha256.Sum256(appendEndedRequest(b, e)))
}

func sessionTerm(x *Session) [4]uint64 {
	var buf [1 + MaxSessionSnapshotSize]byte
	return termOf(sha256.Sum256(appendSession(append(buf[:0], 0x01), x)))
}

func delayTerm(d *Delay) [4]uint64 {
	var buf [1 + MaxDelaySnapshotSize]byte
	return termOf(sha256.Sum256(appendDelay(append(buf[:0], 0x02), d)))
}

func holderTerm(l *Lock) [4]uint64 {
	var buf [1 + MaxHolderSnapshotSize]byte
	b := appendKindHeader(append(buf[:0], 0x03), l.Key, l.Limit, l.Mode)
	return termOf(sha256.Sum256(appendHolder(b, l)))
}

func slotTerm(limit uint32, mode Mode, d *Delay) [4]uint64 {
	var buf [1 + MaxSlotSnapshotSize]byte
	b := appendKindHeader(append(buf[:0], 0x04), d.Key, limit, mode)
	return termOf(sha256.Sum256(appendSlot(b, d)))
}

func (s *sum256) add(t [4]uint64) {
	var c uint64
	for i := range s {
		s[i], c = bits.Add64(s[i], t[i], c)
	}
}

func (s *sum256) sub(t [4]uint64) {
	var b uint64
	for i := range s {
		s[i], b = bits.Sub64(s[i], t[i], b)
	}
}

func (s *sum256) appendTo(b []byte) []byte {
	for _, limb := range s {
		b = binary.LittleEndian.AppendUint64(b, limb)
	}
	return b
}

func controlSum(cs ControlState) [32]byte { return sha256.Sum256(EncodeControlState(cs)) }

func stateDigest(lastToken uint64, count int, ls *sum256, ctl *[32]byte) [32]byte {
	var buf [len(digestDomain) + 8 + 8 + 32 + 32]byte
	b := append(buf[:0], digestDomain...)
	b = binary.BigEndian.AppendUint64(b, lastToken)
	b = binary.BigEndian.AppendUint64(b, uint64(count))
	b = ls.appendTo(b)
	b = append(b, ctl[:]...)
	return sha256.Sum256(b)
}

func stateDigestV2(lastToken uint64, count int, ls *sum256, ctl *[32]byte, r *requests) [32]byte {
	var buf [len(digestDomainV2) + 8 + 8 + 32 + 32 + 8 + 8 + 8 + 32]byte
	b := append(buf[:0], digestDomainV2...)
	b = binary.BigEndian.AppendUint64(b, lastToken)
	b = binary.BigEndian.AppendUint64(b, uint64(count))
	b = ls.appendTo(b)
	b = append(b, ctl[:]...)
	b = binary.BigEndian.AppendUint64(b, r.clockMS)
	b = binary.BigEndian.AppendUint64(b, r.headSeq())
	b = binary.BigEndian.AppendUint64(b, uint64(r.endedLen()))
	b = r.sum.appendTo(b)
	return sha256.Sum256(b)
}

func stateDigestV3(lastToken uint64, count int, ls *sum256, ctl *[32]byte, r *requests, ss *sessions) [32]byte {
	var buf [len(digestDomainV3) + 8 + 8 + 32 + 32 + 8 + 8 + 8 + 32 + 8 + 8 + 8 + 8 + 32]byte
	b := append(buf[:0], digestDomainV3...)
	b = binary.BigEndian.AppendUint64(b, lastToken)
	b = binary.BigEndian.AppendUint64(b, uint64(count))
	b = ls.appendTo(b)
	b = append(b, ctl[:]...)
	b = binary.BigEndian.AppendUint64(b, r.clockMS)
	b = binary.BigEndian.AppendUint64(b, r.headSeq())
	b = binary.BigEndian.AppendUint64(b, uint64(r.endedLen()))
	b = r.sum.appendTo(b)
	b = binary.BigEndian.AppendUint64(b, ss.lastID)
	b = binary.BigEndian.AppendUint64(b, ss.lastSeq)
	b = binary.BigEndian.AppendUint64(b, uint64(len(ss.byID)))
	b = binary.BigEndian.AppendUint64(b, uint64(len(ss.delays)))
	b = ss.sum.appendTo(b)
	return sha256.Sum256(b)
}

func stateDigestV4(lastToken uint64, count int, ls *sum256, ctl *[32]byte, r *requests, ss *sessions, k *kinds) [32]byte {
	v3 := stateDigestV3(lastToken, count, ls, ctl, r, ss)
	var buf [len(digestDomainV4) + 32 + 8 + 8 + 32]byte
	b := append(buf[:0], digestDomainV4...)
	b = append(b, v3[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(k.nHolders))
	b = binary.BigEndian.AppendUint64(b, uint64(k.nDelays))
	b = k.sum.appendTo(b)
	return sha256.Sum256(b)
}
