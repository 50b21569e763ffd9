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
	big.LockDelayMS = core.MaxLockDelayMS
	// The largest session lock has no lease nor delay, but the largest id.
	bigSession := big
	bigSession.LeaseMS, bigSession.LockDelayMS, bigSession.SessionID = 0, 0, math.MaxUint64
	v4 := core.ControlState{ClusterVersion: 4} // snapshot version 5 carries every lock field
	// The fixed part: header and an empty request section at their largest.
	maxReq := core.RequestState{DataClockMS: math.MaxUint64, EndedHead: math.MaxUint64}
	empty := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq}))
	for _, l := range []core.Lock{big, bigSession} {
		ss := core.SessionState{}
		if l.SessionID != 0 {
			ss = core.SessionState{LastSessionID: math.MaxUint64, Sessions: []core.Session{{ID: math.MaxUint64, TTLMS: core.MinSessionTTLMS, Epoch: 1}}}
		}
		base := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq, Sessions: ss}))
		one := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Locks: []core.Lock{l}, Control: v4, Requests: maxReq, Sessions: ss}))
		if per := one - base; per > core.MaxLockSnapshotSize {
			t.Fatalf("one maximal lock takes %d bytes, MaxLockSnapshotSize says %d", per, core.MaxLockSnapshotSize)
		}
	}
	one := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Locks: []core.Lock{big}, Control: v4, Requests: maxReq}))
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
	// The session section: its header at its largest, one maximal session
	// and one maximal delayed key (their records are checked against
	// MaxSessionSnapshotSize and MaxDelaySnapshotSize in version4_test.go).
	maxReq = core.RequestState{DataClockMS: math.MaxUint64, EndedHead: math.MaxUint64}
	maxSess := core.SessionState{LastSessionID: math.MaxUint64, LastDelaySeq: math.MaxUint64}
	withHeader := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq, Sessions: maxSess}))
	if withHeader-empty > 40 {
		t.Fatalf("the session section's header takes %d bytes, the arithmetic allows 40", withHeader-empty)
	}
	maxSess.Sessions = []core.Session{{ID: math.MaxUint64, Identity: strings.Repeat("i", core.MaxIdentityLen), TTLMS: core.MaxSessionTTLMS,
		LockDelayMS: core.MaxLockDelayMS, Epoch: math.MaxUint64}}
	maxSess.Delays = []core.Delay{{Key: strings.Repeat("k", core.MaxKeyLen), DelayMS: core.MaxLockDelayMS, Seq: math.MaxUint64}}
	withBoth := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v4, Requests: maxReq, Sessions: maxSess}))
	if per := withBoth - withHeader; per > core.MaxSessionSnapshotSize+core.MaxDelaySnapshotSize {
		t.Fatalf("one session and one delay take %d bytes, the arithmetic says %d", per, core.MaxSessionSnapshotSize+core.MaxDelaySnapshotSize)
	}
	if core.MaxSessionsSnapshotSize != 40+core.MaxSessions*core.MaxSessionSnapshotSize+core.MaxDelayedKeys*core.MaxDelaySnapshotSize {
		t.Fatal("MaxSessionsSnapshotSize does not follow MaxSessions and MaxDelayedKeys")
	}
	if core.MaxDelayedKeys < core.MaxLocksPerSession || core.DefaultMaxSessions > core.MaxSessions {
		t.Fatal("the session bounds contradict each other")
	}
	// The one Pebble batch that installs the largest snapshot (limits.go):
	// the snapshot bytes plus a row per lock, ended request, session and
	// delayed key, with their keys and ~10 bytes of batch overhead each.
	// A lock may be a holder of a semaphore or shared key alone in its
	// holder row, and a delayed key a delayed slot alone in one (cluster
	// version 5): both a little larger, so counted so.
	const locks = core.MaxLocks + core.MaxLocksOverrun
	install := uint64(core.MaxSnapshotSize) +
		locks*uint64((2+core.MaxKeyLen)+(1+core.MaxHolderSnapshotSize)+10) +
		core.MaxRequestRecords*uint64(10+1+core.MaxEndedSnapshotSize+10) +
		core.MaxSessions*uint64(10+1+core.MaxSessionSnapshotSize+10) +
		core.MaxDelayedKeys*uint64((2+core.MaxKeyLen)+1+core.MaxSlotSnapshotSize+10)
	// One holder alone on its key, and one delayed slot alone on its key,
	// at every maximum, in a cluster version 5 snapshot and as a row.
	v5 := core.ControlState{ClusterVersion: 5}
	bigHolder := big
	bigHolder.Limit = core.MaxSemaphoreLimit
	kindsEmpty := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v5}))
	withHolder := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v5,
		Holders: []core.KeyHolders{{Key: big.Key, Limit: core.MaxSemaphoreLimit, Holders: []core.Lock{bigHolder}}}}))
	slot := core.Delay{Key: big.Key, DelayMS: core.MaxLockDelayMS, Seq: math.MaxUint64}
	withSlot := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v5,
		Sessions: core.SessionState{LastDelaySeq: math.MaxUint64},
		Holders:  []core.KeyHolders{{Key: big.Key, Limit: core.MaxSemaphoreLimit, Delays: []core.Delay{slot}}}}))
	noSlot := len(core.EncodeSnapshotState(core.SnapshotState{LastToken: math.MaxUint64, Control: v5,
		Sessions: core.SessionState{LastDelaySeq: math.MaxUint64}}))
	if per := withHolder - kindsEmpty; per > core.MaxHolderSnapshotSize {
		t.Fatalf("one holder alone on its key takes %d bytes, the arithmetic says %d", per, core.MaxHolderSnapshotSize)
	}
	if per := withSlot - noSlot; per > core.MaxSlotSnapshotSize || core.MaxSlotSnapshotSize < core.MaxDelaySnapshotSize {
		t.Fatalf("one delayed slot alone on its key takes %d bytes, the arithmetic says %d", per, core.MaxSlotSnapshotSize)
	}
	if core.MaxHolderSnapshotSize < core.MaxLockSnapshotSize || core.MaxHoldersPerKey < core.MaxSemaphoreLimit {
		t.Fatal("the kinds bounds contradict the others")
	}
	if install >= 4<<30 {
		t.Fatalf("installing the largest snapshot takes a %d-byte batch, Pebble's limit is 4 GiB", install)
	}
	if core.MaxSnapshotSize >= 2<<30-1<<20 {
		t.Fatalf("MaxSnapshotSize %d leaves no room under the peer transport's 2 GiB", core.MaxSnapshotSize)
	}
	t.Logf("install batch of the largest snapshot: %d bytes", install)
	t.Logf("largest snapshot: %d bytes (MaxSnapshotSize); one maximal lock %d bytes; largest control section %d bytes; one ended request %d bytes",
		core.MaxSnapshotSize, one-empty, full, withEnded-empty)
}
