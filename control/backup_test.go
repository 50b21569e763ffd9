package control

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// sampleBackup is a backup of a bootstrapped machine with two locks.
func sampleBackup(t testing.TB) (BackupInfo, []byte, *core.Machine) {
	t.Helper()
	m := core.NewMachine()
	m.Apply(core.Bootstrap(sha256.Sum256([]byte("boot")), "10.0.0.1:7001"))
	m.Apply(core.Grant("a", "alice", 60_000, 1))
	m.Apply(core.Grant("b", "", 60_000, 2))
	info := BackupInfo{NodeID: 1, Term: 3, AppliedIndex: 42, LastToken: m.LastToken(), Locks: m.Len(),
		ClusterVersion: m.ClusterVersion(), Bootstrapped: true, TakenAt: time.Unix(1767225600, 0).UTC()}
	file, err := EncodeBackup(info, m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	return info, file, m
}

// reseal recomputes the trailing checksum, so a test can reach the
// checks behind it.
func reseal(b []byte) []byte {
	body := b[:len(b)-sha256.Size]
	sum := sha256.Sum256(body)
	return append(append([]byte(nil), body...), sum[:]...)
}

func TestBackupRoundTrip(t *testing.T) {
	info, file, m := sampleBackup(t)
	b, err := DecodeBackup(file)
	if err != nil {
		t.Fatal(err)
	}
	if b.Info.AppliedIndex != 42 || b.Info.LastToken != 2 || b.Info.Locks != 2 || !b.Info.TakenAt.Equal(info.TakenAt) || len(b.Info.SHA256) != 64 {
		t.Fatalf("info %+v", b.Info)
	}
	if string(b.Data) != string(m.Snapshot()) || len(b.State.Locks) != 2 {
		t.Fatalf("data does not round-trip")
	}
	path := filepath.Join(t.TempDir(), "b.tkd")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBackup(path); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeBackupRejects: a backup file is hostile input; every damage
// is a typed error and nothing panics.
func TestDecodeBackupRejects(t *testing.T) {
	_, file, m := sampleBackup(t)
	head := len(backupMagic) + 1
	infoLen := int(binary.BigEndian.Uint32(file[head:]))
	dataAt := head + 4 + infoLen + 8
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), file...)) }
	mismatch, _ := EncodeBackup(BackupInfo{LastToken: 9, Locks: 2, ClusterVersion: 1, Bootstrapped: true}, m.Snapshot())
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"empty":          {nil, ErrBackupCorrupt},
		"not a backup":   {[]byte("hello, this is not a ticketd backup file at all, promise!"), ErrBackupCorrupt},
		"truncated":      {file[:len(file)-1], ErrBackupCorrupt},
		"one bit":        {edit(func(b []byte) []byte { b[dataAt+3] ^= 1; return b }), ErrBackupCorrupt},
		"version 2":      {edit(func(b []byte) []byte { b[len(backupMagic)] = 2; return reseal(b) }), ErrBackupVersion},
		"info too large": {edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[head:], MaxBackupInfo+1); return reseal(b) }), ErrBackupTooLarge},
		"info past end":  {edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[head:], uint32(len(b))); return reseal(b) }), ErrBackupCorrupt},
		"data too large": {edit(func(b []byte) []byte { binary.BigEndian.PutUint64(b[dataAt-8:], MaxBackupData+1); return reseal(b) }), ErrBackupTooLarge},
		"data length":    {edit(func(b []byte) []byte { binary.BigEndian.PutUint64(b[dataAt-8:], 3); return reseal(b) }), ErrBackupCorrupt},
		"snapshot crc":   {edit(func(b []byte) []byte { b[dataAt+5] ^= 0xff; return reseal(b) }), core.ErrMalformed},
		"info unknown":   {edit(func(b []byte) []byte { b[head+4+1] = 'X'; return reseal(b) }), ErrBackupCorrupt},
		"info mismatch":  {mismatch, ErrBackupCorrupt},
	} {
		if _, err := DecodeBackup(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	big := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(MaxBackupSize) + 1); err != nil { // sparse
		t.Fatal(err)
	}
	f.Close()
	if _, err := ReadBackup(big); !errors.Is(err, ErrBackupTooLarge) {
		t.Errorf("oversize file: %v", err)
	}
}

func FuzzDecodeBackup(f *testing.F) {
	_, file, _ := sampleBackup(f)
	f.Add(file)
	f.Add(file[:40])
	f.Add(reseal(append([]byte(nil), file...)))
	f.Fuzz(func(t *testing.T, b []byte) {
		bk, err := DecodeBackup(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to a file that decodes to the same state.
		again, err := EncodeBackup(bk.Info, bk.Data)
		if err != nil {
			t.Fatal(err)
		}
		bk2, err := DecodeBackup(again)
		if err != nil || string(bk2.Data) != string(bk.Data) || bk2.Info.LastToken != bk.Info.LastToken {
			t.Fatalf("re-encoded backup: %v", err)
		}
	})
}

// TestSnapshotEndpoint: the leader answers an admin with a backup of its
// applied state; the endpoint shares the control API's refusals.
func TestSnapshotEndpoint(t *testing.T) {
	_, n, l, url := newTestAPI(t)
	n.m.Apply(core.Grant("k", "o", 60_000, 1))
	n.index = 17
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, file, err := SaveBackup(ctx, []string{url}, testAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if b.Info.AppliedIndex != 17 || b.Info.LastToken != 1 || b.Info.Locks != 1 || b.Info.NodeID != 1 || len(file) == 0 {
		t.Fatalf("backup info %+v", b.Info)
	}
	if code, body := post(t, "POST", url+"/v1/snapshot", "", ""); code != 401 {
		t.Fatalf("without credential: %d %s", code, body)
	}
	l.leader.Store(false)
	if code, body := post(t, "POST", url+"/v1/snapshot", testAdmin, ""); code != 421 {
		t.Fatalf("on a follower: %d %s", code, body)
	}
}

// TestRestore seeds data directories from a backup in each mode and
// checks what a node would start from.
func TestRestore(t *testing.T) {
	_, file, m := sampleBackup(t)
	b, err := DecodeBackup(file)
	if err != nil {
		t.Fatal(err)
	}
	load := func(t *testing.T, storeDir string) (uint64, *core.Machine, []uint64) {
		t.Helper()
		s, err := raftstore.Open(storeDir, raftstore.StoreOptions{NoSync: true, Logger: testkit.QuietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		applied, got, cs, err := s.LoadMachine()
		if err != nil {
			t.Fatal(err)
		}
		return applied, got, cs.Voters
	}
	opts := func(dir string) RestoreOptions {
		return RestoreOptions{DataDir: dir, StoreDir: filepath.Join(dir, "raft"), BumpTokens: 100, ClusterID: 0x5eed, Logger: testkit.QuietLogger()}
	}

	t.Run("control plane", func(t *testing.T) {
		dir := t.TempDir()
		o := opts(dir)
		if _, err := Restore(b, o); !errors.Is(err, ErrRestore) {
			t.Fatalf("without a peer address: %v", err)
		}
		o.PeerAddress = "10.0.0.9:7001"
		res, err := Restore(b, o)
		if err != nil {
			t.Fatal(err)
		}
		if res.Mode != RestoreControlPlane || res.NodeID != 2 || res.Incarnation != 2 || res.FirstToken != m.LastToken()+101 || res.Locks != 2 {
			t.Fatalf("restored %+v", res)
		}
		id, ok, err := ReadIdentity(dir)
		if err != nil || !ok || id.NodeID != 2 || id.Incarnation != 2 {
			t.Fatalf("identity %+v %v %v", id, ok, err)
		}
		applied, got, voters := load(t, o.StoreDir)
		if applied != 42 || len(voters) != 1 || voters[0] != 2 || got.LastToken() != m.LastToken()+100 {
			t.Fatalf("store: applied %d voters %v last token %d", applied, voters, got.LastToken())
		}
		if err := got.CheckIdentity(1, 1); !errors.Is(err, core.ErrNodeRetired) {
			t.Fatalf("the old member: %v, want retired", err)
		}
		if _, err := Restore(b, o); !errors.Is(err, ErrRestore) {
			t.Fatalf("restoring over a restored node: %v", err)
		}
	})
	t.Run("static", func(t *testing.T) {
		for _, id := range []uint64{1, 2, 3} {
			dir := t.TempDir()
			o := opts(dir)
			o.ID, o.Voters, o.DropLocks = id, []uint64{1, 2, 3}, true
			res, err := Restore(b, o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Mode != RestoreStatic || res.NodeID != id || res.Locks != 0 || res.DroppedLocks != 2 {
				t.Fatalf("restored %+v", res)
			}
			if _, ok, _ := ReadIdentity(dir); ok {
				t.Fatal("a static restore wrote an identity")
			}
			_, got, voters := load(t, o.StoreDir)
			if len(voters) != 3 || got.Bootstrapped() || got.Len() != 0 {
				t.Fatalf("store: voters %v bootstrapped %v locks %d", voters, got.Bootstrapped(), got.Len())
			}
		}
		o := opts(t.TempDir())
		o.ID, o.Voters = 4, []uint64{1, 2, 3}
		if _, err := Restore(b, o); !errors.Is(err, ErrRestore) {
			t.Fatalf("id outside the voters: %v", err)
		}
	})
}
