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
//	cluster version 3: adds Grant.RequestID and SetFenceKey (entry v3),
//	                   request ids in lock records (v3), the request
//	                   records and the data clock (snapshot v4, which also
//	                   carries lock request ids), fence signing keys
//	                   (control record v3, in snapshot v4 too)
//	cluster version 4: adds sessions and lock-delays (sessions.go):
//	                   OpenSession, CloseSession, ExpireSession,
//	                   RefreshSession, ClearDelay, Grant.SessionID and
//	                   Grant.LockDelayMS (entry v4), each lock's session
//	                   and lock-delay (lock record v4), session and delay
//	                   records, and the session section (snapshot v5, with
//	                   the control section still in its v3 form: the
//	                   control record does not change)
//
// A cluster at version 3 also keeps its request records (requests.go): the
// data clock advances with every Grant and ended records are pruned, even
// while no command carries a request id. That changes no result of a
// command of an earlier version, so raising the version is harmless to
// clients that never send one; it does change the snapshot, control record
// and digest formats, which is why it waits for every member. Likewise a
// cluster at version 4 writes snapshot v5 and digest v3 even while it has
// no session and no lock-delay.

// MaxClusterVersion is the newest cluster version this binary supports. It
// reports it in its status; the leader proposes SetClusterVersion only up
// to the lowest version any member reports.
const MaxClusterVersion uint64 = 6

// MaxEntryVersion is the newest log entry format this binary decodes.
const MaxEntryVersion = EntryVersion6

// CommandVersion is the cluster version a command needs before it may be
// proposed and applied: 6 for Settle, 5 for a Grant carrying a Limit or a Mode, 4 for the session and lock-delay commands and a
// Grant carrying a SessionID or a LockDelayMS, 3 for a Grant carrying a
// RequestID and for SetFenceKey, 2 for Renew and a Grant carrying an
// Identity, 1 for the rest. SetClusterVersion itself needs only version 1:
// what it needs instead is every member's report that it reads the new
// version.
func CommandVersion(c Command) uint64 {
	switch {
	case c.Kind == KindSettle:
		return 6
	case c.Kind == KindGrant && (c.Limit != 0 || c.Mode != 0):
		return 5
	case c.Kind.isSession(), c.Kind == KindGrant && (c.SessionID != 0 || c.LockDelayMS != 0):
		return 4
	case c.Kind == KindGrant && c.RequestID != "", c.Kind == KindControl && c.Control.Op == ControlSetFenceKey:
		return 3
	case c.Kind == KindRenew || c.Kind == KindGrant && c.Identity != "":
		return 2
	}
	return 1
}

// entryVersion is the oldest entry format that can carry c; EncodeEntry
// writes that one, so that commands of an earlier cluster version stay
// readable by binaries that know only the entry versions of it.
func entryVersion(c Command) byte {
	switch v := CommandVersion(c); {
	case v >= 6:
		return EntryVersion6
	case v == 5:
		return EntryVersion5
	case v == 4:
		return EntryVersion4
	case v == 3:
		return EntryVersion3
	case v == 2 || c.Kind == KindControl && c.Control.Op == ControlSetClusterVersion:
		return EntryVersion2
	}
	return EntryVersion1
}
