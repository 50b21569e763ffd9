package core

// Format versions and the cluster version.
//
// A binary reads every format version up to the ones it writes. During a
// rolling upgrade the members run different binaries, so a leader must not
// propose an entry, nor write a snapshot, that a member cannot read: a
// replica that cannot decode a committed entry stops (it never skips one,
// which would let replicas diverge). The cluster version is the newest
// format set every member has said it can read. It is replicated state,
// raised only by a committed SetClusterVersion, which the leader proposes
// once every member reports (over its status endpoint) that it supports
// the new version.
//
//	cluster version 1: entry v1, lock record v1, snapshot v2, control record v1
//	cluster version 2: adds Renew, Grant.Identity and SetClusterVersion
//	                   (entry v2), identities in lock records (v2), snapshot
//	                   v3 and control record v2 (which carry identities and
//	                   the cluster version)

// MaxClusterVersion is the newest cluster version this binary supports. It
// reports it in its status; the leader proposes SetClusterVersion only up
// to the lowest version any member reports.
const MaxClusterVersion uint64 = 2

// MaxEntryVersion is the newest log entry format this binary decodes.
const MaxEntryVersion = EntryVersion2

// CommandVersion is the cluster version a command needs before it may be
// proposed and applied: 2 for Renew and a Grant carrying an Identity, 1
// for the rest. SetClusterVersion itself needs only version 1: what it
// needs instead is every member's report that it reads the new version.
func CommandVersion(c Command) uint64 {
	if c.Kind == KindRenew || c.Kind == KindGrant && c.Identity != "" {
		return 2
	}
	return 1
}

// entryVersion is the oldest entry format that can carry c; EncodeEntry
// writes that one, so that commands of cluster version 1 stay readable by
// binaries that know only entry version 1.
func entryVersion(c Command) byte {
	if CommandVersion(c) >= 2 || c.Kind == KindControl && c.Control.Op == ControlSetClusterVersion {
		return EntryVersion2
	}
	return EntryVersion1
}
