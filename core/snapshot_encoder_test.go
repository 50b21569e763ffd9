package core_test

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// encodeVia builds a snapshot of locks through the encoder, with either
// Add or AddRecord, at snapshot version 2 (v3 false) or 3.
func encodeVia(t testing.TB, locks []core.Lock, v3, records bool) ([]byte, error) {
	ctl := core.ControlState{}
	if v3 {
		ctl.ClusterVersion = 2
	}
	var last uint64
	for _, l := range locks {
		last = max(last, l.Token)
	}
	e := core.NewSnapshotEncoder(last, len(locks), ctl, 0)
	for _, l := range locks {
		var err error
		if records {
			err = e.AddRecord(core.EncodeLockRecord(l))
		} else {
			err = e.Add(l)
		}
		if err != nil {
			return nil, err
		}
	}
	return e.Finish()
}

// The encoder, fed locks or their stored records, gives exactly the bytes
// of EncodeSnapshotState, at both snapshot versions.
func TestSnapshotEncoderMatchesEncodeSnapshotState(t *testing.T) {
	locks := []core.Lock{
		{Key: "a", Token: 3, Owner: "o", LeaseMS: lease, GrantedAtMS: 1},
		{Key: "b/é", Token: 1, LeaseMS: core.MaxLeaseMS, GrantedAtMS: math.MaxUint64},
		{Key: strings.Repeat("k", core.MaxKeyLen), Token: 7, Owner: strings.Repeat("o", core.MaxOwnerLen), LeaseMS: core.MinLeaseMS},
	}
	withID := append([]core.Lock(nil), locks...)
	withID[0].Identity = "acct"
	withID[2].Identity = strings.Repeat("i", core.MaxIdentityLen)
	for _, tc := range []struct {
		name  string
		locks []core.Lock
		v3    bool
	}{{"v2", locks, false}, {"v3", locks, true}, {"v3 identities", withID, true}, {"empty", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctl := core.ControlState{}
			if tc.v3 {
				ctl.ClusterVersion = 2
			}
			var last uint64
			for _, l := range tc.locks {
				last = max(last, l.Token)
			}
			want := core.EncodeSnapshotState(core.SnapshotState{LastToken: last, Locks: tc.locks, Control: ctl})
			for _, records := range []bool{false, true} {
				got, err := encodeVia(t, tc.locks, tc.v3, records)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("records=%v: err %v, bytes equal %v", records, err, bytes.Equal(got, want))
				}
			}
		})
	}
}

// Both ways of feeding the encoder refuse the same bad input, and nothing
// is returned by Finish after a refusal.
func TestSnapshotEncoderRefuses(t *testing.T) {
	ok := core.Lock{Key: "b", Token: 2, LeaseMS: lease}
	for _, tc := range []struct {
		name  string
		locks []core.Lock
		v3    bool
	}{
		{"unsorted", []core.Lock{ok, {Key: "a", Token: 1, LeaseMS: lease}}, false},
		{"duplicate key", []core.Lock{ok, ok}, false},
		{"token 0", []core.Lock{{Key: "a", LeaseMS: lease}}, false},
		{"lease 0", []core.Lock{{Key: "a", Token: 1}}, false},
		{"bad utf8 owner", []core.Lock{{Key: "a", Token: 1, LeaseMS: lease, Owner: "\xff"}}, false},
		{"NUL in key", []core.Lock{{Key: "a\x00", Token: 1, LeaseMS: lease}}, false},
		{"identity before version 3", []core.Lock{{Key: "a", Token: 1, LeaseMS: lease, Identity: "x"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, records := range []bool{false, true} {
				if _, err := encodeVia(t, tc.locks, tc.v3, records); err == nil {
					t.Fatalf("records=%v: accepted", records)
				}
			}
		})
	}
	// Count mismatches.
	e := core.NewSnapshotEncoder(5, 2, core.ControlState{}, 0)
	if err := e.AddRecord(core.EncodeLockRecord(ok)); err != nil {
		t.Fatal(err)
	}
	if b, err := e.Finish(); err == nil || b != nil {
		t.Fatal("fewer locks than declared accepted")
	}
	e = core.NewSnapshotEncoder(5, 0, core.ControlState{}, 0)
	if err := e.AddRecord(core.EncodeLockRecord(ok)); err == nil {
		t.Fatal("more locks than declared accepted")
	}
	// A token above the last token.
	e = core.NewSnapshotEncoder(1, 1, core.ControlState{}, 0)
	if err := e.AddRecord(core.EncodeLockRecord(ok)); err == nil {
		t.Fatal("token above the last token accepted")
	}
}

// FuzzSnapshotEncoderAddRecord: AddRecord accepts exactly the records that
// DecodeLockRecord accepts (and the encoder's order rules), and appends
// exactly what Add appends for the decoded lock.
func FuzzSnapshotEncoderAddRecord(f *testing.F) {
	for _, l := range []core.Lock{
		{Key: "k", Token: 1, LeaseMS: lease},
		{Key: "k", Token: 9, Owner: "o", Identity: "id", LeaseMS: core.MaxLeaseMS, GrantedAtMS: 77},
	} {
		f.Add(core.EncodeLockRecord(l), true)
		f.Add(core.EncodeLockRecord(l), false)
	}
	f.Fuzz(func(t *testing.T, rec []byte, v3 bool) {
		ctl := core.ControlState{}
		if v3 {
			ctl.ClusterVersion = 2
		}
		viaRecord := core.NewSnapshotEncoder(math.MaxUint64, 1, ctl, 0)
		errRecord := viaRecord.AddRecord(rec)
		viaLock := core.NewSnapshotEncoder(math.MaxUint64, 1, ctl, 0)
		l, errLock := core.DecodeLockRecord(rec)
		if errLock == nil {
			errLock = viaLock.Add(l)
		}
		if (errRecord == nil) != (errLock == nil) {
			t.Fatalf("AddRecord err %v, DecodeLockRecord+Add err %v", errRecord, errLock)
		}
		if errRecord != nil {
			return
		}
		a, err1 := viaRecord.Finish()
		b, err2 := viaLock.Finish()
		if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
			t.Fatalf("different snapshots: %v %v", err1, err2)
		}
	})
}
