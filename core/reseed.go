package core

import (
	"cmp"
	"math"
	"slices"
)

// Seeding a new cluster from a backup. etcd's `etcdutl snapshot restore`
// is the anchor: the data survives, the membership does not. A restored
// cluster is a new cluster; the machines of the old one may still hold
// their data, identities and credentials, and must never be mistaken for
// members of the new one.

// ReseedSessionBump is how far Reseed moves the session ID counter past
// the backup's: more sessions than the old cluster could have opened after
// the backup was taken (2^40: a million a second for twelve days), and
// room for 2^24 restores.
const ReseedSessionBump = 1 << 40

// ReseedOptions says how a backed-up state becomes a new cluster's.
type ReseedOptions struct {
	// BumpTokens is added to the token counter, so the new cluster's first
	// token is LastToken+BumpTokens+1. It must cover every token the old
	// cluster may have issued after the backup was taken: a fencing
	// resource may have seen those, and must never see one of them again.
	BumpTokens uint64
	// DropLocks empties the lock table. Otherwise every lock comes back
	// with its token and owner, and the new leader times its full lease
	// again: a lock its holder thinks lost may still block its key. A
	// dropped lock granted with a request id ends: its request record
	// moves to the ended ones, so that a retry of that acquire learns the
	// grant ended instead of being granted again. Dropping the locks drops
	// every session and lock-delay too (see Reseed).
	DropLocks bool
	// Static: the new cluster runs from a static member list without a
	// control plane, so the control state keeps only the cluster version.
	Static bool
	// Address is the peer address of the member that seeds a
	// control-plane cluster (not Static, and the backup bootstrapped).
	Address string
}

// Reseed returns the state a new cluster starts from, and the identity
// of the member that seeds it when the cluster keeps its control plane
// (zero otherwise). The input is not changed.
//
// With a control plane (the backup is bootstrapped and o.Static is
// false) the seeding member gets a fresh identity above every NodeID and
// incarnation the old cluster issued and becomes the only voter; every
// old member is retired, so a machine of the old cluster that presents
// its identity is refused; a pending replacement is dropped with the
// members it named; join credentials minted but never used are dropped
// (they were handed out for the old cluster), consumed ones stay
// consumed, and the consumed bootstrap credential stays consumed. The
// cluster version is kept: the data is in its formats. The fence keys are
// kept too, in every case: fences the old cluster signed must keep
// verifying against the restored one's keys. The request records are kept
// (see DropLocks).
//
// Sessions (cluster version 4) are kept with their locks, epochs and
// lock-delays, and the new leader times each with its full TTL, as it
// does each kept lock's lease; delayed keys are kept and timed with their
// full delay. With DropLocks they are dropped with the locks: a session
// kept without its locks would answer its holder's keepalives as if it
// still held them. Either way the session ID counter moves on by
// ReseedSessionBump, so that no ID the old cluster may have issued after
// the backup is issued again (a client of the old cluster may still hold
// one and keep it alive).
//
// A state before cluster version 4 has no sessions, and its counter stays
// 0 (a bumped counter would be a session state that version cannot have).
//
// A backup that was never bootstrapped keeps its (empty) control state;
// Static keeps only the cluster version and the fence keys: a static
// cluster has no control-plane members, and the old identities mean
// nothing in it.
func Reseed(s SnapshotState, o ReseedOptions) (SnapshotState, Identity, error) {
	if o.BumpTokens > math.MaxUint64-s.LastToken {
		return SnapshotState{}, Identity{}, invalidf("bumping last token %d by %d overflows", s.LastToken, o.BumpTokens)
	}
	out := SnapshotState{LastToken: s.LastToken + o.BumpTokens, Requests: s.Requests}
	out.Requests.Ended = slices.Clone(s.Requests.Ended)
	if s.Control.ClusterVersion >= 4 {
		if s.Sessions.LastSessionID > math.MaxUint64-ReseedSessionBump {
			return SnapshotState{}, Identity{}, invalidf("bumping last session id %d by %d overflows", s.Sessions.LastSessionID, uint64(ReseedSessionBump))
		}
		out.Sessions = SessionState{LastSessionID: s.Sessions.LastSessionID + ReseedSessionBump, LastDelaySeq: s.Sessions.LastDelaySeq}
		if !o.DropLocks {
			out.Sessions.Sessions = slices.Clone(s.Sessions.Sessions)
			out.Sessions.Delays = slices.Clone(s.Sessions.Delays)
		}
	}
	if !o.DropLocks {
		out.Locks = slices.Clone(s.Locks)
		// Multi-holder keys (cluster version 5) are carried like locks,
		// with their delayed slots like delayed keys.
		for _, kh := range s.Holders {
			kh.Holders, kh.Delays = slices.Clone(kh.Holders), slices.Clone(kh.Delays)
			out.Holders = append(out.Holders, kh)
		}
	} else {
		ended := func(l *Lock) {
			if l.RequestID != "" {
				out.Requests.Ended = append(out.Requests.Ended, EndedRequest{Request: RequestKey(l.Identity, l.RequestID),
					KeyHash: RequestKeyHash(l.Key), Token: l.Token, EndedAtMS: s.Requests.DataClockMS})
			}
		}
		for i := range s.Locks { // in key order: deterministic
			ended(&s.Locks[i])
		}
		for _, kh := range s.Holders { // then the holders, by key and token
			for i := range kh.Holders {
				ended(&kh.Holders[i])
			}
		}
	}
	switch {
	case o.Static:
		out.Control = ControlState{ClusterVersion: s.Control.ClusterVersion, FenceKeys: slices.Clone(s.Control.FenceKeys)}
		return out, Identity{}, nil
	case !s.Control.Bootstrapped:
		out.Control = s.Control
		return out, Identity{}, nil
	}
	cs, id, err := reseedControl(s.Control, o.Address)
	if err != nil {
		return SnapshotState{}, Identity{}, err
	}
	out.Control = cs
	return out, id, nil
}

// reseedControl retires every member of a bootstrapped control state and
// issues the seeding member.
func reseedControl(old ControlState, addr string) (ControlState, Identity, error) {
	if err := ValidateAddress(addr); err != nil {
		return ControlState{}, Identity{}, err
	}
	if len(old.Issued) >= MaxControlNodes || old.LastNodeID == math.MaxUint64 || old.LastIncarnation == math.MaxUint64 {
		return ControlState{}, Identity{}, invalidf("no NodeID left to issue: %d issued, last %d/%d", len(old.Issued), old.LastNodeID, old.LastIncarnation)
	}
	id := Identity{NodeID: old.LastNodeID + 1, Incarnation: old.LastIncarnation + 1}
	cs := ControlState{
		Bootstrapped:    true,
		BootstrapHash:   old.BootstrapHash,
		LastNodeID:      id.NodeID,
		LastIncarnation: id.Incarnation,
		Members:         []Member{{NodeID: id.NodeID, Incarnation: id.Incarnation, Address: addr, Role: RoleVoter}},
		Issued:          append(slices.Clone(old.Issued), id), // id is above all: still sorted
		ClusterVersion:  old.ClusterVersion,
		FenceKeys:       slices.Clone(old.FenceKeys),
	}
	cs.Retired = slices.Clone(old.Retired)
	for _, m := range old.Members {
		cs.Retired = append(cs.Retired, Identity{NodeID: m.NodeID, Incarnation: m.Incarnation})
	}
	slices.SortFunc(cs.Retired, func(a, b Identity) int { return cmp.Compare(a.NodeID, b.NodeID) })
	for _, jc := range old.JoinCredentials {
		if jc.State == CredentialConsumed {
			cs.JoinCredentials = append(cs.JoinCredentials, jc)
		}
	}
	// The same invariants a decoder checks: the result must be a state a
	// snapshot can carry.
	if err := validateControlState(cs); err != nil {
		return ControlState{}, Identity{}, err
	}
	return cs, id, nil
}
