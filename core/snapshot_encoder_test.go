package core_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
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
	return encodeState(t, core.SnapshotState{Locks: locks, Control: ctl}, records)
}

// encodeState builds the snapshot of s through the encoder: its locks
// with Add or AddRecord, then its request and session sections.
func encodeState(t testing.TB, s core.SnapshotState, records bool) ([]byte, error) {
	t.Helper()
	e := core.NewSnapshotEncoder(lastTokenOf(s), len(s.Locks), s.Control, 0)
	if err := fillEncoder(e, s, records); err != nil {
		return nil, err
	}
	return e.Finish()
}

// lastTokenOf is s's last token, raised to its locks' highest.
func lastTokenOf(s core.SnapshotState) uint64 {
	last := s.LastToken
	for _, l := range s.Locks {
		last = max(last, l.Token)
	}
	return last
}

// fillEncoder feeds e everything of s but the end: its locks with Add or
// AddRecord, then its request, session and kinds sections.
func fillEncoder(e *core.SnapshotEncoder, s core.SnapshotState, records bool) error {
	locks := s.Locks
	for _, l := range locks {
		var err error
		if records {
			err = e.AddRecord(core.EncodeLockRecord(l))
		} else {
			err = e.Add(l)
		}
		if err != nil {
			return err
		}
	}
	rs := s.Requests
	if len(rs.Ended) > 0 || rs.DataClockMS != 0 || rs.EndedHead != 0 || records {
		// (Finish writes an empty section itself; records=true shows
		// BeginRequests with an empty one gives the same bytes.)
		if err := e.BeginRequests(rs.DataClockMS, rs.EndedHead, len(rs.Ended)); err != nil {
			return err
		}
	}
	for _, x := range rs.Ended {
		if err := e.AddEnded(x); err != nil {
			return err
		}
	}
	ss := s.Sessions
	if len(ss.Sessions) > 0 || len(ss.Delays) > 0 || ss.LastSessionID != 0 || ss.LastDelaySeq != 0 || records {
		// (Finish writes an empty section itself from snapshot version 5.)
		if err := e.BeginSessions(ss.LastSessionID, ss.LastDelaySeq, len(ss.Sessions), len(ss.Delays)); err != nil {
			return err
		}
	}
	for _, x := range ss.Sessions {
		if err := e.AddSession(x); err != nil {
			return err
		}
	}
	for _, x := range ss.Delays {
		if err := e.AddDelay(x); err != nil {
			return err
		}
	}
	for _, kh := range s.Holders {
		var err error
		if records {
			err = e.AddHolderRecord(core.EncodeHolderRecord(kh))
		} else {
			err = e.AddKeyHolders(kh)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// The encoder gives the bytes of EncodeSnapshotState for a cluster
// version 3 state too (request ids, ended records, fence keys), fed
// locks or their records.
func TestSnapshotEncoderVersion4(t *testing.T) {
	s := v3Full(t).SnapshotState()
	want := core.EncodeSnapshotState(s)
	for _, records := range []bool{false, true} {
		got, err := encodeState(t, s, records)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("records=%v: err %v, bytes equal %v", records, err, bytes.Equal(got, want))
		}
	}
	ended := core.EndedRequest{Token: 1, EndedAtMS: 5}
	v4 := core.ControlState{ClusterVersion: 3}
	for _, tc := range []struct {
		name string
		run  func(e *core.SnapshotEncoder) error
	}{
		{"request id before version 3", func(*core.SnapshotEncoder) error {
			_, err := encodeVia(t, []core.Lock{{Key: "a", Token: 1, LeaseMS: lease, RequestID: "r"}}, true, true)
			return err
		}},
		{"requests before version 3", func(*core.SnapshotEncoder) error {
			return core.NewSnapshotEncoder(5, 0, core.ControlState{ClusterVersion: 2}, 0).BeginRequests(1, 0, 0)
		}},
		{"locks missing", func(e *core.SnapshotEncoder) error { return e.BeginRequests(5, 0, 1) }},
		{"ended before begin", func(*core.SnapshotEncoder) error {
			return core.NewSnapshotEncoder(5, 0, v4, 0).AddEnded(ended)
		}},
		{"begun twice", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(5, 0, 1)
			return e.BeginRequests(5, 0, 1)
		}},
		{"lock after begin", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(5, 0, 0)
			return e.AddRecord(core.EncodeLockRecord(core.Lock{Key: "a", Token: 1, LeaseMS: lease}))
		}},
		{"more ended than declared", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(5, 0, 0)
			return e.AddEnded(ended)
		}},
		{"fewer ended than declared", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(5, 0, 1)
			_, err := e.Finish()
			return err
		}},
		{"ended token 0", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(5, 0, 1)
			return e.AddEnded(core.EndedRequest{EndedAtMS: 1})
		}},
		{"ended after the clock", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(4, 0, 1)
			return e.AddEnded(ended)
		}},
		{"ended out of order", func(*core.SnapshotEncoder) error {
			e := core.NewSnapshotEncoder(5, 0, v4, 0)
			_ = e.BeginRequests(9, 0, 2)
			_ = e.AddEnded(ended)
			return e.AddEnded(core.EndedRequest{Token: 2, EndedAtMS: 4})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := core.NewSnapshotEncoder(5, 1, v4, 0)
			if err := tc.run(e); err == nil {
				t.Fatal("accepted")
			}
		})
	}
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
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 9, Identity: "id", RequestID: "r", LeaseMS: lease}), true)
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 9, RequestID: "r", LeaseMS: lease}), false)
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 9, Identity: "id", SessionID: 4}), true)
	f.Add(core.EncodeLockRecord(core.Lock{Key: "k", Token: 9, LeaseMS: lease, LockDelayMS: 7}), true)
	// v3 false: snapshot version 2; true: versions 3 to 5 (cluster
	// versions 2 to 4).
	f.Fuzz(func(t *testing.T, rec []byte, v3 bool) {
		versions := []uint64{0}
		if v3 {
			versions = []uint64{2, 3, 4}
		}
		for _, cv := range versions {
			ctl := core.ControlState{ClusterVersion: cv}
			viaRecord := core.NewSnapshotEncoder(math.MaxUint64, 1, ctl, 0)
			errRecord := viaRecord.AddRecord(rec)
			viaLock := core.NewSnapshotEncoder(math.MaxUint64, 1, ctl, 0)
			l, errLock := core.DecodeLockRecord(rec)
			if errLock == nil {
				errLock = viaLock.Add(l)
			}
			if (errRecord == nil) != (errLock == nil) {
				t.Fatalf("cluster version %d: AddRecord err %v, DecodeLockRecord+Add err %v", cv, errRecord, errLock)
			}
			if errRecord != nil {
				continue
			}
			a, err1 := viaRecord.Finish()
			b, err2 := viaLock.Finish()
			if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
				t.Fatalf("cluster version %d: different snapshots: %v %v", cv, err1, err2)
			}
		}
	})
}

// A streaming encoder writes exactly the bytes Finish returns, over many
// chunks (a state of about 3.5 MB with every section of snapshot version
// 6) or one (a small state), and Info is the header CheckSnapshot reads.
func TestSnapshotEncoderStreamsTheSameBytes(t *testing.T) {
	small := v5Full(t).SnapshotState()
	big := v5Full(t).SnapshotState()
	var extra []core.Lock
	for i := range 12_000 {
		extra = append(extra, core.Lock{Key: fmt.Sprintf("stream/%06d", i), Token: 1 + uint64(i)%big.LastToken,
			Owner: strings.Repeat("o", core.MaxOwnerLen), LeaseMS: lease, GrantedAtMS: uint64(i)})
	}
	big.Locks = append(big.Locks, extra...)
	slices.SortFunc(big.Locks, func(a, b core.Lock) int { return strings.Compare(a.Key, b.Key) })
	for _, tc := range []struct {
		name string
		s    core.SnapshotState
	}{{"small", small}, {"big", big}} {
		want := core.EncodeSnapshotState(tc.s)
		wantInfo, err := core.CheckSnapshot(want)
		if err != nil {
			t.Fatal(err)
		}
		for _, records := range []bool{false, true} {
			var w countingWriter
			e := core.NewSnapshotEncoderTo(&w, lastTokenOf(tc.s), len(tc.s.Locks), tc.s.Control)
			if err := fillEncoder(e, tc.s, records); err != nil {
				t.Fatalf("%s, records=%v: %v", tc.name, records, err)
			}
			n, err := e.FinishTo()
			if err != nil || n != int64(len(want)) || !bytes.Equal(w.Bytes(), want) || e.Info() != wantInfo {
				t.Fatalf("%s, records=%v: %v, wrote %d of %d bytes, equal %v, info %+v against %+v",
					tc.name, records, err, n, len(want), bytes.Equal(w.Bytes(), want), e.Info(), wantInfo)
			}
			if tc.name == "big" && w.writes < 3 {
				t.Fatalf("%d bytes in %d writes: not streamed", n, w.writes)
			}
			if _, err := e.Finish(); err == nil {
				t.Fatal("Finish on a streaming encoder")
			}
		}
	}
	if _, err := core.NewSnapshotEncoder(1, 0, core.ControlState{}, 0).FinishTo(); err == nil {
		t.Fatal("FinishTo on an encoder without a writer")
	}
}

// A writer's failure ends a streaming encoder with that error.
func TestSnapshotEncoderStreamWriteFails(t *testing.T) {
	s := v5Full(t).SnapshotState()
	for i := range 6_000 {
		s.Locks = append(s.Locks, core.Lock{Key: fmt.Sprintf("zz/%06d", i), Token: 1, Owner: strings.Repeat("o", core.MaxOwnerLen), LeaseMS: lease})
	}
	e := core.NewSnapshotEncoderTo(failingWriter{}, lastTokenOf(s), len(s.Locks), s.Control)
	err := fillEncoder(e, s, true)
	if !errors.Is(err, errDiskGone) {
		t.Fatalf("fill: %v", err)
	}
	if _, err := e.FinishTo(); !errors.Is(err, errDiskGone) {
		t.Fatalf("FinishTo: %v", err)
	}
}

type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

var errDiskGone = errors.New("disk gone")

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errDiskGone }
