package raftstore

import (
	"errors"
	"fmt"
	"os"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// ErrNotEmpty is returned by Seed for a directory that already holds
// something: a restore never overwrites a store.
var ErrNotEmpty = errors.New("raftstore: directory is not empty")

// Seed creates a store in dir that starts from snap, as a node restored
// from a backup: snap is installed exactly as a snapshot received from a
// leader would be (Write: lock rows, control row, last token, conf state,
// applied index, the log reduced to snap's dummy entry), with the
// HardState {Term: snap term, Commit: snap index}. A node opened on it
// restarts raft from that snapshot and, as the only voter of snap's
// ConfState (or one of its voters), campaigns in a term above it.
//
// dir must not exist or be empty (ErrNotEmpty otherwise). snap.Data must
// be a core snapshot, snap.Metadata.Index at least 1 and the ConfState
// must name at least one voter.
func Seed(dir string, snap raftpb.Snapshot, opts StoreOptions) (err error) {
	meta := snap.Metadata
	if meta.Index == 0 || meta.Term == 0 || len(meta.ConfState.Voters) == 0 {
		return fmt.Errorf("raftstore: seed: %w: snapshot index %d, term %d, voters %v", ErrInvariant, meta.Index, meta.Term, meta.ConfState.Voters)
	}
	if _, err := core.DecodeSnapshotState(snap.Data); err != nil {
		return fmt.Errorf("raftstore: seed: %w", err)
	}
	switch entries, err := os.ReadDir(dir); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("raftstore: seed: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("%w: %s holds %d entries", ErrNotEmpty, dir, len(entries))
	}
	s, err := Open(dir, opts)
	if err != nil {
		return fmt.Errorf("raftstore: seed: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	hs := raftpb.HardState{Term: meta.Term, Commit: meta.Index}
	if err := s.Write(ReadyWrite{Snapshot: snap, HardState: hs}); err != nil {
		return fmt.Errorf("raftstore: seed: %w", err)
	}
	s.log.Info("store seeded from a snapshot", "dir", dir, "index", meta.Index, "term", meta.Term, "voters", meta.ConfState.Voters)
	return nil
}
