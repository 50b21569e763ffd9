package core_test

import (
	"math"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// The snapshot-size arithmetic of limits.go, checked against the encoders.
func TestSnapshotSizeArithmetic(t *testing.T) {
	if core.MaxLocks+core.MaxLocksOverrun > core.MaxSnapshotLocks {
		t.Fatalf("MaxLocks+MaxLocksOverrun = %d exceeds the decoder's MaxSnapshotLocks %d", core.MaxLocks+core.MaxLocksOverrun, core.MaxSnapshotLocks)
	}
	if core.DefaultMaxLocks > core.MaxLocks {
		t.Fatalf("DefaultMaxLocks %d > MaxLocks %d", core.DefaultMaxLocks, core.MaxLocks)
	}
	// One lock at every maximum.
	big := core.Lock{
		Key:         strings.Repeat("k", core.MaxKeyLen),
		Token:       math.MaxUint64,
		Owner:       strings.Repeat("o", core.MaxOwnerLen),
		Identity:    strings.Repeat("i", core.MaxIdentityLen),
		LeaseMS:     core.MaxLeaseMS,
		GrantedAtMS: math.MaxUint64,
	}
	v3 := core.ControlState{ClusterVersion: 2} // snapshot version 3 carries identities
	empty := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v3}))
	one := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Locks: []core.Lock{big}, Control: v3}))
	if per := one - empty; per > core.MaxLockSnapshotSize {
		t.Fatalf("one maximal lock takes %d bytes, MaxLockSnapshotSize says %d", per, core.MaxLockSnapshotSize)
	}
	if empty > 64 {
		t.Fatalf("the fixed part of a snapshot (with an empty control state) is %d bytes, the arithmetic allows 64", empty)
	}
	// The largest control state the limits allow (the encoder does not
	// check invariants, which do not change sizes).
	cs := core.ControlState{Bootstrapped: true, LastNodeID: math.MaxUint64, LastIncarnation: math.MaxUint64, ClusterVersion: core.MaxClusterVersion,
		Pending: &core.Replacement{Old: math.MaxUint64, New: math.MaxUint64, NewIncarnation: math.MaxUint64, Address: strings.Repeat("a", core.MaxAddressLen)}}
	addr := strings.Repeat("a", core.MaxAddressLen)
	for i := 0; i < core.MaxControlNodes; i++ {
		id := math.MaxUint64 - uint64(core.MaxControlNodes) + uint64(i)
		cs.Members = append(cs.Members, core.Member{NodeID: id, Incarnation: math.MaxUint64, Address: addr, Role: core.RoleVoter})
		cs.Issued = append(cs.Issued, core.Identity{NodeID: id, Incarnation: math.MaxUint64})
		cs.Retired = append(cs.Retired, core.Identity{NodeID: id, Incarnation: math.MaxUint64})
	}
	for i := 0; i < core.MaxJoinCredentials; i++ {
		var h [32]byte
		h[0], h[1] = byte(i>>8), byte(i)
		cs.JoinCredentials = append(cs.JoinCredentials, core.JoinCredential{Hash: h, State: core.CredentialConsumed})
	}
	full := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: cs}))
	if full > 64+core.MaxControlSnapshotSize {
		t.Fatalf("the largest control section takes %d bytes, MaxControlSnapshotSize says %d", full-empty, core.MaxControlSnapshotSize)
	}
	t.Logf("largest snapshot: %d bytes (MaxSnapshotSize); one maximal lock %d bytes; largest control section %d bytes",
		core.MaxSnapshotSize, one-empty, full)
}
