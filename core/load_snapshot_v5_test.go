package core

import (
	"fmt"
	"testing"
)

// benchSnapshot1MV5 is benchSnapshot1M at cluster version 4 (snapshot
// version 5): a tenth of the locks in 1,000 sessions, a tenth with a
// lock-delay, and 1,000 delayed keys.
func benchSnapshot1MV5(b *testing.B) []byte {
	s := SnapshotState{LastToken: 1_000_000, Control: ControlState{ClusterVersion: 4}}
	s.Locks = make([]Lock, 1_000_000)
	for i := range s.Locks {
		l := Lock{Key: fmt.Sprintf("lock/%07d", i), Token: uint64(i + 1), Owner: fmt.Sprintf("owner-%d", i%1000),
			LeaseMS: 86_400_000, GrantedAtMS: 1767225600000}
		switch i % 10 {
		case 0:
			l.LeaseMS, l.SessionID = 0, uint64(i/10%1000+1)
		case 1:
			l.LockDelayMS = 15_000
		}
		s.Locks[i] = l
	}
	s.Sessions.LastSessionID, s.Sessions.LastDelaySeq = 1000, 1000
	for id := uint64(1); id <= 1000; id++ {
		s.Sessions.Sessions = append(s.Sessions.Sessions, Session{ID: id, TTLMS: 10_000, LockDelayMS: 15_000, Epoch: 1})
		s.Sessions.Delays = append(s.Sessions.Delays, Delay{Key: fmt.Sprintf("zdelayed/%04d", id), DelayMS: 15_000, Seq: id})
	}
	data := EncodeSnapshotState(s)
	if _, err := DecodeSnapshotState(data); err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkRestore1MV5 is BenchmarkRestore1M for a cluster at version 4:
// the walk (load_snapshot.go) reads snapshot version 5 too.
func BenchmarkRestore1MV5(b *testing.B) {
	data := benchSnapshot1MV5(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := NewMachine().Restore(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRestoreState1MV5 is the same through DecodeSnapshotState and
// RestoreState, the path snapshot version 5 took before the walk read it.
func BenchmarkRestoreState1MV5(b *testing.B) {
	data := benchSnapshot1MV5(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		s, err := DecodeSnapshotState(data)
		if err != nil {
			b.Fatal(err)
		}
		NewMachine().RestoreState(s)
	}
}
