package daemon

import (
	"context"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
)

// Options.MaxClusterVersion lets a test run a member that acts as a binary
// of an older cluster version during a rolling upgrade, in process: it
// reports that version as its max_cluster_version in status (what the
// leader's version probe reads), as leader it raises the cluster version
// no higher, and its raft node stops at a committed entry of a newer
// format, as an older binary does (raftstore.UndecodableEntryError).
// What it does not mimic: it still reads newer snapshot and record
// formats, and still serves the newer subjects; the cluster version
// (replicated state) is what refuses their commands until the upgrade.

// versionProbe is the control plane's member version probe. With own set,
// every member's answer is capped at own: the control plane probes the
// other members only, so as leader this node then raises the cluster
// version no higher than it reads itself.
func versionProbe(probe control.VersionProbe, own uint64) control.VersionProbe {
	if own == 0 || own >= core.MaxClusterVersion {
		return probe
	}
	return func(ctx context.Context, id uint64) (uint64, error) {
		v, err := probe(ctx, id)
		return min(v, own), err
	}
}

// maxEntryVersion is the newest entry format a node of cluster version v
// applies (0: no limit). Entry version N came with cluster version N
// (core/version.go).
func maxEntryVersion(v uint64) byte {
	if v == 0 || v >= core.MaxClusterVersion {
		return 0
	}
	return byte(v)
}
