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
		RequestID:   strings.Repeat("r", core.MaxRequestIDLen),
		LeaseMS:     core.MaxLeaseMS,
		GrantedAtMS: math.MaxUint64,
	}
	v4 := core.ControlState{ClusterVersion: 3} // snapshot version 4 carries identities and request ids
	// The fixed part: header and an empty request section at their largest.
	maxReq := core.RequestState{DataClockMS: math.MaxUint64, EndedHead: math.MaxUint64}
	empty := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq}))
	one := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Locks: []core.Lock{big}, Control: v4, Requests: maxReq}))
	if per := one - empty; per > core.MaxLockSnapshotSize {
		t.Fatalf("one maximal lock takes %d bytes, MaxLockSnapshotSize says %d", per, core.MaxLockSnapshotSize)
	}
	if empty > 64 {
		t.Fatalf("the fixed part of a snapshot (with an empty control state) is %d bytes, the arithmetic allows 64", empty)
	}
	// One maximal ended request record.
	maxReq.Ended = []core.EndedRequest{{Token: math.MaxUint64, EndedAtMS: math.MaxUint64}}
	maxReq.EndedHead = math.MaxUint64 - 1
	withEnded := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq}))
	if per := withEnded - empty; per > core.MaxEndedSnapshotSize {
		t.Fatalf("one maximal ended request takes %d bytes, MaxEndedSnapshotSize says %d", per, core.MaxEndedSnapshotSize)
	}
	// A full lock table whose every lock has a request id must leave room
	// for at least half as many ended records.
	if core.MaxRequestRecords-(core.MaxLocks+core.MaxLocksOverrun) < core.MaxLocks/2 {
		t.Fatalf("MaxRequestRecords %d leaves a full lock table little room for ended records", core.MaxRequestRecords)
	}
	if core.MinRequestRetentionMS > core.RequestRetentionMS || core.RequestPruneBudget < 2 {
		t.Fatal("the retention constants contradict each other")
	}
	// The largest control state the limits allow (the encoder does not
	// check invariants, which do not change sizes).
	cs := core.ControlState{Bootstrapped: true, LastNodeID: math.MaxUint64, LastIncarnation: math.MaxUint64, ClusterVersion: core.MaxClusterVersion,
		Pending: &core.Replacement{Old: math.MaxUint64, New: math.MaxUint64, NewIncarnation: math.MaxUint64, Address: strings.Repeat("a", core.MaxAddressLen)}}
	for i := range core.MaxFenceKeys {
		cs.FenceKeys = append(cs.FenceKeys, core.FenceSeed{byte(i + 1)})
	}
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
	full := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: cs, Requests: core.RequestState{DataClockMS: math.MaxUint64, EndedHead: math.MaxUint64}}))
	if full > 64+core.MaxControlSnapshotSize {
		t.Fatalf("the largest control section takes %d bytes, MaxControlSnapshotSize says %d", full-empty, core.MaxControlSnapshotSize)
	}
	if core.MaxRequestsSnapshotSize != 30+core.MaxRequestRecords*core.MaxEndedSnapshotSize {
		t.Fatal("MaxRequestsSnapshotSize does not follow MaxRequestRecords")
	}
	t.Logf("largest snapshot: %d bytes (MaxSnapshotSize); one maximal lock %d bytes; largest control section %d bytes; one ended request %d bytes",
		core.MaxSnapshotSize, one-empty, full, withEnded-empty)
}
