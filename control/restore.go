package control

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/raftstore"
)

// BumpTokensDefault is how far a restore moves the token counter past the
// backup's last token when the operator does not say. The restored
// cluster must never issue a token at or below one the old cluster may
// have issued after the backup, and nothing in a backup can say how long
// the old cluster kept running. 2^40 (about 1.1e12) covers an old cluster
// that went on granting 10,000 locks a second for three and a half years
// after the backup (a node does a few thousand a second), and still
// leaves tokens below 2^53, the largest integer a JavaScript client reads
// exactly from JSON, for 8,000 such restores.
const BumpTokensDefault uint64 = 1 << 40

// RestoreTokenHeadroom is how many tokens a restored cluster must still be
// able to issue: Restore refuses a backup whose last token, plus
// BumpTokens, is above MaxRestoredToken (2^63 - 1). The counter never
// wraps; a cluster that reached the top of the range could grant nothing
// more, ever (a forged backup with last token 2^64-2^40-2 did that to
// every acquire from the third on). No real cluster comes near: 10,000
// grants a second for 29 million years, or 8 million restores with the
// default bump.
const RestoreTokenHeadroom uint64 = 1 << 63

// MaxRestoredToken is the highest token counter a restore may start a
// cluster from.
const MaxRestoredToken = math.MaxUint64 - RestoreTokenHeadroom

// ErrTokenHeadroom: the backup's last token plus the bump leaves the
// restored cluster less than RestoreTokenHeadroom tokens.
var ErrTokenHeadroom = errors.New("control: token counter too close to the top of its range")

// Restore modes.
const (
	// RestoreControlPlane: a bootstrapped backup seeds the only voter of a
	// new control-plane cluster under a fresh identity; more members join
	// it with join credentials.
	RestoreControlPlane = "control-plane"
	// RestoreStatic: the node is one of the voters of a static member
	// list (--initial-cluster); every member restores the same file.
	RestoreStatic = "static"
)

// RestoreOptions says how to seed a node from a backup.
type RestoreOptions struct {
	// DataDir is the node's data directory (the identity file goes there)
	// and StoreDir its raft store inside it; neither may hold a node yet.
	DataDir  string
	StoreDir string
	// PeerAddress is the peer address (--peer-listen) the seeding member
	// of a control-plane cluster will serve; the new control state
	// records it.
	PeerAddress string
	// Voters, when set, makes the restore static: the node with raft id ID
	// is one of these voters, and every voter restores the same backup.
	// A backup that was never bootstrapped restores static too, as the
	// single voter ID when Voters is empty.
	ID     uint64
	Voters []uint64
	// ClusterID is the new cluster's ID, recorded in the seeded store so
	// that the restored cluster and the old one (or any other) refuse each
	// other's peers. Required: a restored cluster is a new cluster.
	// RestoredClusterID computes it for a static restore; a control-plane
	// restore may pick a random one (its joiners learn it on admission).
	ClusterID uint64
	// BumpTokens and DropLocks: see core.ReseedOptions.
	BumpTokens uint64
	DropLocks  bool
	Logger     *slog.Logger
}

// Restored reports what Restore wrote.
type Restored struct {
	Mode        string   `json:"mode"`
	NodeID      uint64   `json:"node_id"`
	Incarnation uint64   `json:"incarnation,omitempty"`
	Voters      []uint64 `json:"voters"`
	// Index is the raft index the node starts from (the backup's).
	Index uint64 `json:"index"`
	// BackupLastToken is the backup's last token, FirstToken the first
	// token the new cluster issues.
	BackupLastToken uint64 `json:"backup_last_token"`
	FirstToken      uint64 `json:"first_token"`
	Locks           int    `json:"locks"`
	DroppedLocks    int    `json:"dropped_locks,omitempty"`
	// ClusterID is the new cluster's ID, in hex.
	ClusterID string `json:"cluster_id"`
}

// ErrRestore wraps every refusal of Restore's options or target.
var ErrRestore = errors.New("control: restore refused")

// Restore seeds a node's data directory from a verified backup: its raft
// store starts from a snapshot of the reseeded state (core.Reseed) at the
// backup's index, and, for a control-plane cluster, its identity file
// names the fresh identity. Nothing is written unless every check passes;
// a data directory that already holds a store or an identity is refused.
func Restore(b Backup, o RestoreOptions) (Restored, error) {
	refuse := func(format string, args ...any) (Restored, error) {
		return Restored{}, fmt.Errorf("%w: %s", ErrRestore, fmt.Sprintf(format, args...))
	}
	if o.DataDir == "" || o.StoreDir == "" {
		return refuse("a data directory is required")
	}
	if o.ID == 0 {
		o.ID = 1
	}
	if o.ClusterID == 0 {
		return refuse("a cluster id is required")
	}
	static := len(o.Voters) > 0 || !b.State.Control.Bootstrapped
	voters := slices.Clone(o.Voters)
	switch {
	case static && len(voters) == 0:
		voters = []uint64{o.ID}
	case static && !slices.Contains(voters, o.ID):
		return refuse("id %d is not among the voters %v", o.ID, voters)
	case !static && o.PeerAddress == "":
		return refuse("the backup is of a control-plane cluster: name the new member's peer address (its --peer-listen), or restore a static cluster with its member list")
	}
	if last := b.State.LastToken; last > MaxRestoredToken || o.BumpTokens > MaxRestoredToken-last {
		return Restored{}, fmt.Errorf("%w: %w: the backup's last token %d plus --bump-tokens %d is above %d, which leaves the restored cluster fewer than 2^63 tokens to issue; a real cluster never gets there: the backup is forged or broken, or the bump too large",
			ErrRestore, ErrTokenHeadroom, last, o.BumpTokens, MaxRestoredToken)
	}
	if _, ok, err := ReadIdentity(o.DataDir); err != nil {
		return refuse("%s: reading its node identity: %v", o.DataDir, err)
	} else if ok {
		return refuse("%s already holds a node identity: restore into a new, empty data directory", o.DataDir)
	}
	state, id, err := core.Reseed(b.State, core.ReseedOptions{
		BumpTokens: o.BumpTokens, DropLocks: o.DropLocks, Static: len(o.Voters) > 0, Address: o.PeerAddress,
	})
	if err != nil {
		return refuse("%v", err)
	}
	res := Restored{Mode: RestoreStatic, NodeID: o.ID, Voters: voters, Index: max(1, b.Info.AppliedIndex),
		BackupLastToken: b.State.LastToken, FirstToken: state.LastToken + 1, Locks: len(state.Locks),
		DroppedLocks: len(b.State.Locks) - len(state.Locks)}
	if !static {
		res.Mode, res.NodeID, res.Incarnation, res.Voters = RestoreControlPlane, id.NodeID, id.Incarnation, []uint64{id.NodeID}
	}
	if err := os.MkdirAll(o.DataDir, 0o750); err != nil {
		return Restored{}, fmt.Errorf("control: restore: %w", err)
	}
	// A new cluster: its log starts at the backup's index in term 1, and
	// the first election moves it past that.
	snap := raftpb.Snapshot{Data: core.EncodeSnapshotState(state), Metadata: raftpb.SnapshotMetadata{
		Index: res.Index, Term: 1, ConfState: raftpb.ConfState{Voters: res.Voters},
	}}
	if err := raftstore.Seed(o.StoreDir, snap, raftstore.StoreOptions{Logger: o.Logger}); err != nil {
		return Restored{}, fmt.Errorf("control: restore: %w", err)
	}
	if err := recordClusterID(o.StoreDir, o.ClusterID, o.Logger); err != nil {
		return Restored{}, fmt.Errorf("control: restore: the store is seeded in %s but %w; remove it and restore again", filepath.Clean(o.StoreDir), err)
	}
	res.ClusterID = fmt.Sprintf("%016x", o.ClusterID)
	if res.Mode == RestoreControlPlane {
		if err := WriteIdentity(o.DataDir, Identity{NodeID: id.NodeID, Incarnation: id.Incarnation}); err != nil {
			return Restored{}, fmt.Errorf("control: restore: the store is seeded in %s but %w; remove it and restore again", filepath.Clean(o.StoreDir), err)
		}
	}
	return res, nil
}

// recordClusterID writes id into the seeded store at dir.
func recordClusterID(dir string, id uint64, log *slog.Logger) error {
	s, err := raftstore.Open(dir, raftstore.StoreOptions{Logger: log})
	if err != nil {
		return err
	}
	if err := s.SetClusterID(id); err != nil {
		_ = s.Close()
		return err
	}
	return s.Close()
}

// RestoredClusterID is the ID of a static cluster restored from the backup
// whose checksum is backupSHA256: every member restoring the same file with
// the same token and member ids computes the same ID, and it differs from
// the old cluster's (which did not mix in a backup).
func RestoredClusterID(token, backupSHA256 string, memberIDs []uint64) uint64 {
	ids := slices.Clone(memberIDs)
	slices.Sort(ids)
	h := sha256.New()
	fmt.Fprintf(h, "ticketd restored cluster id\x00%s\x00%s\x00%v", token, backupSHA256, ids)
	return max(1, binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

// RandomClusterID is a fresh random cluster ID for a control-plane restore.
func RandomClusterID() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("control: cluster id: %w", err)
	}
	return max(1, binary.BigEndian.Uint64(b[:])), nil
}
