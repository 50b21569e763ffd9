package core

import (
	"encoding/binary"
	"hash/crc32"
	"strconv"
)

// Snapshot encoding: the lock table with its token counter, and (version
// 2) the control state of encoding_control.go.

// SnapshotState is the whole content of a snapshot: the lock table with
// its token counter, and the control state.
type SnapshotState struct {
	LastToken uint64
	Locks     []Lock // sorted by key
	Control   ControlState
}

// EncodeSnapshot encodes a lock table with an empty control state in
// format SnapshotVersion; see EncodeSnapshotState. locks must be sorted by
// key (Machine.Locks does that).
func EncodeSnapshot(lastToken uint64, locks []Lock) []byte {
	return EncodeSnapshotState(SnapshotState{LastToken: lastToken, Locks: locks})
}

// EncodeSnapshotState encodes a snapshot in format SnapshotVersion2 while
// the cluster version is 1, SnapshotVersion3 from cluster version 2 on:
//
//	"TKS" | version:1 | last_token:uvarint | count:uvarint | lock* | control | crc32c:4 (big endian, of all before)
//	lock = key:str | token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	       | identity:str (version 3 only)
//	control: see EncodeControlState (its version 1 form in snapshot
//	         version 2, its version 2 form in snapshot version 3)
//
// Version 1, which DecodeSnapshot still reads, is version 2 without the
// control section. s.Locks must be sorted by key; the control lists are
// sorted here. Equal states give equal bytes. A lock with an identity
// exists only from cluster version 2 on (Apply refuses it before).
func EncodeSnapshotState(s SnapshotState) []byte {
	b := make([]byte, 0, 32+len(s.Locks)*48+controlSizeHint(s.Control))
	b = append(b, snapshotMagic[:]...)
	version, ctlVersion := SnapshotVersion2, controlVersion(s.Control)
	if ctlVersion >= ControlStateVersion2 {
		version = SnapshotVersion3
	}
	b = append(b, version)
	b = binary.AppendUvarint(b, s.LastToken)
	b = binary.AppendUvarint(b, uint64(len(s.Locks)))
	for _, l := range s.Locks {
		b = appendLock(b, l)
		if version >= SnapshotVersion3 {
			b = appendString(b, l.Identity)
		}
	}
	b = appendControl(b, s.Control, ctlVersion)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeSnapshot decodes and validates a snapshot of version 1, 2 or 3 and
// returns its lock table. It drops the control state: use
// DecodeSnapshotState (or Machine.Restore) wherever that must survive.
func DecodeSnapshot(b []byte) (lastToken uint64, locks []Lock, err error) {
	s, err := DecodeSnapshotState(b)
	if err != nil {
		return 0, nil, err
	}
	return s.LastToken, s.Locks, nil
}

// DecodeSnapshotState decodes and validates a snapshot: checksum, version
// (1, 2 or 3), keys strictly ascending, tokens non-zero, unique and not
// above last_token, and (version 2 and 3) a valid control state. A version
// 1 snapshot has an empty control state; only version 3 carries lock
// identities and a cluster version.
func DecodeSnapshotState(b []byte) (SnapshotState, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return SnapshotState{}, malformedf("snapshot is %d bytes, too short", len(b))
	}
	if [3]byte(b[:3]) != snapshotMagic {
		return SnapshotState{}, malformedf("snapshot magic missing")
	}
	version := b[3]
	if version < SnapshotVersion1 || version > SnapshotVersion3 {
		return SnapshotState{}, &Error{Code: CodeUnknownVersion, Detail: "snapshot version " + strconv.Itoa(int(version))}
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return SnapshotState{}, malformedf("snapshot checksum mismatch")
	}
	d := decoder{b: body[4:]}
	var s SnapshotState
	s.LastToken = d.uvarint()
	n := d.uvarint()
	if d.err != nil {
		return SnapshotState{}, d.err
	}
	// Each lock takes at least 5 bytes, which bounds an honest count by the
	// input length; a larger count is a lie and must not drive allocation.
	if n > MaxSnapshotLocks || n > uint64(len(body))/5 {
		return SnapshotState{}, malformedf("snapshot declares %d locks in %d bytes", n, len(body))
	}
	locks := make([]Lock, 0, n)
	seen := make(map[uint64]struct{}, n)
	for i := uint64(0); i < n; i++ {
		l := d.lock()
		if version >= SnapshotVersion3 {
			l.Identity = d.str(MaxIdentityLen)
		}
		if d.err != nil {
			return SnapshotState{}, d.err
		}
		if err := validateLock(l); err != nil {
			return SnapshotState{}, err
		}
		if i > 0 && l.Key <= locks[i-1].Key {
			return SnapshotState{}, malformedf("snapshot keys not strictly ascending at lock %d", i)
		}
		if l.Token > s.LastToken {
			return SnapshotState{}, malformedf("lock %q has token %d above last token %d", l.Key, l.Token, s.LastToken)
		}
		if _, dup := seen[l.Token]; dup {
			return SnapshotState{}, malformedf("token %d appears twice", l.Token)
		}
		seen[l.Token] = struct{}{}
		locks = append(locks, l)
	}
	s.Locks = locks
	if version >= SnapshotVersion2 {
		ctlVersion := ControlStateVersion1
		if version >= SnapshotVersion3 {
			ctlVersion = ControlStateVersion2
		}
		cs, err := d.control(ctlVersion)
		if err != nil {
			return SnapshotState{}, err
		}
		s.Control = cs
	}
	if err := d.finish(); err != nil {
		return SnapshotState{}, err
	}
	return s, nil
}
