package core_test

import (
	"errors"
	"math"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// reseeded decodes the state of m, reseeds it and loads the result into a
// fresh machine through the snapshot decoder, as a restored node would.
func reseeded(t *testing.T, m *core.Machine, o core.ReseedOptions) (*core.Machine, core.Identity) {
	t.Helper()
	s, err := core.DecodeSnapshotState(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	out, id, err := core.Reseed(s, o)
	if err != nil {
		t.Fatalf("Reseed: %v", err)
	}
	r := core.NewMachine()
	if err := r.Restore(core.EncodeSnapshotState(out)); err != nil {
		t.Fatalf("the reseeded state does not decode: %v", err)
	}
	return r, id
}

// TestReseedControlPlane: the seeding member gets a NodeID and
// incarnation above every one the old cluster issued and is the only
// voter; every old member is retired (and refused), the pending
// replacement is gone, a credential minted but never used no longer
// admits, consumed ones stay consumed; tokens continue above the bump.
func TestReseedControlPlane(t *testing.T) {
	old := core.NewMachine()
	applyAll(old, core.Grant("a", "alice", lease, 1), core.Grant("b", "", lease, 2))
	mustApply(t, old, clusterReplacing...) // members 1, 2, 3 and 4 (pending), cred 3 unused
	before := old.ControlState()
	m, id := reseeded(t, old, core.ReseedOptions{BumpTokens: 1000, Address: "10.9.9.9:7000"})

	if id != (core.Identity{NodeID: before.LastNodeID + 1, Incarnation: before.LastIncarnation + 1}) {
		t.Fatalf("identity %+v, want above %d/%d", id, before.LastNodeID, before.LastIncarnation)
	}
	want := []core.Member{{NodeID: id.NodeID, Incarnation: id.Incarnation, Address: "10.9.9.9:7000", Role: core.RoleVoter}}
	if got := m.Members(); len(got) != 1 || got[0] != want[0] {
		t.Fatalf("members %+v, want %+v", got, want)
	}
	if err := m.CheckIdentity(id.NodeID, id.Incarnation); err != nil {
		t.Fatalf("the seeding member is refused: %v", err)
	}
	for _, mem := range before.Members {
		if err := m.CheckIdentity(mem.NodeID, mem.Incarnation); !errors.Is(err, core.ErrNodeRetired) {
			t.Errorf("old member %d: %v, want retired", mem.NodeID, err)
		}
	}
	if _, ok := m.PendingReplacement(); ok {
		t.Error("the pending replacement survived")
	}
	if s := m.JoinCredentialState(cred(3)); s != core.CredentialUnknown {
		t.Errorf("unused join credential is %v, want unknown (revoked)", s)
	}
	for _, c := range []int{0, 1, 2} {
		if s := m.JoinCredentialState(cred(c)); s != core.CredentialConsumed {
			t.Errorf("credential %d is %v, want consumed", c, s)
		}
	}
	if m.ClusterVersion() != old.ClusterVersion() {
		t.Errorf("cluster version %d, want %d", m.ClusterVersion(), old.ClusterVersion())
	}
	// Locks come back as they were; tokens continue above the bump.
	if l, ok := m.Get("a"); !ok || l.Token != 1 || l.Owner != "alice" {
		t.Errorf("lock a: %+v %v", l, ok)
	}
	if r := m.Apply(core.Grant("c", "", lease, 3)); r.Kind != core.ResultGranted || r.Token != old.LastToken()+1000+1 {
		t.Errorf("first grant after reseed: %v, want token %d", r, old.LastToken()+1001)
	}
	// The new cluster grows from the new identity on.
	mustApply(t, m,
		step{core.MintJoin(cred(9)), minted},
		step{core.Admit(cred(9), addr(9)), admissionAccepted(id.NodeID+1, id.Incarnation+1)},
	)
	if r := m.Apply(core.Admit(cred(3), addr(8))); r.Kind != core.ResultControlRejected {
		t.Errorf("admit with the old cluster's unused credential: %v", r)
	}
}

// TestReseedStaticAndDrop: a static cluster keeps only the cluster
// version; --drop-locks empties the table; the counter still moves on.
func TestReseedStaticAndDrop(t *testing.T) {
	old := core.NewMachine()
	mustApply(t, old, clusterOf3...)
	mustApply(t, old, step{core.SetClusterVersion(2), core.Result{Kind: core.ResultControlApplied}})
	applyAll(old, core.Grant("a", "", lease, 1))
	m, id := reseeded(t, old, core.ReseedOptions{Static: true, DropLocks: true, BumpTokens: 5})
	if id != (core.Identity{}) || m.Bootstrapped() || len(m.Members()) != 0 {
		t.Fatalf("static reseed: identity %+v, bootstrapped %v, members %v", id, m.Bootstrapped(), m.Members())
	}
	if m.ClusterVersion() != 2 {
		t.Errorf("cluster version %d, want 2", m.ClusterVersion())
	}
	if m.Len() != 0 || m.LastToken() != old.LastToken()+5 {
		t.Errorf("locks %d, last token %d; want 0, %d", m.Len(), m.LastToken(), old.LastToken()+5)
	}
	// A backup that was never bootstrapped stays so: it can still be
	// bootstrapped once restored.
	fresh := core.NewMachine()
	applyAll(fresh, core.Grant("k", "", lease, 1))
	m, id = reseeded(t, fresh, core.ReseedOptions{BumpTokens: 1})
	if id != (core.Identity{}) || m.Bootstrapped() || m.Len() != 1 || m.LastToken() != 2 {
		t.Fatalf("unbootstrapped reseed: %+v %v %d %d", id, m.Bootstrapped(), m.Len(), m.LastToken())
	}
}

func TestReseedRejects(t *testing.T) {
	m := core.NewMachine()
	mustApply(t, m, bootstrapped...)
	s, err := core.DecodeSnapshotState(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	s.LastToken = 7
	for name, o := range map[string]core.ReseedOptions{
		"bump overflows":   {BumpTokens: math.MaxUint64 - 6, Address: "h:1"},
		"no address":       {BumpTokens: 1},
		"address no port":  {BumpTokens: 1, Address: "host"},
		"address has a sp": {BumpTokens: 1, Address: "h st:1"},
	} {
		if _, _, err := core.Reseed(s, o); !errors.Is(err, core.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
}
