package core

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
)

// Encodings of the multi-holder keys (cluster version 5, kinds.go): one
// key with its holders and delayed slots as storage keeps it in a row of
// its own (the holder record), and the kinds section of a snapshot
// (version 6), after the session section.
//
//	holder record: version:1 | key_group
//	kinds section: count:uvarint | key_group*
//	key_group = key:str | limit:uvarint | mode:1 | holders:uvarint | holder*
//	            | slots:uvarint | slot*
//	holder    = token:uvarint | owner:str | lease_ms:uvarint | granted_at_ms:uvarint
//	            | identity:str | request_id:str | session_id:uvarint | lock_delay_ms:uvarint
//	slot      = delay_ms:uvarint | seq:uvarint
//
// Keys come in ascending order, holders in ascending token order, slots in
// ascending sequence order. A key group is never empty.

// HolderRecVersion1 is the one format of a holder record.
const HolderRecVersion1 byte = 1

// Smallest encodings, which bound an honest count by the input length.
const (
	minHolderSize = 8
	minSlotSize   = 2
	minGroupSize  = 2 + 1 + 1 + 1 + 1
)

func appendKindHeader(b []byte, key string, limit uint32, mode Mode) []byte {
	b = appendString(b, key)
	b = binary.AppendUvarint(b, uint64(limit))
	return append(b, byte(mode))
}

func appendHolder(b []byte, l *Lock) []byte {
	b = binary.AppendUvarint(b, l.Token)
	b = appendString(b, l.Owner)
	b = binary.AppendUvarint(b, l.LeaseMS)
	b = binary.AppendUvarint(b, l.GrantedAtMS)
	b = appendString(b, l.Identity)
	b = appendString(b, l.RequestID)
	b = binary.AppendUvarint(b, l.SessionID)
	return binary.AppendUvarint(b, l.LockDelayMS)
}

func appendSlot(b []byte, d *Delay) []byte {
	b = binary.AppendUvarint(b, d.DelayMS)
	return binary.AppendUvarint(b, d.Seq)
}

func appendKeyHolders(b []byte, kh *KeyHolders) []byte {
	b = appendKindHeader(b, kh.Key, kh.Limit, kh.Mode)
	b = binary.AppendUvarint(b, uint64(len(kh.Holders)))
	for i := range kh.Holders {
		b = appendHolder(b, &kh.Holders[i])
	}
	b = binary.AppendUvarint(b, uint64(len(kh.Delays)))
	for i := range kh.Delays {
		b = appendSlot(b, &kh.Delays[i])
	}
	return b
}

// keyHolders reads a key group; the caller validates it
// (validateKeyHolders).
func (d *decoder) keyHolders() KeyHolders {
	var kh KeyHolders
	kh.Key = d.str(MaxKeyLen)
	limit := d.uvarint()
	if d.err == nil && limit > MaxSemaphoreLimit {
		d.err = malformedf("limit %d above %d", limit, MaxSemaphoreLimit)
	}
	kh.Limit = uint32(limit)
	kh.Mode = Mode(d.byte())
	n := d.count(MaxHoldersPerKey, minHolderSize, "holders")
	if n > 0 {
		kh.Holders = make([]Lock, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		l := Lock{Key: kh.Key, Limit: kh.Limit, Mode: kh.Mode}
		l.Token = d.uvarint()
		l.Owner = d.str(MaxOwnerLen)
		l.LeaseMS = d.uvarint()
		l.GrantedAtMS = d.uvarint()
		l.Identity = d.str(MaxIdentityLen)
		l.RequestID = d.str(MaxRequestIDLen)
		l.SessionID = d.uvarint()
		l.LockDelayMS = d.uvarint()
		kh.Holders = append(kh.Holders, l)
	}
	n = d.count(MaxHoldersPerKey, minSlotSize, "delayed slots")
	if n > 0 {
		kh.Delays = make([]Delay, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		s := Delay{Key: kh.Key}
		s.DelayMS = d.uvarint()
		s.Seq = d.uvarint()
		kh.Delays = append(kh.Delays, s)
	}
	if d.err != nil {
		return KeyHolders{}
	}
	return kh
}

// EncodeHolderRecord encodes one multi-holder key as stored in its storage
// row.
func EncodeHolderRecord(kh KeyHolders) []byte {
	b := make([]byte, 0, 16+len(kh.Key)+48*len(kh.Holders)+12*len(kh.Delays))
	return appendKeyHolders(append(b, HolderRecVersion1), &kh)
}

// DecodeHolderRecord decodes and validates one stored holder record (on
// its own: LoadHolders checks it against the rest of the state).
func DecodeHolderRecord(b []byte) (KeyHolders, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != HolderRecVersion1 {
		return KeyHolders{}, &Error{Code: CodeUnknownVersion, Detail: "holder record version " + strconv.Itoa(int(v))}
	}
	kh := d.keyHolders()
	if err := d.finish(); err != nil {
		return KeyHolders{}, err
	}
	if err := validateKeyHolders(&kh); err != nil {
		return KeyHolders{}, err
	}
	return kh, nil
}

// kindsSection reads a kinds section; the caller validates it against
// the rest of the snapshot (kindsCheck).
func (d *decoder) kindsSection() []KeyHolders {
	n := d.count(MaxSnapshotLocks, minGroupSize, "multi-holder keys")
	var ks []KeyHolders
	if n > 0 {
		ks = make([]KeyHolders, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		kh := d.keyHolders()
		if d.err == nil {
			if err := validateKeyHolders(&kh); err != nil {
				d.err = err
			}
		}
		ks = append(ks, kh)
	}
	if d.err != nil {
		return nil
	}
	return ks
}

// AddKeyHolders appends the next multi-holder key to the kinds section
// (snapshot version 6, cluster version 5), at any point before Finish:
// keys strictly ascending, each valid on its own, its tokens not above
// the last token. The section is written after the session section.
func (e *SnapshotEncoder) AddKeyHolders(kh KeyHolders) error {
	switch err := validateKeyHolders(&kh); {
	case e.err != nil:
		return e.err
	case err != nil:
		e.err = err
	case e.version < SnapshotVersion6:
		e.err = invalidf("multi-holder key %q before cluster version 5", kh.Key)
	case e.kindsCount > 0 && kh.Key <= e.prevKindKey:
		e.err = invalidf("multi-holder keys not strictly ascending at %q", kh.Key)
	case len(kh.Holders) > 0 && kh.Holders[len(kh.Holders)-1].Token > e.lastToken:
		e.err = invalidf("holder of %q has a token above last token %d", kh.Key, e.lastToken)
	}
	if e.err != nil {
		return e.err
	}
	e.kinds = appendKeyHolders(e.kinds, &kh)
	e.prevKindKey = kh.Key
	e.kindsCount++
	return nil
}

// AddHolderRecord is AddKeyHolders of a stored holder record
// (EncodeHolderRecord bytes).
func (e *SnapshotEncoder) AddHolderRecord(record []byte) error {
	if e.err != nil {
		return e.err
	}
	kh, err := DecodeHolderRecord(record)
	if err != nil {
		e.err = err
		return err
	}
	return e.AddKeyHolders(kh)
}

// appendKinds appends the kinds section (snapshot version 6).
func (e *SnapshotEncoder) appendKinds(b []byte) []byte {
	b = binary.AppendUvarint(b, e.kindsCount)
	return append(b, e.kinds...)
}

// checkKinds checks a decoded snapshot's kinds section against the rest
// of it (kindsCheck; plainHeld: whether a plain lock holds a token, withID
// the plain locks' requests), tokens in section order so that the error
// is the same on every decoder.
func checkKinds(s *SnapshotState, perSession map[uint64]int, plainHeld func(uint64) bool, withID map[[32]byte]struct{}) error {
	isKey := func(key string) bool {
		_, ok := slices.BinarySearchFunc(s.Locks, key, func(l Lock, k string) int { return strings.Compare(l.Key, k) })
		return ok
	}
	v := kindsCheck{clusterVersion: s.Control.ClusterVersion, lastToken: s.LastToken, sessions: &s.Sessions,
		ended: s.Requests.Ended, requests: len(withID) + len(s.Requests.Ended), perSession: perSession, plainKey: isKey,
		plainRequest: func(h [32]byte) bool { _, ok := withID[h]; return ok }}
	if _, err := v.validate(s.Holders); err != nil {
		return err
	}
	for _, kh := range s.Holders {
		for _, l := range kh.Holders {
			if plainHeld(l.Token) {
				return malformedf("token %d appears twice", l.Token)
			}
		}
	}
	return nil
}
