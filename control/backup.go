package control

import (
	"bytes"
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
// about it, and a SHA-256 over the whole file:
//
//	"TKDBACK" | version:1 | info_len:uint32 BE | info (JSON, BackupInfo)
//	          | data_len:uint64 BE | data (core snapshot) | sha256:32 (of all before)
//
// A backup file is hostile input: ReadBackup checks the checksum, the
// version, every length against its limit and the info against the data
// before anything uses it, and fails with one of the errors below.

// Backup format and limits.
const (
	BackupVersion = 1
	// MaxBackupInfo bounds the JSON info section.
	MaxBackupInfo = 64 << 10
	// MaxBackupData bounds the core snapshot in a backup: the largest
	// snapshot the peer transport can send, so a restored node can bring
	// its first followers up to date.
	MaxBackupData = peer.MaxSnapshotSize
	// MaxBackupSize bounds a whole backup file.
	MaxBackupSize = len(backupMagic) + 1 + 4 + MaxBackupInfo + 8 + MaxBackupData + sha256.Size
)

var backupMagic = [7]byte{'T', 'K', 'D', 'B', 'A', 'C', 'K'}

// Errors of reading a backup; each wraps the detail.
var (
	// ErrBackupCorrupt: not a backup file, truncated, a checksum that does
	// not match, or an info section that contradicts the data.
	ErrBackupCorrupt = errors.New("control: corrupt backup")
	// ErrBackupVersion: a backup format this binary does not read.
	ErrBackupVersion = errors.New("control: unknown backup version")
	// ErrBackupTooLarge: a file or section above its limit.
	ErrBackupTooLarge = errors.New("control: backup too large")
)

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
	SHA256         string    `json:"sha256,omitempty"`
}

// Backup is a decoded, verified backup file.
type Backup struct {
	Info BackupInfo
	// State is the decoded snapshot; Data its bytes.
	State core.SnapshotState
	Data  []byte
}

// EncodeBackup wraps a core snapshot with its info into a backup file.
func EncodeBackup(info BackupInfo, data []byte) ([]byte, error) {
	info.SHA256 = ""
	ib, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("control: encode backup info: %w", err)
	}
	if len(ib) > MaxBackupInfo || len(data) > MaxBackupData {
		return nil, fmt.Errorf("%w: info %d bytes (limit %d), data %d bytes (limit %d)", ErrBackupTooLarge, len(ib), MaxBackupInfo, len(data), MaxBackupData)
	}
	b := make([]byte, 0, len(backupMagic)+1+4+len(ib)+8+len(data)+sha256.Size)
	b = append(b, backupMagic[:]...)
	b = append(b, BackupVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ib)))
	b = append(b, ib...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, data...)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...), nil
}

// DecodeBackup verifies and decodes a backup file.
func DecodeBackup(b []byte) (Backup, error) {
	corrupt := func(format string, args ...any) (Backup, error) {
		return Backup{}, fmt.Errorf("%w: %s", ErrBackupCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) > MaxBackupSize {
		return Backup{}, fmt.Errorf("%w: %d bytes, the limit is %d", ErrBackupTooLarge, len(b), MaxBackupSize)
	}
	head := len(backupMagic) + 1
	if len(b) < head+4+8+sha256.Size || !bytes.Equal(b[:len(backupMagic)], backupMagic[:]) {
		return corrupt("not a ticketd backup (%d bytes)", len(b))
	}
	if v := b[len(backupMagic)]; v != BackupVersion {
		return Backup{}, fmt.Errorf("%w: version %d, this binary reads %d", ErrBackupVersion, v, BackupVersion)
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return corrupt("checksum mismatch (truncated or altered)")
	}
	rest := body[head:]
	infoLen := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	if infoLen > MaxBackupInfo {
		return Backup{}, fmt.Errorf("%w: info declares %d bytes, the limit is %d", ErrBackupTooLarge, infoLen, MaxBackupInfo)
	}
	if uint64(len(rest)) < uint64(infoLen)+8 {
		return corrupt("info declares %d bytes, %d left", infoLen, len(rest))
	}
	var info BackupInfo
	dec := json.NewDecoder(bytes.NewReader(rest[:infoLen]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		return corrupt("info: %v", err)
	}
	if dec.More() {
		return corrupt("info: trailing data")
	}
	rest = rest[infoLen:]
	dataLen := binary.BigEndian.Uint64(rest)
	rest = rest[8:]
	if dataLen > MaxBackupData {
		return Backup{}, fmt.Errorf("%w: data declares %d bytes, the limit is %d", ErrBackupTooLarge, dataLen, MaxBackupData)
	}
	if uint64(len(rest)) != dataLen {
		return corrupt("data declares %d bytes, %d present", dataLen, len(rest))
	}
	st, err := core.DecodeSnapshotState(rest)
	if err != nil {
		return Backup{}, fmt.Errorf("%w: snapshot: %w", ErrBackupCorrupt, err)
	}
	cv := max(1, st.Control.ClusterVersion)
	if info.LastToken != st.LastToken || info.Locks != len(st.Locks) || info.ClusterVersion != cv || info.Bootstrapped != st.Control.Bootstrapped {
		return corrupt("info (last token %d, %d locks, cluster version %d, bootstrapped %v) contradicts the snapshot (%d, %d, %d, %v)",
			info.LastToken, info.Locks, info.ClusterVersion, info.Bootstrapped, st.LastToken, len(st.Locks), cv, st.Control.Bootstrapped)
	}
	info.SHA256 = hex.EncodeToString(sum)
	return Backup{Info: info, State: st, Data: rest}, nil
}

// ReadBackup reads and verifies a backup file, refusing one above
// MaxBackupSize before reading it.
func ReadBackup(path string) (Backup, error) {
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
	bk, err := DecodeBackup(b)
	if err != nil {
		return Backup{}, fmt.Errorf("%s: %w", path, err)
	}
	return bk, nil
}
