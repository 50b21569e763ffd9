package main

import (
	"crypto/sha256"
	be "encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
)

// legacyBackup writes a version-1 backup file, as binaries before
// authenticated backups did and as anyone can: the sections, then a
// SHA-256 of them.
func legacyBackup(t *testing.T, info control.BackupInfo, data []byte) []byte {
	t.Helper()
	ib, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte("TKDBACK"), 1)
	b = be.BigEndian.AppendUint32(b, uint32(len(ib)))
	b = append(b, ib...)
	b = be.BigEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, data...)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// TestBackupAuthenticationCLI: snapshot status and restore verify a backup
// with the control credential it was taken with, refuse an altered,
// foreign or unauthenticated file with a stable code, read an old one
// only with --insecure-skip-verify, and never restore a token counter
// near the top of its range. The forged backup (last token
// 2^64-2^40-2, its checksum computed again) was accepted and left the
// restored cluster unable to grant.
func TestBackupAuthenticationCLI(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	const credential = "backup-cli-control-credential"
	credFile := filepath.Join(dir, "control.cred")
	if err := os.WriteFile(credFile, []byte(credential+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	m := core.NewMachine()
	m.Apply(core.Grant("a", "alice", 60_000, 1))
	info := control.BackupInfo{NodeID: 1, Term: 2, AppliedIndex: 9, LastToken: m.LastToken(), Locks: m.Len(),
		ClusterVersion: m.ClusterVersion(), TakenAt: time.Unix(1767225600, 0).UTC()}
	seal := func(info control.BackupInfo, data []byte, cred string) []byte {
		b, err := control.EncodeBackup(info, data, control.NewBackupKey(cred))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	goodBytes := seal(info, m.Snapshot(), credential)
	good := file("good.tkb", goodBytes)
	altered := append([]byte(nil), goodBytes...)
	altered[len(altered)/2] ^= 0x40
	forgedState := core.SnapshotState{LastToken: math.MaxUint64 - 1<<40 - 2}
	forgedInfo := control.BackupInfo{LastToken: forgedState.LastToken, ClusterVersion: 1, TakenAt: info.TakenAt}
	forged := file("forged.tkb", legacyBackup(t, forgedInfo, core.EncodeSnapshotState(forgedState)))

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"verified", []string{good, "--control-credential-file", credFile}, 0, ""},
		{"no credential", []string{good}, exitUsage, "--control-credential-file"},
		{"altered", []string{file("altered.tkb", altered), "--control-credential-file", credFile}, exitFailure, "error: backup_altered:"},
		{"foreign", []string{file("foreign.tkb", seal(info, m.Snapshot(), "another-clusters-credential")), "--control-credential-file", credFile}, exitFailure, "error: backup_wrong_key:"},
		{"forged legacy", []string{forged, "--control-credential-file", credFile}, exitFailure, "error: backup_unauthenticated:"},
		{"forged legacy, insecure", []string{forged, "--insecure-skip-verify"}, 0, "was not authenticated"},
	} {
		v, stderr, code := cli(t, bin, append([]string{"snapshot", "status"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("status %s: exit %d, %q; want %d and %q", tc.name, code, stderr, tc.code, tc.want)
		}
		if tc.name == "verified" && (v["authenticated"] != true || v["last_token"] != float64(1) || v["version"] != float64(2)) {
			t.Errorf("status of a good backup: %v", v)
		}
	}

	// Read anyway, the forged counter is refused at restore and nothing is
	// written; so is a bump that would pass the headroom.
	data := filepath.Join(dir, "restored")
	if _, stderr, code := cli(t, bin, "snapshot", "restore", forged, "--data", data, "--insecure-skip-verify"); code != exitFailure || !strings.Contains(stderr, "error: token_headroom:") {
		t.Fatalf("restoring the forged counter: exit %d, %s", code, stderr)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("a refused restore left %s behind (%v)", data, err)
	}
	if _, stderr, code := cli(t, bin, "snapshot", "restore", good, "--data", data, "--control-credential-file", credFile, "--bump-tokens", "9223372036854775808"); code != exitUsage {
		t.Fatalf("--bump-tokens 2^63: exit %d, %s", code, stderr)
	}
	res, stderr, code := cli(t, bin, "snapshot", "restore", good, "--data", data, "--control-credential-file", credFile)
	if code != 0 || res["first_token"] != float64(1+control.BumpTokensDefault+1) {
		t.Fatalf("restoring the good backup: exit %d, %v, %s", code, res, stderr)
	}
}
