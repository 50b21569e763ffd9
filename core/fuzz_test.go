package core_test

// Fuzz targets for every decoder and for Apply itself. Seeds come from the
// f.Add calls below (valid encodings, so they follow the encoder) and from
// testdata/fuzz/<FuzzName>/ (hand-made near misses and past findings).
//
//	go test -run='^$' -fuzz=FuzzDecodeEntry -fuzztime=30s ./core/

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
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
	for _, e := range append(sampleEntries(), sampleControlEntries()...) {
		f.Add(core.EncodeEntry(e))
	}
	for _, c := range []core.Command{rgrant("k", "acct", "r1", 5), rgrant("잠금", "", "r", 0), core.SetFenceKey(seed(1)), core.SetClusterVersion(3),
		core.SetClusterVersion(4), core.OpenSession("acct", ttl, delay), core.CloseSession(1, "acct"), core.ExpireSession(1, 1),
		core.RefreshSession(2), core.ClearDelay("d/2", 1), sgrant("k", 1), dgrant("k", delay), sgrant("k", 2).WithRequest("a", "r"),
		core.SetClusterVersion(5), sem("k", 3), shared("k"), sem("k", core.MaxSemaphoreLimit).InSession(1).WithRequest("a", "r")} {
		f.Add(core.EncodeEntry(core.Entry{RequestID: 3, Command: c}))
	}
	grownM := grownMachine(f)
	grown := grownM.Snapshot()
	applyAll(grownM, core.SetClusterVersion(3), core.SetFenceKey(seed(1)), rgrant("c", "acct", "r1", 5))
	grown3 := grownM.Snapshot()
	grown4 := v4Full(f).Snapshot()
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
		// A decoded command always has an effect on a fresh machine, except
		// that one of a later cluster version than the machine's is a Noop.
		want := map[core.Kind]core.Result{core.KindGrant: granted(1), core.KindRelease: notFound, core.KindExpire: expiredFalse}[e.Command.Kind]
		if e.Command.Kind == core.KindControl {
			want = map[core.ControlOp]core.Result{
				core.ControlBootstrap:           bootstrapRecorded(1, 1),
				core.ControlMintJoin:            controlRejected(core.ReasonNotBootstrapped),
				core.ControlAdmit:               controlRejected(core.ReasonCredentialUnknown),
				core.ControlPromote:             controlRejected(core.ReasonUnknownNode),
				core.ControlPrepareReplacement:  controlRejected(core.ReasonUnknownNode),
				core.ControlCompleteReplacement: controlRejected(core.ReasonNoReplacement),
				core.ControlAbortReplacement:    controlRejected(core.ReasonNoReplacement),
				core.ControlRetire:              controlRejected(core.ReasonUnknownNode),
				core.ControlSetClusterVersion:   {Kind: core.ResultControlApplied},
			}[e.Command.Control.Op]
		}
		if core.CommandVersion(e.Command) > 1 {
			want = noop
		}
		if got := core.NewMachine().Apply(e.Command); got != want {
			t.Fatalf("Apply(%+v) on a fresh machine = %v, want %v", e.Command, got, want)
		}
		// On machines with every kind of control state, at cluster version
		// 1 and 3 (with a fence key and a request record), and on one at
		// version 4 with sessions and delays: a control rejection changes
		// nothing and anything else changes something, and the state
		// stays valid and survives its snapshot and records.
		for _, snap := range [][]byte{grown, grown3, grown4} {
			m := core.NewMachine()
			if err := m.Restore(snap); err != nil {
				t.Fatal(err)
			}
			before := m.Digest()
			pending, isPending := m.PendingReplacement()
			got := m.Apply(e.Command)
			if e.Command.Kind == core.KindControl {
				if changed := m.Digest() != before; changed != mustChange(e.Command.Control, got, pending, isPending) {
					t.Fatalf("Apply(%v) = %v, state changed: %t", e.Command.Control, got, changed)
				}
				checkControlInvariants(t, m)
			}
			checkSessionsSurvive(t, m)
		}
	})
}

func FuzzDecodeSnapshot(f *testing.F) {
	for _, snap := range [][]byte{
		core.NewMachine().Snapshot(),
		core.EncodeSnapshot(3, []core.Lock{{Key: "a", Token: 1, Owner: "o", LeaseMS: 100}, {Key: "b", Token: 3, LeaseMS: 200, GrantedAtMS: 9}}),
		core.EncodeSnapshot(math.MaxUint64, []core.Lock{{Key: "잠금", Token: math.MaxUint64, Owner: "소유자", LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64}}),
		snapshotV1(3, []core.Lock{{Key: "a", Token: 1, Owner: "o", LeaseMS: 100}}),
		grownMachine(f).Snapshot(),
		func() []byte { m := core.NewMachine(); lifecycle(f, m); return m.Snapshot() }(),
		v2Machine(f).Snapshot(),
		v3Full(f).Snapshot(),
		v4Full(f).Snapshot(),
		v5Full(f).Snapshot(),
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
	st, err := core.DecodeSnapshotState(b)
	last, locks, err2 := core.DecodeSnapshot(b)
	if (err == nil) != (err2 == nil) || last != st.LastToken || !slices.Equal(locks, st.Locks) {
		t.Fatalf("DecodeSnapshot and DecodeSnapshotState disagree: %v, %v", err2, err)
	}
	// SnapshotRecords (raftstore's install) walks the same snapshot as
	// stored records, without the decoder (load_snapshot.go).
	var recs [][]byte
	rst, count, err3 := core.SnapshotRecords(b, func(key, record []byte) error {
		if l, err := core.DecodeLockRecord(record); err != nil || l.Key != string(key) {
			t.Fatalf("SnapshotRecords gave record %x under %q: %+v, %v", record, key, l, err)
		}
		recs = append(recs, bytes.Clone(record))
		return nil
	})
	sameError(t, "SnapshotRecords", err, err3)
	if err != nil {
		checkDecodeError(t, err)
		if !reflect.DeepEqual(st, core.SnapshotState{}) || last != 0 || locks != nil {
			t.Fatalf("failed decode returned %+v", st)
		}
		// Restore refuses it too and leaves the machine as it was.
		m := core.NewMachine()
		m.Apply(core.Grant("held", "o", lease, 1))
		before := m.Digest()
		rerr := m.Restore(b)
		sameError(t, "Restore", err, rerr)
		if m.Digest() != before {
			t.Fatal("a refused Restore changed the machine")
		}
		return
	}
	rst.Locks = st.Locks
	if count != len(locks) || len(recs) != len(locks) || !reflect.DeepEqual(rst, st) {
		t.Fatalf("SnapshotRecords: %d locks (%d records), want %d; state %+v, want %+v", count, len(recs), len(locks), rst, st)
	}
	for i, l := range locks {
		if !bytes.Equal(recs[i], core.EncodeLockRecord(l)) {
			t.Fatalf("SnapshotRecords record %d is %x, EncodeLockRecord %x", i, recs[i], core.EncodeLockRecord(l))
		}
	}
	// Canonical: version 1 re-encodes as version 1, version 2 as itself.
	v2 := core.EncodeSnapshotState(st)
	if b[3] == core.SnapshotVersion1 {
		if re := snapshotV1(last, locks); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes (v1) to %x", b, re)
		}
		if !reflect.DeepEqual(st.Control, core.ControlState{}) {
			t.Fatal("a v1 snapshot has control state")
		}
	} else if !bytes.Equal(v2, b) {
		t.Fatalf("not canonical: %x re-encodes to %x", b, v2)
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
	if !bytes.Equal(m.Snapshot(), v2) || m.LastToken() != last || !slices.Equal(m.Locks(), locks) || !reflect.DeepEqual(m.ControlState(), st.Control) {
		t.Fatal("restored machine does not reproduce the snapshot")
	}
	if viaState := new(core.Machine); func() bool { viaState.RestoreState(st); return viaState.Digest() != m.Digest() }() ||
		!reflect.DeepEqual(m.RequestState(), st.Requests) {
		t.Fatal("Restore and RestoreState of the decoded state disagree")
	}
	checkControlInvariants(t, m)
	// The storage path (lock, control, request, session and delay
	// records) accepts what the snapshot decoder accepts, and reaches the
	// same state.
	if x := rebuildFromRecords(t, nil, m); x.Digest() != m.Digest() {
		t.Fatal("rebuilt from records, the state differs")
	}
	checkSessionsSurvive(t, m)
	// The next grant never reuses a token.
	key := "\x01fuzz"
	for {
		_, held := m.Get(key)
		_, delayed := m.Delay(key)
		if !held && !delayed {
			break
		}
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

func FuzzDecodeControlState(f *testing.F) {
	for _, rec := range [][]byte{
		core.NewMachine().ControlSnapshot(),
		func() []byte { m := core.NewMachine(); mustApply(f, m, bootstrapped...); return m.ControlSnapshot() }(),
		func() []byte { m := core.NewMachine(); lifecycle(f, m); return m.ControlSnapshot() }(),
		func() []byte {
			m := core.NewMachine()
			mustApply(f, m, clusterReplacing...)
			return m.ControlSnapshot()
		}(),
		grownMachine(f).ControlSnapshot(),
		v2Machine(f).ControlSnapshot(),
		v3Full(f).ControlSnapshot(),
		v4Full(f).ControlSnapshot(),
	} {
		f.Add(rec)
		f.Add(rec[:len(rec)-4]) // a body, for the sealed check below
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkControlRecord(t, b)
		checkControlRecord(t, seal(b))
	})
}

// checkControlRecord is FuzzDecodeControlState's property for one input:
// a decodable record is canonical, loads, and stays valid under every
// transition Apply can make from it.
func checkControlRecord(t *testing.T, b []byte) {
	t.Helper()
	cs, err := core.DecodeControlState(b)
	if err != nil {
		checkDecodeError(t, err)
		if !reflect.DeepEqual(cs, core.ControlState{}) {
			t.Fatalf("failed decode returned %+v", cs)
		}
		return
	}
	if re := core.EncodeControlState(cs); !bytes.Equal(re, b) {
		t.Fatalf("not canonical: %x re-encodes to %x", b, re)
	}
	m := core.NewMachine()
	if err := m.LoadControl(b); err != nil {
		t.Fatalf("LoadControl of a decodable record: %v", err)
	}
	if !bytes.Equal(m.ControlSnapshot(), b) || !reflect.DeepEqual(m.ControlState(), cs) {
		t.Fatal("loaded machine does not reproduce the record")
	}
	checkControlInvariants(t, m)
	// The same state travels in a snapshot.
	snap := m.Snapshot()
	if st, err := core.DecodeSnapshotState(snap); err != nil || !reflect.DeepEqual(st.Control, cs) {
		t.Fatalf("snapshot of a loaded record: %+v, %v", st, err)
	}
	// Try a bounded set of transitions, each on a fresh copy.
	var cmds []core.Command
	h := [32]byte{0: 0xfe, 31: 0xed}
	cmds = append(cmds, core.Bootstrap(h, "z:1"), core.MintJoin(h), core.MintJoin(cs.BootstrapHash))
	for i, jc := range cs.JoinCredentials {
		if i == 4 {
			break
		}
		cmds = append(cmds, core.Admit(jc.Hash, "z:2"), core.MintJoin(jc.Hash))
	}
	for i, mem := range cs.Members {
		if i == 4 {
			break
		}
		cmds = append(cmds, core.Promote(mem.NodeID, mem.Incarnation), core.Retire(mem.NodeID, mem.Incarnation),
			core.PrepareReplacement(mem.NodeID, mem.Address), core.PrepareReplacement(mem.NodeID, "z:3"))
		if len(cs.Members) > 0 {
			cmds = append(cmds, core.Admit(h, mem.Address))
		}
	}
	if p := cs.Pending; p != nil {
		cmds = append(cmds, core.CompleteReplacement(p.Old, p.New, p.NewIncarnation), core.AbortReplacement(p.Old, p.New, p.NewIncarnation))
	}
	cmds = append(cmds, core.SetFenceKey(seed(9)), core.SetClusterVersion(3))
	for _, k := range cs.FenceKeys {
		cmds = append(cmds, core.SetFenceKey(k))
	}
	for _, c := range cmds {
		if c.Validate() != nil {
			continue
		}
		x := core.NewMachine()
		if err := x.LoadControl(b); err != nil {
			t.Fatal(err)
		}
		before := x.Digest()
		pending, isPending := x.PendingReplacement()
		got := x.Apply(c)
		if changed := x.Digest() != before; changed != mustChange(c.Control, got, pending, isPending) {
			t.Fatalf("Apply(%v) = %v, state changed: %t", c.Control, got, changed)
		}
		checkControlInvariants(t, x)
	}
}

func FuzzDecodeLockRecord(f *testing.F) {
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, Owner: "o", LeaseMS: 100, GrantedAtMS: 7}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, Owner: "o", Identity: "ACCOUNT/user", LeaseMS: 100, GrantedAtMS: 7}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "잠금", Token: math.MaxUint64, LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, Owner: "o", Identity: "ACCOUNT/user", RequestID: "req-1", LeaseMS: 100, GrantedAtMS: 7}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, RequestID: "r", LeaseMS: 100}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, Owner: "o", SessionID: 3, GrantedAtMS: 7}))
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 5, RequestID: "r", LeaseMS: 100, LockDelayMS: core.MaxLockDelayMS}))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := core.DecodeLockRecord(b)
		if err != nil {
			checkDecodeError(t, err)
			if l != (core.Lock{}) {
				t.Fatalf("failed decode returned %+v", l)
			}
			// The Loader refuses it under any key.
			ld := core.NewLoader(math.MaxUint64, 1)
			if ld.AddRecord(recordKey(b), b) == nil {
				t.Fatalf("Loader took %x, which DecodeLockRecord refuses: %v", b, err)
			}
			if _, lerr := ld.Machine(); lerr == nil {
				t.Fatal("Loader gave a machine after refusing a record")
			}
			return
		}
		if re := core.EncodeLockRecord(l); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		// The Loader takes it under its own key, and only there, into
		// the machine Load builds.
		ld := core.NewLoader(math.MaxUint64, 1)
		if err := ld.AddRecord([]byte(l.Key), b); err != nil {
			t.Fatalf("Loader refused %+v: %v", l, err)
		}
		loaded, err := ld.Machine()
		want := core.NewMachine()
		want.Load(math.MaxUint64, []core.Lock{l})
		if err != nil || loaded.Digest() != want.Digest() || loaded.Locks()[0] != l {
			t.Fatalf("Loader machine for %+v: %v", l, err)
		}
		if core.NewLoader(math.MaxUint64, 1).AddRecord([]byte(l.Key+"x"), b) == nil {
			t.Fatal("Loader took a record under another key")
		}
		// A valid record is a valid one-lock snapshot (of the oldest
		// version, which drops the fields it lacks: a session lock, which
		// has no lease, has none before version 5), and a valid grant.
		if _, _, err := core.DecodeSnapshot(core.EncodeSnapshot(l.Token, []core.Lock{l})); err != nil && l.SessionID == 0 {
			t.Fatalf("lock %+v is not snapshot-valid: %v", l, err)
		}
		// In the newest snapshot version, with its session open.
		v5 := core.SnapshotState{LastToken: l.Token, Locks: []core.Lock{l}, Control: core.ControlState{ClusterVersion: 4}}
		if l.SessionID != 0 {
			v5.Sessions = core.SessionState{LastSessionID: l.SessionID, Sessions: []core.Session{{ID: l.SessionID, TTLMS: ttl, Epoch: 1}}}
		}
		if st, err := core.DecodeSnapshotState(core.EncodeSnapshotState(v5)); err != nil || st.Locks[0] != l {
			t.Fatalf("lock %+v does not travel in a version 5 snapshot: %+v, %v", l, st, err)
		}
		g := core.Grant(l.Key, l.Owner, l.LeaseMS, l.GrantedAtMS).WithRequest(l.Identity, l.RequestID).WithLockDelay(l.LockDelayMS)
		if l.SessionID != 0 {
			g = g.InSession(l.SessionID)
		}
		if err := g.Validate(); err != nil {
			t.Fatalf("lock %+v could not have been granted: %v", l, err)
		}
	})
}

// sameError fails unless got is want, or (the one difference
// load_snapshot.go allows) both are refusals and one of them is of a
// token held twice, which the walk checks at the end.
func sameError(t *testing.T, what string, want, got error) {
	t.Helper()
	switch {
	case (want == nil) != (got == nil):
		t.Fatalf("DecodeSnapshotState and %s disagree: %v, %v", what, want, got)
	case want == nil || want.Error() == got.Error():
	case strings.Contains(want.Error(), "appears twice") || strings.Contains(got.Error(), "appears twice"):
		checkDecodeError(t, got)
	default:
		t.Fatalf("DecodeSnapshotState and %s refuse differently: %v, %v", what, want, got)
	}
}

// recordKey is the key a lock record's key field holds, if it is
// readable, for feeding the Loader the key it expects.
func recordKey(b []byte) []byte {
	if len(b) < 2 {
		return []byte("k")
	}
	n, w := binary.Uvarint(b[1:])
	if w <= 0 || n > uint64(len(b)-1-w) {
		return []byte("k")
	}
	return b[1+w : 1+w+int(n)]
}

// FuzzApplySequence reads the input as a command sequence, two bytes per
// command (op, arg), and applies it to three machines: directly, through
// the entry encoding, and with a Snapshot -> Restore (or lock-record
// rebuild) wherever the input says so. Results and final state must agree.
//
//	op bits 0-2: 0,1 grant; 2 release(arg); 3 expire(arg); 4 checkpoint;
//	             5 raw command of kind arg%12 (often invalid);
//	             6 release, 7 expire with the current holder's token
//	op bit 3:    on a grant, a request id: identity arg bit 0, request id
//	             arg bits 1-2, time arg minutes (so records age past the
//	             retention); on a release (2), a Settle of that request
//	             instead (cluster version 6)
//	op bits 4-5: key index
//	op bits 6-7 both set: a control command instead, op bits 0-2 choosing
//	             the op and arg its fields (see fuzzControl); with op bit
//	             3, SetClusterVersion(2 + (arg bits 1-7) % 5) when arg
//	             bit 0 is clear, else SetFenceKey of seed arg bits 1-2
//	op bits 6-7 = 2: a session or lock-delay command, op bits 0-2
//	             choosing it and arg its fields (see fuzzSession)
//
// A first byte >= 0xf0 starts the counter just below the end of the token
// space.
func FuzzApplySequence(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x06, 0x00, 0x00, 0x01})
	f.Add([]byte{0x00, 0x00, 0x10, 0x00, 0x04, 0x00, 0x03, 0x01, 0x00, 0x00, 0x03, 0x01})
	f.Add([]byte{0xf2, 0x00, 0x00, 0x10, 0x00, 0x20, 0x00, 0x30, 0x00})
	// bootstrap, mint, admit, promote, grant, prepare, checkpoint, complete
	f.Add([]byte{0xc0, 0x00, 0xc1, 0x01, 0xc2, 0x05, 0xc3, 0x02, 0x00, 0x00, 0xc4, 0x09, 0x04, 0x01, 0xc5, 0x00})
	// bootstrap, mint, admit, prepare, checkpoint, abort, retire twice
	f.Add([]byte{0xc0, 0x00, 0xc1, 0x02, 0xc2, 0x06, 0xc4, 0x01, 0x04, 0x00, 0xc6, 0x00, 0xc7, 0x02, 0xc7, 0x02})
	// version 3, 4; open a session with a delay; two grants in it, one
	// with a delay; checkpoint; expire it; grant a delayed key; clear;
	// expire the delayed lock; checkpoint (records); clear with its seq
	f.Add([]byte{0xc8, 0x02, 0xc8, 0x04, 0x80, 0x02, 0x81, 0x01, 0x91, 0x01, 0xa2, 0x05, 0x04, 0x00,
		0x84, 0x01, 0x00, 0x00, 0x86, 0x00, 0x27, 0x00, 0x04, 0x01, 0xa6, 0x00})
	// version 5; two slots of a semaphore of 2, a third held; a shared
	// hold beside one of another key; release and expire holders;
	// checkpoints
	f.Add([]byte{0xc8, 0x06, 0x01, 0x20, 0x01, 0x20, 0x01, 0x20, 0x11, 0x00, 0x11, 0x00, 0x04, 0x00,
		0x06, 0x01, 0x07, 0x00, 0x04, 0x01, 0x17, 0x00})
	// version 3, 6; a grant with a request id, settled (released); a
	// settle of an unknown request (tombstone), its late grant refused;
	// checkpoints (snapshot, records)
	f.Add([]byte{0xc8, 0x02, 0xc8, 0x08, 0x08, 0x02, 0x0a, 0x02, 0x1a, 0x04, 0x18, 0x04, 0x04, 0x00, 0x04, 0x01, 0x18, 0x04})
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
			switch {
			case op>>6 == 2:
				c = fuzzSession(direct, op&7, arg, key)
			case op>>6 == 3 && op&8 != 0 && arg&1 == 0:
				c = core.SetClusterVersion(2 + uint64(arg>>1)%5)
			case op>>6 == 3 && op&8 != 0:
				c = core.SetFenceKey(seed(1 + int(arg>>1&3)))
			case op>>6 == 3:
				c = fuzzControl(direct, op&7, arg)
			case op&7 <= 1 && op&8 != 0:
				c = rgrant(key, []string{"", "x"}[arg&1], "r"+strconv.Itoa(int(arg>>1&3)), uint64(arg)*60_000)
			case op&7 == 2 && op&8 != 0:
				c = core.Settle(key, []string{"", "x"}[arg&1], "r"+strconv.Itoa(int(arg>>1&3)), uint64(arg)*60_000)
			default:
				switch op & 7 {
				case 0, 1:
					c = core.Grant(key, string(rune('a'+arg%3)), core.MinLeaseMS+uint64(arg), uint64(arg))
					if op&7 == 1 { // a semaphore slot or a shared hold (cluster version 5)
						kind := [...]struct {
							limit uint32
							mode  core.Mode
						}{{0, core.ModeShared}, {2, core.ModeExclusive}, {3, core.ModeExclusive}, {0, core.ModeExclusive}}[arg>>5&3]
						c = c.WithKind(kind.limit, kind.mode)
					}
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
					c = core.Command{Kind: core.Kind(arg % 12), Key: key, Token: uint64(arg >> 4), LeaseMS: uint64(arg&8) * 100}
				case 6, 7:
					var l core.Lock
					if hs := direct.Holders(key); len(hs) > 0 {
						l = hs[int(arg)%len(hs)]
					}
					c = core.Release(key, l.Token)
					if op&7 == 7 {
						c = core.Expire(key, l.Token)
					}
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

// fuzzSession builds FuzzApplySequence's session and lock-delay command:
// op 0-7 is open_session (identity arg bit 0, TTL from arg, a delay when
// arg bit 1 is set), grant in session arg bits 0-2, grant with a
// lock-delay of arg×100 ms, close_session, expire_session (of session arg
// bits 0-2, at its epoch unless arg bit 3 is set, then at arg bits 4-7),
// refresh_session, clear_delay of key (at its sequence number unless arg
// bit 3 is set, then arg bits 4-7), grant in session with a request id.
func fuzzSession(m *core.Machine, op, arg byte, key string) core.Command {
	id := uint64(arg & 7)
	switch op {
	case 0:
		var delayMS uint64
		if arg&2 != 0 {
			delayMS = uint64(arg) * 100
		}
		return core.OpenSession([]string{"", "x"}[arg&1], core.MinSessionTTLMS+uint64(arg), delayMS)
	case 1:
		return core.Grant(key, "", 0, uint64(arg)).InSession(id)
	case 2:
		return core.Grant(key, "", core.MinLeaseMS, uint64(arg)).WithLockDelay(uint64(arg) * 100)
	case 3:
		return core.CloseSession(id, "")
	case 4:
		epoch := uint64(arg >> 4)
		if x, ok := m.Session(id); ok && arg&8 == 0 {
			epoch = x.Epoch
		}
		return core.ExpireSession(id, epoch)
	case 5:
		return core.RefreshSession(id)
	case 6:
		seq := uint64(arg >> 4)
		if d, ok := m.Delay(key); ok && arg&8 == 0 {
			seq = d.Seq
		}
		return core.ClearDelay(key, seq)
	}
	return core.Grant(key, "", 0, uint64(arg)).InSession(id).WithRequest("", "r"+strconv.Itoa(int(arg>>3&3)))
}

// fuzzControl builds FuzzApplySequence's control command: op 0-7 is
// bootstrap, mint_join, admit, promote, prepare_replacement,
// complete_replacement, abort_replacement, retire. arg bits 0-1 pick the
// credential, bits 2-3 the address, bits 0-2 the node id; bit 3 set takes
// the incarnation from bits 4-6 instead of the member's. Complete and abort
// name the pending replacement unless bit 7 is set.
func fuzzControl(m *core.Machine, op, arg byte) core.Command {
	h, a := cred(int(arg&3)), addr(1+int(arg>>2&3))
	id := uint64(arg & 7)
	inc := uint64(arg >> 4 & 7)
	if mem, ok := m.Member(id); ok && arg&8 == 0 {
		inc = mem.Incarnation
	}
	switch op {
	case 0:
		return core.Bootstrap(h, a)
	case 1:
		return core.MintJoin(h)
	case 2:
		return core.Admit(h, a)
	case 3:
		return core.Promote(id, inc)
	case 4:
		return core.PrepareReplacement(id, a)
	case 5, 6:
		build := core.CompleteReplacement
		if op == 6 {
			build = core.AbortReplacement
		}
		if p, ok := m.PendingReplacement(); ok && arg&0x80 == 0 {
			return build(p.Old, p.New, p.NewIncarnation)
		}
		return build(id, uint64(arg>>4&7), inc)
	}
	return core.Retire(id, inc)
}

// mustChange says whether a control request that got result must have
// changed the state: a rejection never does, nor a Noop (a request of a
// later cluster version), and neither does a retried prepare of the
// pending replacement (same old voter, same address), which only tells
// the identity already prepared; anything else does.
func mustChange(r core.ControlRequest, got core.Result, pending core.Replacement, isPending bool) bool {
	if got.Kind == core.ResultControlRejected || got.Kind == core.ResultNoop {
		return false
	}
	retry := r.Op == core.ControlPrepareReplacement && isPending && pending.Old == r.OldNodeID && pending.Address == r.Address
	return !retry
}

// FuzzDecodeEndedRequest: the stored ended request record decodes only
// from its canonical encoding, and what decodes travels in a snapshot.
func FuzzDecodeEndedRequest(f *testing.F) {
	f.Add(core.EncodeEndedRequest(core.EndedRequest{Request: core.RequestKey("a", "r"), KeyHash: core.RequestKeyHash("k"), Token: 1, EndedAtMS: 5}))
	f.Add(core.EncodeEndedRequest(core.EndedRequest{Token: math.MaxUint64, EndedAtMS: math.MaxUint64}))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := core.DecodeEndedRequest(b)
		if err != nil {
			checkDecodeError(t, err)
			if e != (core.EndedRequest{}) {
				t.Fatalf("failed decode returned %+v", e)
			}
			return
		}
		if re := core.EncodeEndedRequest(e); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		// A tombstone (token 0) travels from cluster version 6.
		s := core.SnapshotState{LastToken: e.Token, Control: core.ControlState{ClusterVersion: 3},
			Requests: core.RequestState{DataClockMS: e.EndedAtMS, Ended: []core.EndedRequest{e}}}
		if e.Token == 0 {
			s.Control.ClusterVersion = 6
		}
		if st, err := core.DecodeSnapshotState(core.EncodeSnapshotState(s)); err != nil || !reflect.DeepEqual(st.Requests, s.Requests) {
			t.Fatalf("record %+v does not travel in a snapshot: %+v, %v", e, st, err)
		}
	})
}

// FuzzDecodeSessionRecord: a stored session record decodes only from its
// canonical encoding, and what decodes travels in a snapshot and opens
// into a machine's state.
func FuzzDecodeSessionRecord(f *testing.F) {
	f.Add(core.EncodeSessionRecord(core.Session{ID: 3, Identity: "a", TTLMS: ttl, LockDelayMS: delay, Epoch: 2}))
	f.Add(core.EncodeSessionRecord(core.Session{ID: math.MaxUint64, TTLMS: core.MaxSessionTTLMS, Epoch: math.MaxUint64}))
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := core.DecodeSessionRecord(b)
		if err != nil {
			checkDecodeError(t, err)
			if x != (core.Session{}) {
				t.Fatalf("failed decode returned %+v", x)
			}
			return
		}
		if re := core.EncodeSessionRecord(x); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		s := core.SnapshotState{Control: core.ControlState{ClusterVersion: 4},
			Sessions: core.SessionState{LastSessionID: x.ID, Sessions: []core.Session{x}}}
		if st, err := core.DecodeSnapshotState(core.EncodeSnapshotState(s)); err != nil || !reflect.DeepEqual(st.Sessions, s.Sessions) {
			t.Fatalf("session %+v does not travel in a snapshot: %+v, %v", x, st, err)
		}
		if err := core.OpenSession(x.Identity, x.TTLMS, x.LockDelayMS).Validate(); err != nil {
			t.Fatalf("session %+v could not have been opened: %v", x, err)
		}
	})
}

// FuzzDecodeDelayRecord: the same for a stored delay record.
func FuzzDecodeDelayRecord(f *testing.F) {
	f.Add(core.EncodeDelayRecord(core.Delay{Key: "k", DelayMS: delay, Seq: 9}))
	f.Add(core.EncodeDelayRecord(core.Delay{Key: "잠금", DelayMS: core.MaxLockDelayMS, Seq: math.MaxUint64}))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := core.DecodeDelayRecord(b)
		if err != nil {
			checkDecodeError(t, err)
			if d != (core.Delay{}) {
				t.Fatalf("failed decode returned %+v", d)
			}
			return
		}
		if re := core.EncodeDelayRecord(d); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		s := core.SnapshotState{Control: core.ControlState{ClusterVersion: 4},
			Sessions: core.SessionState{LastDelaySeq: d.Seq, Delays: []core.Delay{d}}}
		if st, err := core.DecodeSnapshotState(core.EncodeSnapshotState(s)); err != nil || !reflect.DeepEqual(st.Sessions, s.Sessions) {
			t.Fatalf("delay %+v does not travel in a snapshot: %+v, %v", d, st, err)
		}
		if err := core.ClearDelay(d.Key, d.Seq).Validate(); err != nil {
			t.Fatalf("delay %+v could not be cleared: %v", d, err)
		}
	})
}

// FuzzDecodeHolderRecord: a stored holder record decodes only from its
// canonical encoding, valid on its own, and what decodes travels in a
// snapshot.
func FuzzDecodeHolderRecord(f *testing.F) {
	for _, kh := range v5Full(f).MultiKeys() {
		f.Add(core.EncodeHolderRecord(kh))
	}
	f.Add(core.EncodeHolderRecord(core.KeyHolders{Key: "잠금", Limit: core.MaxSemaphoreLimit,
		Delays: []core.Delay{{Key: "잠금", DelayMS: core.MaxLockDelayMS, Seq: math.MaxUint64}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		kh, err := core.DecodeHolderRecord(b)
		if err != nil {
			checkDecodeError(t, err)
			if !reflect.DeepEqual(kh, core.KeyHolders{}) {
				t.Fatalf("failed decode returned %+v", kh)
			}
			return
		}
		if re := core.EncodeHolderRecord(kh); !bytes.Equal(re, b) {
			t.Fatalf("not canonical: %x re-encodes to %x", b, re)
		}
		var last, seq uint64
		for _, l := range kh.Holders {
			last = max(last, l.Token)
			if err := core.Grant(l.Key, l.Owner, l.LeaseMS, l.GrantedAtMS).WithKind(l.Limit, l.Mode).Validate(); l.SessionID == 0 && err != nil {
				t.Fatalf("holder %+v could not have been granted: %v", l, err)
			}
		}
		for _, d := range kh.Delays {
			seq = max(seq, d.Seq)
		}
		for _, l := range kh.Holders {
			if l.SessionID != 0 {
				return // its session is not in the snapshot below
			}
		}
		s := core.SnapshotState{LastToken: last, Control: core.ControlState{ClusterVersion: 5},
			Sessions: core.SessionState{LastDelaySeq: seq}, Holders: []core.KeyHolders{kh}}
		st, err := core.DecodeSnapshotState(core.EncodeSnapshotState(s))
		if err != nil && !strings.Contains(err.Error(), "request") {
			t.Fatalf("key %+v does not travel in a snapshot: %v", kh, err)
		}
		if err == nil && !reflect.DeepEqual(st.Holders, s.Holders) {
			t.Fatalf("key %+v travels as %+v", kh, st.Holders)
		}
	})
}
