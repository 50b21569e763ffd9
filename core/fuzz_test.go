package core_test

// Fuzz targets for every decoder and for Apply itself. Seeds come from the
// f.Add calls below (valid encodings, so they follow the encoder) and from
// testdata/fuzz/<FuzzName>/ (hand-made near misses and past findings).
//
//	go test -run='^$' -fuzz=FuzzDecodeEntry -fuzztime=30s ./core/

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// checkDecodeError fails unless err is a *core.Error with a known code and
// a detail.
func checkDecodeError(t *testing.T, err error) {
	t.Helper()
	var ce *core.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *core.Error", err, err)
	}
	switch ce.Code {
	case core.CodeMalformed, core.CodeInvalidArgument, core.CodeUnknownVersion, core.CodeUnsupported:
	default:
		t.Fatalf("unknown code %q in %v", ce.Code, err)
	}
	if ce.Detail == "" {
		t.Fatalf("error without detail: %v", err)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	for _, e := range sampleEntries() {
		f.Add(core.EncodeEntry(e))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := core.DecodeEntry(b)
		if err != nil {
			checkDecodeError(t, err)
			if e != (core.Entry{}) {
				t.Fatalf("failed decode returned %+v", e)
			}
			return
		}
		if err := e.Command.Validate(); err != nil {
			t.Fatalf("decoded %+v fails Validate: %v", e, err)
		}
		if re := core.EncodeEntry(e); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		// A decoded command always has an effect on a fresh machine.
		want := map[core.Kind]core.Result{core.KindGrant: granted(1), core.KindRelease: notFound, core.KindExpire: expiredFalse}[e.Command.Kind]
		if got := core.NewMachine().Apply(e.Command); got != want {
			t.Fatalf("Apply(%+v) on a fresh machine = %v, want %v", e.Command, got, want)
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	for _, snap := range [][]byte{
		core.NewMachine().Snapshot(),
		core.EncodeSnapshot(3, []core.Lock{{Key: "a", Token: 1, Owner: "o", LeaseMS: 100}, {Key: "b", Token: 3, LeaseMS: 200, GrantedAtMS: 9}}),
		core.EncodeSnapshot(math.MaxUint64, []core.Lock{{Key: "잠금", Token: math.MaxUint64, Owner: "소유자", LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64}}),
	} {
		f.Add(snap)
		f.Add(snap[:len(snap)-4]) // a body, for the sealed check below
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkSnapshot(t, b)
		// The checksum hides the body from the mutator: also try the input
		// as a body, sealed with a correct checksum.
		checkSnapshot(t, seal(b))
	})
}

// checkSnapshot is FuzzDecodeSnapshot's property for one input.
func checkSnapshot(t *testing.T, b []byte) {
	t.Helper()
	last, locks, err := core.DecodeSnapshot(b)
	if err != nil {
		checkDecodeError(t, err)
		if last != 0 || locks != nil {
			t.Fatalf("failed decode returned %d %+v", last, locks)
		}
		return
	}
	if re := core.EncodeSnapshot(last, locks); !bytes.Equal(re, b) {
		t.Fatalf("not canonical: %x re-encodes to %x", b, re)
	}
	tokens := map[uint64]bool{}
	for i, l := range locks {
		if i > 0 && locks[i-1].Key >= l.Key {
			t.Fatalf("keys not strictly ascending at %d", i)
		}
		if l.Token == 0 || l.Token > last || tokens[l.Token] {
			t.Fatalf("bad token in %+v (last %d)", l, last)
		}
		tokens[l.Token] = true
		// Every lock also passes the lock-record validation.
		if got, err := core.DecodeLockRecord(core.EncodeLockRecord(l)); err != nil || got != l {
			t.Fatalf("lock %+v: record round trip %+v, %v", l, got, err)
		}
	}
	m := core.NewMachine()
	if err := m.Restore(b); err != nil {
		t.Fatalf("Restore of a decodable snapshot: %v", err)
	}
	if !bytes.Equal(m.Snapshot(), b) || m.LastToken() != last || !slices.Equal(m.Locks(), locks) {
		t.Fatal("restored machine does not reproduce the snapshot")
	}
	// The next grant never reuses a token.
	key := "\x01fuzz"
	for _, held := m.Get(key); held; _, held = m.Get(key) {
		key += "!"
	}
	r := m.Apply(core.Grant(key, "", lease, 0))
	switch {
	case last == math.MaxUint64 && r != noop:
		t.Fatalf("grant with an exhausted counter = %v", r)
	case last < math.MaxUint64 && r != granted(last+1):
		t.Fatalf("grant after restore = %v, want token %d", r, last+1)
	}
}

func FuzzDecodeLockRecord(f *testing.F) {
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, Owner: "o", LeaseMS: 100, GrantedAtMS: 7}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "잠금", Token: math.MaxUint64, LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64}))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := core.DecodeLockRecord(b)
		if err != nil {
			checkDecodeError(t, err)
			if l != (core.Lock{}) {
				t.Fatalf("failed decode returned %+v", l)
			}
			return
		}
		if re := core.EncodeLockRecord(l); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		// A valid record is a valid one-lock snapshot, and a valid grant.
		if _, _, err := core.DecodeSnapshot(core.EncodeSnapshot(l.Token, []core.Lock{l})); err != nil {
			t.Fatalf("lock %+v is not snapshot-valid: %v", l, err)
		}
		if err := core.Grant(l.Key, l.Owner, l.LeaseMS, l.GrantedAtMS).Validate(); err != nil {
			t.Fatalf("lock %+v could not have been granted: %v", l, err)
		}
	})
}

// FuzzApplySequence reads the input as a command sequence, two bytes per
// command (op, arg), and applies it to three machines: directly, through
// the entry encoding, and with a Snapshot -> Restore (or lock-record
// rebuild) wherever the input says so. Results and final state must agree.
//
//	op bits 0-2: 0,1 grant; 2 release(arg); 3 expire(arg); 4 checkpoint;
//	             5 raw command of kind arg%6 (often invalid);
//	             6 release, 7 expire with the current holder's token
//	op bits 4-5: key index
//
// A first byte >= 0xf0 starts the counter just below the end of the token
// space.
func FuzzApplySequence(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x06, 0x00, 0x00, 0x01})
	f.Add([]byte{0x00, 0x00, 0x10, 0x00, 0x04, 0x00, 0x03, 0x01, 0x00, 0x00, 0x03, 0x01})
	f.Add([]byte{0xf2, 0x00, 0x00, 0x10, 0x00, 0x20, 0x00, 0x30, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		keys := [...]string{"a", "b", "잠금", "lock/1"}
		direct, viaLog, viaSnap := core.NewMachine(), core.NewMachine(), core.NewMachine()
		if len(data) > 0 && data[0] >= 0xf0 {
			start := math.MaxUint64 - uint64(data[0]&0x0f)
			for _, m := range []*core.Machine{direct, viaLog, viaSnap} {
				m.Load(start, nil)
			}
			data = data[1:]
		}
		for i := 0; i+1 < len(data); i += 2 {
			op, arg := data[i], data[i+1]
			key := keys[op>>4&3]
			var c core.Command
			switch op & 7 {
			case 0, 1:
				c = core.Grant(key, string(rune('a'+arg%3)), core.MinLeaseMS+uint64(arg), uint64(arg))
			case 2:
				c = core.Release(key, uint64(arg))
			case 3:
				c = core.Expire(key, uint64(arg))
			case 4:
				if arg&1 == 0 {
					viaSnap = snapshotRestore(t, viaSnap, arg&2 == 0)
				} else {
					viaSnap = rebuildFromRecords(t, nil, viaSnap)
				}
				continue
			case 5:
				c = core.Command{Kind: core.Kind(arg % 6), Key: key, Token: uint64(arg >> 4), LeaseMS: uint64(arg&8) * 100}
			case 6, 7:
				l, _ := direct.Get(key)
				c = core.Release(key, l.Token)
				if op&7 == 7 {
					c = core.Expire(key, l.Token)
				}
			}
			lastBefore := direct.LastToken()
			ra := direct.Apply(c)
			rb := applyViaLog(t, viaLog, uint64(i), c, c.Validate() == nil)
			rc := viaSnap.Apply(c)
			if ra != rb || ra != rc {
				t.Fatalf("op %d %+v: direct %v, via log %v, via snapshot %v", i/2, c, ra, rb, rc)
			}
			if ra.Kind == core.ResultGranted && ra.Token != lastBefore+1 {
				t.Fatalf("op %d: granted token %d after %d", i/2, ra.Token, lastBefore)
			}
			if ra.Kind != core.ResultGranted && direct.LastToken() != lastBefore {
				t.Fatalf("op %d: %v moved the counter", i/2, ra)
			}
		}
		if direct.Digest() != viaLog.Digest() || direct.Digest() != viaSnap.Digest() {
			t.Fatalf("replicas diverged:\n%x\n%x\n%x", direct.Snapshot(), viaLog.Snapshot(), viaSnap.Snapshot())
		}
	})
}
