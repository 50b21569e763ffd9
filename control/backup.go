package control

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/transports/peer"
)

// The backup file: one core snapshot (core.Machine.Snapshot: the lock
// table, the token counter and the control state, itself versioned and
// CRC-checked) wrapped with what an operator and a restore need to know
// about it, and authenticated with a key derived from the cluster's
// control credential:
//
//	"TKDBACK" | version:1 (2) | key_id:8 | info_len:uint32 BE | info (JSON, BackupInfo)
//	          | data_len:uint64 BE | data (core snapshot) | mac:32
//
// mac is HMAC-SHA256 under the backup key of every byte before it, and
// key_id names the key (BackupKey). Version 1 files, from before backups
// were authenticated, have no key_id and end in a SHA-256 of every byte
// before it: a checksum anyone can compute again, so they are read only
// when the operator says so (Verify.Insecure).
//
// A backup file is hostile input: DecodeBackup checks the version, the
// key and the MAC, every length against its limit and the info against
// the data before anything uses it, and fails with one of the errors
// below.
//
// # The backup key
//
// The leader seals a backup with, and status and restore verify it with,
// HKDF-SHA256(control credential, info "ticketd/backup/v2 hmac-sha256"):
// whoever holds the control credential can already do anything to the
// cluster, and nobody else can make a file a restore accepts. The label
// keeps the credential itself from ever being a key, and the key from
// standing in for anything else derived from the credential. key_id is
// HMAC-SHA256(key, "ticketd/backup/v2 key id") cut to 8 bytes: it tells a
// file sealed under another credential (ErrBackupKey) from an altered one
// (ErrBackupAuth) and reveals nothing a MAC over known bytes does not.
// Clusters sharing a control credential can read each other's backups;
// give each its own. A backup verifies only with the credential it was
// taken with: keep old credentials as long as their backups.
//
// etcd's snapshot file ends in a SHA-256 (integrity only, with
// --skip-hash-check to skip it); Vault's raft snapshot restore refuses a
// snapshot sealed by other keys unless forced (-force). ticketd does the
// latter with a key every operator already holds.

// Backup format and limits.
const (
	// BackupVersion is the version EncodeBackup writes; backupVersion1
	// files (checksum only) are read with Verify.Insecure.
	BackupVersion  = 2
	backupVersion1 = 1
	// MaxBackupInfo bounds the JSON info section.
	MaxBackupInfo = 64 << 10
	// MaxBackupData bounds the core snapshot in a backup: the largest
	// snapshot the peer transport can send, so a restored node can bring
	// its first followers up to date.
	MaxBackupData = peer.MaxSnapshotSize
	// MaxBackupSize bounds a whole backup file.
	MaxBackupSize = len(backupMagic) + 1 + backupKeyIDSize + 4 + MaxBackupInfo + 8 + MaxBackupData + sha256.Size
	// backupKeyIDSize is the size of key_id.
	backupKeyIDSize = 8
)

// Labels of the backup key's derivation.
const (
	labelBackupKey   = "ticketd/backup/v2 hmac-sha256"
	labelBackupKeyID = "ticketd/backup/v2 key id"
)

var backupMagic = [7]byte{'T', 'K', 'D', 'B', 'A', 'C', 'K'}

// Errors of reading a backup; each wraps the detail. BackupErrorCode
// names each with a stable code.
var (
	// ErrBackupCorrupt: not a backup file, truncated, a version-1
	// checksum that does not match, or an info section that contradicts
	// the data.
	ErrBackupCorrupt = errors.New("control: corrupt backup")
	// ErrBackupVersion: a backup format this binary does not read.
	ErrBackupVersion = errors.New("control: unknown backup version")
	// ErrBackupTooLarge: a file or section above its limit.
	ErrBackupTooLarge = errors.New("control: backup too large")
	// ErrBackupAuth: the MAC does not match under the right key: the file
	// was changed after it was taken (or damaged).
	ErrBackupAuth = errors.New("control: backup altered")
	// ErrBackupKey: the file was sealed under another key: another
	// cluster's backup, or one taken with another control credential.
	ErrBackupKey = errors.New("control: backup sealed with another control credential")
	// ErrBackupNoKey: no control credential to verify the file with.
	ErrBackupNoKey = errors.New("control: no control credential to verify the backup with")
	// ErrBackupUnauthenticated: a version-1 file, which carries a checksum
	// only.
	ErrBackupUnauthenticated = errors.New("control: unauthenticated backup")
)

// backupErrorCodes are the stable codes of the backup and restore errors,
// for the CLI.
var backupErrorCodes = []struct {
	err  error
	code string
}{
	{ErrBackupAuth, "backup_altered"},
	{ErrBackupKey, "backup_wrong_key"},
	{ErrBackupNoKey, "backup_no_key"},
	{ErrBackupUnauthenticated, "backup_unauthenticated"},
	{ErrBackupCorrupt, "backup_corrupt"},
	{ErrBackupVersion, "backup_version"},
	{ErrBackupTooLarge, "backup_too_large"},
	{ErrTokenHeadroom, "token_headroom"},
	{ErrRestore, "restore_refused"},
}

// BackupErrorCode is the stable code of an error of DecodeBackup,
// ReadBackup or Restore ("error" for anything else).
func BackupErrorCode(err error) string {
	for _, c := range backupErrorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "error"
}

// BackupKey authenticates backup files; see the file format above. The
// zero value is no key.
type BackupKey struct {
	key [sha256.Size]byte
	id  [backupKeyIDSize]byte
	set bool
}

// NewBackupKey derives the backup key from the control credential; an
// empty credential gives no key.
func NewBackupKey(credential string) BackupKey {
	if credential == "" {
		return BackupKey{}
	}
	k, err := hkdf.Key(sha256.New, []byte(credential), nil, labelBackupKey, sha256.Size)
	if err != nil { // only for a length above 255 hash sizes
		panic(fmt.Sprintf("control: backup key: %v", err))
	}
	var bk BackupKey
	copy(bk.key[:], k)
	copy(bk.id[:], bk.macOf([]byte(labelBackupKeyID)))
	bk.set = true
	return bk
}

// ID is the key's identifier as a file names it, in hex ("" without a key).
func (k BackupKey) ID() string {
	if !k.set {
		return ""
	}
	return hex.EncodeToString(k.id[:])
}

func (k BackupKey) macOf(b []byte) []byte {
	h := hmac.New(sha256.New, k.key[:])
	h.Write(b)
	return h.Sum(nil)
}

// Verify says how DecodeBackup authenticates a file.
type Verify struct {
	// Key verifies version-2 files (NewBackupKey of the control
	// credential). A file that does not verify under it is refused.
	Key BackupKey
	// Insecure accepts what cannot be authenticated: a version-1 file
	// (its checksum is still checked) and, when Key is unset, a version-2
	// file whose MAC is not checked. Only at the operator's explicit word
	// (--insecure-skip-verify): such a file may say anything, within the
	// limits DecodeBackup and Restore check.
	Insecure bool
}

// BackupInfo describes a backup. The leader that took it fills every field
// but SHA256, which ReadBackup sets from the file.
type BackupInfo struct {
	// NodeID is the leader that took the snapshot, Term its term then.
	NodeID uint64 `json:"node_id"`
	Term   uint64 `json:"term"`
	// AppliedIndex is the raft index the snapshot was taken at: it holds
	// every write committed before the save request reached the leader.
	AppliedIndex   uint64    `json:"applied_index"`
	LastToken      uint64    `json:"last_token"`
	Locks          int       `json:"locks"`
	ClusterVersion uint64    `json:"cluster_version"`
	Bootstrapped   bool      `json:"bootstrapped"`
	Members        []Member  `json:"members,omitempty"`
	TakenAt        time.Time `json:"taken_at"`
	// SHA256 is the SHA-256 of the whole file, in hex (what sha256sum
	// prints), set by DecodeBackup.
	SHA256 string `json:"sha256,omitempty"`
}

// Backup is a decoded backup file.
type Backup struct {
	Info BackupInfo
	// State is the decoded snapshot; Data its bytes.
	State core.SnapshotState
	Data  []byte
	// Version is the file's format version; Authenticated says its MAC
	// was checked under KeyID (false only with Verify.Insecure).
	Version       int
	Authenticated bool
	KeyID         string
}

// EncodeBackup wraps a core snapshot with its info into a backup file
// sealed under key.
func EncodeBackup(info BackupInfo, data []byte, key BackupKey) ([]byte, error) {
	if !key.set {
		return nil, fmt.Errorf("%w: a backup is sealed with the control credential, and none is set", ErrBackupNoKey)
	}
	info.SHA256 = ""
	ib, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("control: encode backup info: %w", err)
	}
	if len(ib) > MaxBackupInfo || len(data) > MaxBackupData {
		return nil, fmt.Errorf("%w: info %d bytes (limit %d), data %d bytes (limit %d)", ErrBackupTooLarge, len(ib), MaxBackupInfo, len(data), MaxBackupData)
	}
	b := make([]byte, 0, len(backupMagic)+1+backupKeyIDSize+4+len(ib)+8+len(data)+sha256.Size)
	b = append(b, backupMagic[:]...)
	b = append(b, BackupVersion)
	b = append(b, key.id[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ib)))
	b = append(b, ib...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, data...)
	return append(b, key.macOf(b)...), nil
}

// DecodeBackup authenticates (as v says) and decodes a backup file.
func DecodeBackup(b []byte, v Verify) (Backup, error) {
	if len(b) > MaxBackupSize {
		return Backup{}, fmt.Errorf("%w: %d bytes, the limit is %d", ErrBackupTooLarge, len(b), MaxBackupSize)
	}
	head := len(backupMagic) + 1
	if len(b) < head+4+8+sha256.Size || !bytes.Equal(b[:len(backupMagic)], backupMagic[:]) {
		return backupCorrupt("not a ticketd backup (%d bytes)", len(b))
	}
	bk := Backup{Version: int(b[len(backupMagic)])}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	switch bk.Version {
	case BackupVersion:
		if len(body) < head+backupKeyIDSize+4+8 {
			return backupCorrupt("truncated (%d bytes)", len(b))
		}
		id := body[head : head+backupKeyIDSize]
		bk.KeyID = hex.EncodeToString(id)
		head += backupKeyIDSize
		switch {
		case v.Key.set && !hmac.Equal(id, v.Key.id[:]):
			return Backup{}, fmt.Errorf("%w: the file names key %s, the credential given derives %s", ErrBackupKey, bk.KeyID, v.Key.ID())
		case v.Key.set && !hmac.Equal(sum, v.Key.macOf(body)):
			return Backup{}, fmt.Errorf("%w: its MAC does not match under key %s (changed or damaged after it was taken)", ErrBackupAuth, bk.KeyID)
		case v.Key.set:
			bk.Authenticated = true
		case !v.Insecure:
			return Backup{}, fmt.Errorf("%w: give the control credential the backup was taken with (key %s)", ErrBackupNoKey, bk.KeyID)
		}
	case backupVersion1:
		if !v.Insecure {
			return Backup{}, fmt.Errorf("%w: a version-1 backup carries a checksum, not a signature; restore it only if you trust where it has been (--insecure-skip-verify)", ErrBackupUnauthenticated)
		}
		if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
			return backupCorrupt("checksum mismatch (truncated or altered)")
		}
	default:
		return Backup{}, fmt.Errorf("%w: version %d, this binary reads %d and %d", ErrBackupVersion, bk.Version, backupVersion1, BackupVersion)
	}
	info, data, st, err := decodeBackupBody(body[head:])
	if err != nil {
		return Backup{}, err
	}
	whole := sha256.Sum256(b)
	info.SHA256 = hex.EncodeToString(whole[:])
	bk.Info, bk.State, bk.Data = info, st, data
	return bk, nil
}

func backupCorrupt(format string, args ...any) (Backup, error) {
	return Backup{}, fmt.Errorf("%w: %s", ErrBackupCorrupt, fmt.Sprintf(format, args...))
}

// decodeBackupBody decodes info_len | info | data_len | data, the part
// both versions share, and checks the info against the snapshot.
func decodeBackupBody(rest []byte) (BackupInfo, []byte, core.SnapshotState, error) {
	var info BackupInfo
	corrupt := func(format string, args ...any) (BackupInfo, []byte, core.SnapshotState, error) {
		return info, nil, core.SnapshotState{}, fmt.Errorf("%w: %s", ErrBackupCorrupt, fmt.Sprintf(format, args...))
	}
	if len(rest) < 4 {
		return corrupt("truncated header")
	}
	infoLen := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	if infoLen > MaxBackupInfo {
		return info, nil, core.SnapshotState{}, fmt.Errorf("%w: info declares %d bytes, the limit is %d", ErrBackupTooLarge, infoLen, MaxBackupInfo)
	}
	if uint64(len(rest)) < uint64(infoLen)+8 {
		return corrupt("info declares %d bytes, %d left", infoLen, len(rest))
	}
	dec := json.NewDecoder(bytes.NewReader(rest[:infoLen]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		return corrupt("info: %v", err)
	}
	if dec.More() {
		return corrupt("info: trailing data")
	}
	if info.SHA256 != "" {
		return corrupt("info: sha256 is set by the reader, not the file")
	}
	rest = rest[infoLen:]
	dataLen := binary.BigEndian.Uint64(rest)
	rest = rest[8:]
	if dataLen > MaxBackupData {
		return info, nil, core.SnapshotState{}, fmt.Errorf("%w: data declares %d bytes, the limit is %d", ErrBackupTooLarge, dataLen, MaxBackupData)
	}
	if uint64(len(rest)) != dataLen {
		return corrupt("data declares %d bytes, %d present", dataLen, len(rest))
	}
	st, err := core.DecodeSnapshotState(rest)
	if err != nil {
		return info, nil, core.SnapshotState{}, fmt.Errorf("%w: snapshot: %w", ErrBackupCorrupt, err)
	}
	cv := max(1, st.Control.ClusterVersion)
	if info.LastToken != st.LastToken || info.Locks != len(st.Locks) || info.ClusterVersion != cv || info.Bootstrapped != st.Control.Bootstrapped {
		return corrupt("info (last token %d, %d locks, cluster version %d, bootstrapped %v) contradicts the snapshot (%d, %d, %d, %v)",
			info.LastToken, info.Locks, info.ClusterVersion, info.Bootstrapped, st.LastToken, len(st.Locks), cv, st.Control.Bootstrapped)
	}
	return info, rest, st, nil
}

// ReadBackup reads, authenticates (as v says) and decodes a backup file,
// refusing one above MaxBackupSize before reading it.
func ReadBackup(path string, v Verify) (Backup, error) {
	f, err := os.Open(path)
	if err != nil {
		return Backup{}, fmt.Errorf("control: read backup: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(MaxBackupSize) {
		return Backup{}, fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrBackupTooLarge, path, fi.Size(), MaxBackupSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(MaxBackupSize)+1))
	if err != nil {
		return Backup{}, fmt.Errorf("control: read backup %s: %w", path, err)
	}
	bk, err := DecodeBackup(b, v)
	if err != nil {
		return Backup{}, fmt.Errorf("%s: %w", path, err)
	}
	return bk, nil
}
