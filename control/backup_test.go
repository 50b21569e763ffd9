package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/raftstore"
)

// testBackupKey is the key the sample backups are sealed with: the backup
// key of the test API's control credential.
var testBackupKey = NewBackupKey(testAdmin)

// sampleBackup is a backup of a bootstrapped machine with two locks.
func sampleBackup(t testing.TB) (BackupInfo, []byte, *core.Machine) {
	t.Helper()
	m := core.NewMachine()
	m.Apply(core.Bootstrap(sha256.Sum256([]byte("boot")), "10.0.0.1:7001"))
	m.Apply(core.Grant("a", "alice", 60_000, 1))
	m.Apply(core.Grant("b", "", 60_000, 2))
	info := BackupInfo{NodeID: 1, Term: 3, AppliedIndex: 42, LastToken: m.LastToken(), Locks: m.Len(),
		ClusterVersion: m.ClusterVersion(), Bootstrapped: true, TakenAt: time.Unix(1767225600, 0).UTC()}
	file, err := EncodeBackup(info, m.Snapshot(), testBackupKey)
	if err != nil {
		t.Fatal(err)
	}
	return info, file, m
}

// encodeV1 writes a version-1 file, as binaries before authenticated
// backups did: the same sections, no key id, a SHA-256 at the end.
func encodeV1(t testing.TB, info BackupInfo, data []byte) []byte {
	t.Helper()
	ib, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	b := append(backupMagic[:], backupVersion1)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ib)))
	b = append(b, ib...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, data...)
	return resealV1(append(b, make([]byte, sha256.Size)...))
}

// resealV1 recomputes a version-1 file's trailing checksum, as anyone can.
func resealV1(b []byte) []byte {
	body := b[:len(b)-sha256.Size]
	sum := sha256.Sum256(body)
	return append(append([]byte(nil), body...), sum[:]...)
}

// reseal recomputes a version-2 file's MAC under the test key, so a test
// can reach the checks behind it (only a holder of the key can).
func reseal(b []byte) []byte {
	body := b[:len(b)-sha256.Size]
	return append(append([]byte(nil), body...), testBackupKey.macOf(body)...)
}

func TestBackupRoundTrip(t *testing.T) {
	info, file, m := sampleBackup(t)
	b, err := DecodeBackup(file, Verify{Key: testBackupKey})
	if err != nil {
		t.Fatal(err)
	}
	whole := sha256.Sum256(file)
	if b.Info.AppliedIndex != 42 || b.Info.LastToken != 2 || b.Info.Locks != 2 || !b.Info.TakenAt.Equal(info.TakenAt) || b.Info.SHA256 != hex.EncodeToString(whole[:]) {
		t.Fatalf("info %+v", b.Info)
	}
	if !b.Authenticated || b.Version != BackupVersion || b.KeyID != testBackupKey.ID() || len(b.KeyID) != 16 {
		t.Fatalf("authenticated %v version %d key %q", b.Authenticated, b.Version, b.KeyID)
	}
	if string(b.Data) != string(m.Snapshot()) || len(b.State.Locks) != 2 {
		t.Fatalf("data does not round-trip")
	}
	path := filepath.Join(t.TempDir(), "b.tkd")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBackup(path, Verify{Key: testBackupKey}); err != nil {
		t.Fatal(err)
	}
	if _, err := EncodeBackup(info, m.Snapshot(), BackupKey{}); !errors.Is(err, ErrBackupNoKey) {
		t.Fatalf("sealing without a key: %v", err)
	}
}

// The backup key is derived, never the credential itself, and differs
// per credential.
func TestBackupKey(t *testing.T) {
	a, b := NewBackupKey("credential-a-0123456789"), NewBackupKey("credential-b-0123456789")
	if a.ID() == b.ID() || a.key == b.key || bytes.Contains(a.key[:], []byte("credential-a")) {
		t.Fatal("keys of two credentials collide, or a key holds its credential")
	}
	if again := NewBackupKey("credential-a-0123456789"); again != a {
		t.Fatal("the derivation is not deterministic")
	}
	if k := NewBackupKey(""); k.set || k.ID() != "" {
		t.Fatal("an empty credential gave a key")
	}
}

// TestDecodeBackupRejects: a backup file is hostile input; every damage
// is a typed error with a stable code and nothing panics.
func TestDecodeBackupRejects(t *testing.T) {
	info, file, m := sampleBackup(t)
	head := len(backupMagic) + 1 + backupKeyIDSize
	infoLen := int(binary.BigEndian.Uint32(file[head:]))
	dataAt := head + 4 + infoLen + 8
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), file...)) }
	mismatch, _ := EncodeBackup(BackupInfo{LastToken: 9, Locks: 2, ClusterVersion: 1, Bootstrapped: true}, m.Snapshot(), testBackupKey)
	foreign, _ := EncodeBackup(info, m.Snapshot(), NewBackupKey("another-cluster-credential"))
	withSum := info
	withSum.SHA256 = "00"
	v1 := encodeV1(t, info, m.Snapshot())
	key, insecure := Verify{Key: testBackupKey}, Verify{Insecure: true}
	for name, tc := range map[string]struct {
		b    []byte
		v    Verify
		want error
		code string
	}{
		"empty":            {nil, key, ErrBackupCorrupt, "backup_corrupt"},
		"not a backup":     {[]byte("hello, this is not a ticketd backup file at all, promise!"), key, ErrBackupCorrupt, "backup_corrupt"},
		"truncated":        {file[:len(file)-1], key, ErrBackupAuth, "backup_altered"},
		"one bit of data":  {edit(func(b []byte) []byte { b[dataAt+3] ^= 1; return b }), key, ErrBackupAuth, "backup_altered"},
		"one bit of mac":   {edit(func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), key, ErrBackupAuth, "backup_altered"},
		"checksum reseal":  {edit(func(b []byte) []byte { b[dataAt+3] ^= 1; return resealV1(b) }), key, ErrBackupAuth, "backup_altered"},
		"key id":           {edit(func(b []byte) []byte { b[len(backupMagic)+1] ^= 1; return b }), key, ErrBackupKey, "backup_wrong_key"},
		"foreign":          {foreign, key, ErrBackupKey, "backup_wrong_key"},
		"no key":           {file, Verify{}, ErrBackupNoKey, "backup_no_key"},
		"version 1":        {v1, key, ErrBackupUnauthenticated, "backup_unauthenticated"},
		"version 1 damage": {edit(func([]byte) []byte { b := append([]byte(nil), v1...); b[len(b)-40] ^= 1; return b }), insecure, ErrBackupCorrupt, "backup_corrupt"},
		"version 3":        {edit(func(b []byte) []byte { b[len(backupMagic)] = 3; return reseal(b) }), key, ErrBackupVersion, "backup_version"},
		"short v2":         {edit(func(b []byte) []byte { return reseal(b[:len(backupMagic)+1+4+8+sha256.Size]) }), key, ErrBackupCorrupt, "backup_corrupt"},
		"info too large":   {edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[head:], MaxBackupInfo+1); return reseal(b) }), key, ErrBackupTooLarge, "backup_too_large"},
		"info past end":    {edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[head:], uint32(len(b))); return reseal(b) }), key, ErrBackupCorrupt, "backup_corrupt"},
		"data too large":   {edit(func(b []byte) []byte { binary.BigEndian.PutUint64(b[dataAt-8:], MaxBackupData+1); return reseal(b) }), key, ErrBackupTooLarge, "backup_too_large"},
		"data length":      {edit(func(b []byte) []byte { binary.BigEndian.PutUint64(b[dataAt-8:], 3); return reseal(b) }), key, ErrBackupCorrupt, "backup_corrupt"},
		"snapshot crc":     {edit(func(b []byte) []byte { b[dataAt+5] ^= 0xff; return reseal(b) }), key, core.ErrMalformed, "backup_corrupt"},
		"info unknown":     {edit(func(b []byte) []byte { b[head+4+1] = 'X'; return reseal(b) }), key, ErrBackupCorrupt, "backup_corrupt"},
		"info mismatch":    {mismatch, key, ErrBackupCorrupt, "backup_corrupt"},
		"info sha256":      {encodeV1(t, withSum, m.Snapshot()), insecure, ErrBackupCorrupt, "backup_corrupt"},
	} {
		_, err := DecodeBackup(tc.b, tc.v)
		if !errors.Is(err, tc.want) || BackupErrorCode(err) != tc.code {
			t.Errorf("%s: %v (code %s), want %v (code %s)", name, err, BackupErrorCode(err), tc.want, tc.code)
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
	if _, err := ReadBackup(big, key); !errors.Is(err, ErrBackupTooLarge) {
		t.Errorf("oversize file: %v", err)
	}
}

// Version-1 files, and version-2 files nobody can verify, are read only
// when the operator says so (Verify.Insecure), and then say they were
// not authenticated; a credential given is always checked.
func TestBackupInsecureOptIn(t *testing.T) {
	info, file, m := sampleBackup(t)
	v1 := encodeV1(t, info, m.Snapshot())
	for name, tc := range map[string]struct {
		b    []byte
		v    Verify
		auth bool
		want error
	}{
		"version 1":                     {v1, Verify{Insecure: true}, false, nil},
		"version 1, a credential given": {v1, Verify{Key: testBackupKey, Insecure: true}, false, nil},
		"version 2 without a key":       {file, Verify{Insecure: true}, false, nil},
		"version 2 with its key":        {file, Verify{Key: testBackupKey, Insecure: true}, true, nil},
		"version 2 with another key":    {file, Verify{Key: NewBackupKey("another-cluster-credential"), Insecure: true}, false, ErrBackupKey},
	} {
		b, err := DecodeBackup(tc.b, tc.v)
		if !errors.Is(err, tc.want) || (err == nil && (b.Authenticated != tc.auth || b.Info.LastToken != 2)) {
			t.Errorf("%s: %v, authenticated %v; want %v, %v", name, err, b.Authenticated, tc.want, tc.auth)
		}
	}
}

// The attack: a backup whose token counter was set to
// 2^64-2^40-2 and its checksum computed again was accepted, and the
// restored cluster failed every acquire from the third on. Such a file is
// refused as unauthenticated; read anyway, its counter is refused at
// restore.
func TestForgedBackupRefused(t *testing.T) {
	_, file, _ := sampleBackup(t)
	good, err := DecodeBackup(file, Verify{Key: testBackupKey})
	if err != nil {
		t.Fatal(err)
	}
	forgedState := good.State
	forgedState.LastToken = math.MaxUint64 - 1<<40 - 2
	data := core.EncodeSnapshotState(forgedState)
	info := good.Info
	info.SHA256, info.LastToken = "", forgedState.LastToken
	// The attacker's file: the old format, its checksum computed again.
	forged := encodeV1(t, info, data)
	if _, err := DecodeBackup(forged, Verify{Key: testBackupKey}); !errors.Is(err, ErrBackupUnauthenticated) {
		t.Fatalf("forged version-1 file: %v, want ErrBackupUnauthenticated", err)
	}
	// Or the new format under a key of the attacker's own.
	theirs, err := EncodeBackup(info, data, NewBackupKey("the-attackers-own-credential"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeBackup(theirs, Verify{Key: testBackupKey}); !errors.Is(err, ErrBackupKey) {
		t.Fatalf("forged version-2 file: %v, want ErrBackupKey", err)
	}
	// Read with --insecure-skip-verify, the counter still stops it.
	b, err := DecodeBackup(forged, Verify{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, err = Restore(b, RestoreOptions{DataDir: dir, StoreDir: filepath.Join(dir, "raft"), PeerAddress: "10.0.0.9:7001",
		BumpTokens: BumpTokensDefault, ClusterID: 0x5eed, Logger: testkit.QuietLogger()})
	if !errors.Is(err, ErrTokenHeadroom) || BackupErrorCode(err) != "token_headroom" {
		t.Fatalf("restoring the forged counter: %v (code %s), want ErrTokenHeadroom", err, BackupErrorCode(err))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a refused restore wrote %v", entries)
	}
}

// A restore leaves the new cluster at least RestoreTokenHeadroom tokens:
// the backup's last token plus the bump may reach MaxRestoredToken, not
// pass it, and never overflows.
func TestRestoreTokenHeadroom(t *testing.T) {
	_, file, _ := sampleBackup(t)
	good, err := DecodeBackup(file, Verify{Key: testBackupKey})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		last, bump uint64
		ok         bool
	}{
		{2, BumpTokensDefault, true},
		{MaxRestoredToken - BumpTokensDefault, BumpTokensDefault, true},
		{MaxRestoredToken - BumpTokensDefault + 1, BumpTokensDefault, false},
		{MaxRestoredToken, 0, true},
		{MaxRestoredToken + 1, 0, false},
		{2, MaxRestoredToken - 2, true},
		{2, MaxRestoredToken - 1, false},
		{2, math.MaxUint64, false},
		{math.MaxUint64, 1, false},
	} {
		b := good
		b.State.LastToken = tc.last
		dir := t.TempDir()
		res, err := Restore(b, RestoreOptions{DataDir: dir, StoreDir: filepath.Join(dir, "raft"), PeerAddress: "10.0.0.9:7001",
			BumpTokens: tc.bump, ClusterID: 0x5eed, Logger: testkit.QuietLogger()})
		if tc.ok && (err != nil || res.FirstToken != tc.last+tc.bump+1) {
			t.Errorf("last %d bump %d: %v, first token %d", tc.last, tc.bump, err, res.FirstToken)
		}
		if !tc.ok && !errors.Is(err, ErrTokenHeadroom) {
			t.Errorf("last %d bump %d: %v, want ErrTokenHeadroom", tc.last, tc.bump, err)
		}
	}
}

func FuzzDecodeBackup(f *testing.F) {
	info, file, m := sampleBackup(f)
	v1 := encodeV1(f, info, m.Snapshot())
	foreign, _ := EncodeBackup(info, m.Snapshot(), NewBackupKey("another-cluster-credential"))
	f.Add(file)
	f.Add(file[:40])
	f.Add(reseal(append([]byte(nil), file...)))
	f.Add(v1)
	f.Add(resealV1(append([]byte(nil), v1...)))
	f.Add(foreign)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range []Verify{{Key: testBackupKey}, {Insecure: true}, {Key: testBackupKey, Insecure: true}} {
			bk, err := DecodeBackup(b, v)
			if err != nil {
				if BackupErrorCode(err) == "error" {
					t.Fatalf("untyped error: %v", err)
				}
				continue
			}
			if !v.Insecure && !bk.Authenticated {
				t.Fatal("accepted without authentication, and without Insecure")
			}
			// Only EncodeBackup under the key makes a file that
			// authenticates: it is exactly what EncodeBackup writes.
			again, err := EncodeBackup(bk.Info, bk.Data, testBackupKey)
			if err != nil {
				t.Fatal(err)
			}
			if bk.Authenticated && !bytes.Equal(again, b) {
				t.Fatal("an authenticated file is not what EncodeBackup writes")
			}
			bk2, err := DecodeBackup(again, Verify{Key: testBackupKey})
			if err != nil || string(bk2.Data) != string(bk.Data) || bk2.Info.LastToken != bk.Info.LastToken {
				t.Fatalf("re-encoded backup: %v", err)
			}
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
	b, err := DecodeBackup(file, Verify{Key: testBackupKey})
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
