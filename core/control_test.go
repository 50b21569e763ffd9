package core_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// cred is the hash of test credential n; addr is a distinct test address.
// The first few of each are precomputed: the property test uses them in
// every step.
func cred(n int) [32]byte {
	if n >= 0 && n < len(credCache) {
		return credCache[n]
	}
	return sha256.Sum256([]byte(fmt.Sprintf("credential-%d", n)))
}

func addr(n int) string {
	if n >= 0 && n < len(addrCache) {
		return addrCache[n]
	}
	return fmt.Sprintf("10.0.0.%d:7000", n)
}

// The caches are variables with initialisers, not filled by init, so that
// package-level variables built from cred and addr see them filled.
var (
	credCache = func() (c [16][32]byte) {
		for i := range c {
			c[i] = sha256.Sum256([]byte(fmt.Sprintf("credential-%d", i)))
		}
		return c
	}()
	addrCache = func() (a [16]string) {
		for i := range a {
			a[i] = fmt.Sprintf("10.0.0.%d:7000", i)
		}
		return a
	}()
)

var (
	controlApplied = func(id, inc uint64) core.Result {
		return core.Result{Kind: core.ResultControlApplied, NodeID: id, Incarnation: inc}
	}
	bootstrapRecorded = func(id, inc uint64) core.Result {
		return core.Result{Kind: core.ResultBootstrapRecorded, NodeID: id, Incarnation: inc}
	}
	admissionAccepted = func(id, inc uint64) core.Result {
		return core.Result{Kind: core.ResultAdmissionAccepted, NodeID: id, Incarnation: inc}
	}
	replacementPrepared = func(id, inc uint64) core.Result {
		return core.Result{Kind: core.ResultReplacementPrepared, NodeID: id, Incarnation: inc}
	}
	controlRejected = func(r core.ControlReason) core.Result {
		return core.Result{Kind: core.ResultControlRejected, Reason: r}
	}
	minted = core.Result{Kind: core.ResultControlApplied}
)

// mustApply applies cmds and fails on the first unexpected result.
func mustApply(t testing.TB, m *core.Machine, steps ...step) {
	t.Helper()
	for i, s := range steps {
		if got := m.Apply(s.cmd); got != s.want {
			t.Fatalf("step %d: Apply(%v) = %v, want %v", i, s.cmd.Control, got, s.want)
		}
	}
}

type step struct {
	cmd  core.Command
	want core.Result
}

// Setup sequences shared by the tables below. After clusterOf3: voters 1
// (addr 1) and 2 (addr 2), learner 3 (addr 3); cred 1 and 2 consumed, cred
// 3 minted and unused.
var (
	bootstrapped = []step{{core.Bootstrap(cred(0), addr(1)), bootstrapRecorded(1, 1)}}
	clusterOf3   = append(slices.Clone(bootstrapped),
		step{core.MintJoin(cred(1)), minted},
		step{core.MintJoin(cred(2)), minted},
		step{core.MintJoin(cred(3)), minted},
		step{core.Admit(cred(1), addr(2)), admissionAccepted(2, 2)},
		step{core.Promote(2, 2), controlApplied(2, 2)},
		step{core.Admit(cred(2), addr(3)), admissionAccepted(3, 3)},
	)
	// clusterReplacing adds a pending replacement of voter 2 by learner 4
	// at addr 4.
	clusterReplacing = append(slices.Clone(clusterOf3), step{core.PrepareReplacement(2, addr(4)), replacementPrepared(4, 4)})
)

// lifecycle runs bootstrap -> mint -> admit -> promote -> prepare
// replacement -> complete on a fresh control state, checking every result.
func lifecycle(t testing.TB, m *core.Machine) {
	t.Helper()
	mustApply(t, m,
		step{core.Bootstrap(cred(0), addr(1)), bootstrapRecorded(1, 1)},
		step{core.MintJoin(cred(1)), minted},
		step{core.Admit(cred(1), addr(2)), admissionAccepted(2, 2)},
		step{core.Promote(2, 2), controlApplied(2, 2)},
		step{core.PrepareReplacement(1, addr(3)), replacementPrepared(3, 3)},
		step{core.CompleteReplacement(1, 3, 3), controlApplied(3, 3)},
	)
}

func steps(s ...step) []core.Command {
	out := make([]core.Command, len(s))
	for i := range s {
		out[i] = s[i].cmd
	}
	return out
}

// TestControlApply is the table of control transitions: setup (whose
// results are checked), then one command, its result, and the members
// afterwards. A ControlRejected result must leave the digest unchanged.
func TestControlApply(t *testing.T) {
	m3 := []core.Member{
		{NodeID: 1, Incarnation: 1, Address: addr(1), Role: core.RoleVoter},
		{NodeID: 2, Incarnation: 2, Address: addr(2), Role: core.RoleVoter},
		{NodeID: 3, Incarnation: 3, Address: addr(3), Role: core.RoleLearner},
	}
	m4 := append(slices.Clone(m3), core.Member{NodeID: 4, Incarnation: 4, Address: addr(4), Role: core.RoleLearner})
	tests := []struct {
		name        string
		setup       []step
		cmd         core.Command
		want        core.Result
		wantMembers []core.Member // checked unless the command was rejected
	}{
		// Bootstrap.
		{name: "bootstrap issues node 1 incarnation 1 as a voter", cmd: core.Bootstrap(cred(0), addr(1)), want: bootstrapRecorded(1, 1),
			wantMembers: []core.Member{{NodeID: 1, Incarnation: 1, Address: addr(1), Role: core.RoleVoter}}},
		{name: "bootstrap again with the same credential", setup: bootstrapped, cmd: core.Bootstrap(cred(0), addr(1)), want: controlRejected(core.ReasonAlreadyBootstrapped)},
		{name: "bootstrap again with another credential and address", setup: bootstrapped, cmd: core.Bootstrap(cred(9), addr(9)), want: controlRejected(core.ReasonAlreadyBootstrapped)},
		{name: "bootstrap of a grown cluster", setup: clusterReplacing, cmd: core.Bootstrap(cred(3), addr(9)), want: controlRejected(core.ReasonAlreadyBootstrapped)},

		// MintJoin.
		{name: "mint a new credential", setup: bootstrapped, cmd: core.MintJoin(cred(1)), want: minted,
			wantMembers: []core.Member{{NodeID: 1, Incarnation: 1, Address: addr(1), Role: core.RoleVoter}}},
		{name: "mint before bootstrap", cmd: core.MintJoin(cred(1)), want: controlRejected(core.ReasonNotBootstrapped)},
		{name: "re-mint a minted credential", setup: clusterOf3, cmd: core.MintJoin(cred(3)), want: controlRejected(core.ReasonCredentialReused)},
		{name: "re-mint a consumed credential", setup: clusterOf3, cmd: core.MintJoin(cred(1)), want: controlRejected(core.ReasonCredentialReused)},
		{name: "mint the bootstrap credential", setup: bootstrapped, cmd: core.MintJoin(cred(0)), want: controlRejected(core.ReasonCredentialReused)},

		// Admit.
		{name: "admit with a minted credential issues the next identity as a learner", setup: clusterOf3, cmd: core.Admit(cred(3), addr(4)),
			want: admissionAccepted(4, 4), wantMembers: m4},
		{name: "admit before bootstrap", cmd: core.Admit(cred(1), addr(1)), want: controlRejected(core.ReasonCredentialUnknown)},
		{name: "admit with an unknown credential", setup: clusterOf3, cmd: core.Admit(cred(7), addr(4)), want: controlRejected(core.ReasonCredentialUnknown)},
		{name: "admit with a consumed credential", setup: clusterOf3, cmd: core.Admit(cred(1), addr(4)), want: controlRejected(core.ReasonCredentialReused)},
		{name: "admit with the bootstrap credential", setup: clusterOf3, cmd: core.Admit(cred(0), addr(4)), want: controlRejected(core.ReasonCredentialReused)},
		{name: "admit at a voter's address", setup: clusterOf3, cmd: core.Admit(cred(3), addr(1)), want: controlRejected(core.ReasonAddressInUse)},
		{name: "admit at a learner's address", setup: clusterOf3, cmd: core.Admit(cred(3), addr(3)), want: controlRejected(core.ReasonAddressInUse)},
		{name: "admit at a pending replacement's address", setup: append(slices.Clone(clusterReplacing), step{core.MintJoin(cred(4)), minted}),
			cmd: core.Admit(cred(4), addr(4)), want: controlRejected(core.ReasonAddressInUse)},
		{name: "admit at a retired node's address", setup: append(slices.Clone(clusterOf3), step{core.Retire(3, 3), controlApplied(3, 3)}),
			cmd: core.Admit(cred(3), addr(3)), want: admissionAccepted(4, 4),
			wantMembers: []core.Member{m3[0], m3[1], {NodeID: 4, Incarnation: 4, Address: addr(3), Role: core.RoleLearner}}},

		// Promote.
		{name: "promote a learner", setup: clusterOf3, cmd: core.Promote(3, 3), want: controlApplied(3, 3),
			wantMembers: []core.Member{m3[0], m3[1], {NodeID: 3, Incarnation: 3, Address: addr(3), Role: core.RoleVoter}}},
		{name: "promote a voter", setup: clusterOf3, cmd: core.Promote(2, 2), want: controlRejected(core.ReasonNotALearner)},
		{name: "promote the bootstrap voter", setup: clusterOf3, cmd: core.Promote(1, 1), want: controlRejected(core.ReasonNotALearner)},
		{name: "promote with an old incarnation", setup: clusterOf3, cmd: core.Promote(3, 2), want: controlRejected(core.ReasonStaleIncarnation)},
		{name: "promote with a future incarnation", setup: clusterOf3, cmd: core.Promote(3, 9), want: controlRejected(core.ReasonStaleIncarnation)},
		{name: "promote an unknown node", setup: clusterOf3, cmd: core.Promote(9, 9), want: controlRejected(core.ReasonUnknownNode)},
		{name: "promote before bootstrap", cmd: core.Promote(1, 1), want: controlRejected(core.ReasonUnknownNode)},
		{name: "promote a retired node", setup: append(slices.Clone(clusterOf3), step{core.Retire(3, 3), controlApplied(3, 3)}),
			cmd: core.Promote(3, 3), want: controlRejected(core.ReasonNodeRetired)},
		{name: "promote the pending replacement", setup: clusterReplacing, cmd: core.Promote(4, 4), want: controlRejected(core.ReasonInReplacement)},

		// PrepareReplacement.
		{name: "prepare the replacement of a voter", setup: clusterOf3, cmd: core.PrepareReplacement(2, addr(4)), want: replacementPrepared(4, 4), wantMembers: m4},
		{name: "prepare an in-place replacement at the old node's address", setup: clusterOf3, cmd: core.PrepareReplacement(2, addr(2)),
			want: replacementPrepared(4, 4), wantMembers: append(slices.Clone(m3), core.Member{NodeID: 4, Incarnation: 4, Address: addr(2), Role: core.RoleLearner})},
		{name: "prepare at another member's address", setup: clusterOf3, cmd: core.PrepareReplacement(2, addr(1)), want: controlRejected(core.ReasonAddressInUse)},
		{name: "prepare the replacement of a learner", setup: clusterOf3, cmd: core.PrepareReplacement(3, addr(4)), want: controlRejected(core.ReasonNotAVoter)},
		{name: "prepare the replacement of an unknown node", setup: clusterOf3, cmd: core.PrepareReplacement(9, addr(4)), want: controlRejected(core.ReasonUnknownNode)},
		{name: "prepare the replacement of a retired node", setup: append(slices.Clone(clusterOf3), step{core.Retire(2, 2), controlApplied(2, 2)}),
			cmd: core.PrepareReplacement(2, addr(4)), want: controlRejected(core.ReasonNodeRetired)},
		{name: "prepare while a replacement is pending", setup: clusterReplacing, cmd: core.PrepareReplacement(1, addr(5)), want: controlRejected(core.ReasonReplacementPending)},
		{name: "prepare the same replacement again (a retry after a lost answer)", setup: clusterReplacing, cmd: core.PrepareReplacement(2, addr(4)), want: replacementPrepared(4, 4),
			wantMembers: []core.Member{{NodeID: 1, Incarnation: 1, Address: addr(1), Role: core.RoleVoter}, {NodeID: 2, Incarnation: 2, Address: addr(2), Role: core.RoleVoter},
				{NodeID: 3, Incarnation: 3, Address: addr(3), Role: core.RoleLearner}, {NodeID: 4, Incarnation: 4, Address: addr(4), Role: core.RoleLearner}}},
		{name: "prepare the same old voter at another address", setup: clusterReplacing, cmd: core.PrepareReplacement(2, addr(5)), want: controlRejected(core.ReasonReplacementPending)},
		{name: "prepare before bootstrap", cmd: core.PrepareReplacement(1, addr(1)), want: controlRejected(core.ReasonUnknownNode)},

		// CompleteReplacement.
		{name: "complete the pending replacement", setup: clusterReplacing, cmd: core.CompleteReplacement(2, 4, 4), want: controlApplied(4, 4),
			wantMembers: []core.Member{m3[0], m3[2], {NodeID: 4, Incarnation: 4, Address: addr(4), Role: core.RoleVoter}}},
		{name: "complete with none pending", setup: clusterOf3, cmd: core.CompleteReplacement(2, 3, 3), want: controlRejected(core.ReasonNoReplacement)},
		{name: "complete naming another old node", setup: clusterReplacing, cmd: core.CompleteReplacement(1, 4, 4), want: controlRejected(core.ReasonReplacementMismatch)},
		{name: "complete naming another new node", setup: clusterReplacing, cmd: core.CompleteReplacement(2, 3, 3), want: controlRejected(core.ReasonReplacementMismatch)},
		{name: "complete with an old incarnation", setup: clusterReplacing, cmd: core.CompleteReplacement(2, 4, 3), want: controlRejected(core.ReasonReplacementMismatch)},
		{name: "complete twice", setup: append(slices.Clone(clusterReplacing), step{core.CompleteReplacement(2, 4, 4), controlApplied(4, 4)}),
			cmd: core.CompleteReplacement(2, 4, 4), want: controlRejected(core.ReasonNoReplacement)},
		{name: "complete after abort", setup: append(slices.Clone(clusterReplacing), step{core.AbortReplacement(2, 4, 4), controlApplied(4, 4)}),
			cmd: core.CompleteReplacement(2, 4, 4), want: controlRejected(core.ReasonNoReplacement)},

		// AbortReplacement.
		{name: "abort the pending replacement", setup: clusterReplacing, cmd: core.AbortReplacement(2, 4, 4), want: controlApplied(4, 4), wantMembers: m3},
		{name: "abort with none pending", setup: clusterOf3, cmd: core.AbortReplacement(2, 4, 4), want: controlRejected(core.ReasonNoReplacement)},
		{name: "abort naming another new node", setup: clusterReplacing, cmd: core.AbortReplacement(2, 5, 5), want: controlRejected(core.ReasonReplacementMismatch)},
		{name: "abort with another incarnation", setup: clusterReplacing, cmd: core.AbortReplacement(2, 4, 5), want: controlRejected(core.ReasonReplacementMismatch)},
		{name: "abort naming another old node", setup: clusterReplacing, cmd: core.AbortReplacement(1, 4, 4), want: controlRejected(core.ReasonReplacementMismatch)},

		// Retire.
		{name: "retire a learner", setup: clusterOf3, cmd: core.Retire(3, 3), want: controlApplied(3, 3), wantMembers: m3[:2]},
		{name: "retire a voter", setup: clusterOf3, cmd: core.Retire(1, 1), want: controlApplied(1, 1), wantMembers: m3[1:]},
		{name: "retire the last voter", setup: bootstrapped, cmd: core.Retire(1, 1), want: controlRejected(core.ReasonLastVoter)},
		{name: "retire the last voter with learners left", setup: append(slices.Clone(clusterOf3), step{core.Retire(1, 1), controlApplied(1, 1)}),
			cmd: core.Retire(2, 2), want: controlRejected(core.ReasonLastVoter)},
		{name: "retire with an old incarnation", setup: clusterOf3, cmd: core.Retire(3, 1), want: controlRejected(core.ReasonStaleIncarnation)},
		{name: "retire twice", setup: append(slices.Clone(clusterOf3), step{core.Retire(3, 3), controlApplied(3, 3)}),
			cmd: core.Retire(3, 3), want: controlRejected(core.ReasonNodeRetired)},
		{name: "retire an unknown node", setup: clusterOf3, cmd: core.Retire(4, 4), want: controlRejected(core.ReasonUnknownNode)},
		{name: "retire the old node of a pending replacement", setup: clusterReplacing, cmd: core.Retire(2, 2), want: controlRejected(core.ReasonInReplacement)},
		{name: "retire the new node of a pending replacement", setup: clusterReplacing, cmd: core.Retire(4, 4), want: controlRejected(core.ReasonInReplacement)},
		{name: "retire a node not in the pending replacement", setup: clusterReplacing, cmd: core.Retire(3, 3), want: controlApplied(3, 3),
			wantMembers: []core.Member{m3[0], m3[1], m4[3]}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := core.NewMachine()
			// Locks live beside the control state and are never touched by it.
			applyAll(m, core.Grant("a", "", lease, 0), core.Grant("b", "", lease, 0))
			mustApply(t, m, tc.setup...)
			before, beforeState := m.Digest(), m.ControlState()
			pending, isPending := m.PendingReplacement()
			got := m.Apply(tc.cmd)
			if got != tc.want {
				t.Fatalf("Apply(%v) = %v, want %v", tc.cmd.Control, got, tc.want)
			}
			if m.LastToken() != 2 || !slices.Equal(m.Locks(), []core.Lock{lk("a", 1), lk("b", 2)}) {
				t.Fatalf("a control command touched the lock table: %+v last %d", m.Locks(), m.LastToken())
			}
			checkControlInvariants(t, m)
			if got.Kind == core.ResultControlRejected {
				if m.Digest() != before || !reflect.DeepEqual(m.ControlState(), beforeState) {
					t.Fatal("a rejected control command changed the state")
				}
				return
			}
			if changed := m.Digest() != before; changed != mustChange(tc.cmd.Control, got, pending, isPending) {
				t.Fatalf("an applied control command changed the digest: %t", changed)
			}
			if members := m.Members(); !slices.Equal(members, tc.wantMembers) {
				t.Fatalf("Members() = %+v, want %+v", members, tc.wantMembers)
			}
		})
	}
}

// checkControlInvariants checks what DecodeControlState checks, by
// round-tripping the state through the control record and a snapshot.
func checkControlInvariants(t testing.TB, m *core.Machine) {
	t.Helper()
	cs := m.ControlState()
	got, err := core.DecodeControlState(m.ControlSnapshot())
	if err != nil {
		t.Fatalf("the machine's own control state does not decode: %v\n%+v", err, cs)
	}
	if !controlStateEqual(got, cs) {
		t.Fatalf("control record round trip:\n got %+v\nwant %+v", got, cs)
	}
	if !slices.Equal(m.Members(), cs.Members) {
		t.Fatal("Members() disagrees with ControlState().Members")
	}
	for _, mem := range cs.Members {
		if err := m.CheckIdentity(mem.NodeID, mem.Incarnation); err != nil {
			t.Fatalf("CheckIdentity(member %+v) = %v", mem, err)
		}
		if got, ok := m.Member(mem.NodeID); !ok || got != mem {
			t.Fatalf("Member(%d) = %+v, %t", mem.NodeID, got, ok)
		}
	}
	for _, x := range cs.Retired {
		if err := m.CheckIdentity(x.NodeID, x.Incarnation); !errors.Is(err, core.ErrNodeRetired) {
			t.Fatalf("CheckIdentity(retired %+v) = %v", x, err)
		}
	}
}

// controlStateEqual is reflect.DeepEqual for ControlState (empty lists
// are nil on both sides), fast enough for states of MaxControlNodes.
func controlStateEqual(a, b core.ControlState) bool {
	return a.Bootstrapped == b.Bootstrapped && a.BootstrapHash == b.BootstrapHash &&
		a.LastNodeID == b.LastNodeID && a.LastIncarnation == b.LastIncarnation &&
		(a.Members == nil) == (b.Members == nil) && slices.Equal(a.Members, b.Members) &&
		(a.Issued == nil) == (b.Issued == nil) && slices.Equal(a.Issued, b.Issued) &&
		(a.Retired == nil) == (b.Retired == nil) && slices.Equal(a.Retired, b.Retired) &&
		(a.JoinCredentials == nil) == (b.JoinCredentials == nil) && slices.Equal(a.JoinCredentials, b.JoinCredentials) &&
		(a.Pending == nil) == (b.Pending == nil) && (a.Pending == nil || *a.Pending == *b.Pending)
}

// The full lifecycle: bootstrap -> mint -> admit -> promote -> prepare
// replacement -> complete, with the state checked after every step.
func TestControlLifecycle(t *testing.T) {
	m := core.NewMachine()
	if m.Bootstrapped() || len(m.Members()) != 0 || m.JoinCredentialState(cred(0)) != core.CredentialUnknown {
		t.Fatal("a fresh machine has control state")
	}
	wantCode(t, m.CheckIdentity(1, 1), core.CodeUnknownNode)

	mustApply(t, m, step{core.Bootstrap(cred(0), addr(1)), bootstrapRecorded(1, 1)})
	if !m.Bootstrapped() || m.JoinCredentialState(cred(0)) != core.CredentialConsumed {
		t.Fatal("bootstrap not recorded")
	}
	if err := m.CheckIdentity(1, 1); err != nil {
		t.Fatal(err)
	}

	mustApply(t, m, step{core.MintJoin(cred(1)), minted})
	if got := m.JoinCredentialState(cred(1)); got != core.CredentialMinted {
		t.Fatalf("credential 1 is %v after mint", got)
	}
	mustApply(t, m, step{core.Admit(cred(1), addr(2)), admissionAccepted(2, 2)})
	if got := m.JoinCredentialState(cred(1)); got != core.CredentialConsumed {
		t.Fatalf("credential 1 is %v after admit", got)
	}
	if mem, _ := m.Member(2); mem != (core.Member{NodeID: 2, Incarnation: 2, Address: addr(2), Role: core.RoleLearner}) {
		t.Fatalf("admitted member = %+v", mem)
	}
	mustApply(t, m, step{core.Promote(2, 2), controlApplied(2, 2)})
	if mem, _ := m.Member(2); mem.Role != core.RoleVoter {
		t.Fatalf("promoted member = %+v", mem)
	}

	mustApply(t, m, step{core.PrepareReplacement(1, addr(3)), replacementPrepared(3, 3)})
	if p, ok := m.PendingReplacement(); !ok || p != (core.Replacement{Old: 1, New: 3, NewIncarnation: 3, Address: addr(3)}) {
		t.Fatalf("PendingReplacement() = %+v, %t", p, ok)
	}
	checkControlInvariants(t, m)
	mustApply(t, m, step{core.CompleteReplacement(1, 3, 3), controlApplied(3, 3)})
	if _, ok := m.PendingReplacement(); ok {
		t.Fatal("replacement still pending after complete")
	}
	wantMembers := []core.Member{
		{NodeID: 2, Incarnation: 2, Address: addr(2), Role: core.RoleVoter},
		{NodeID: 3, Incarnation: 3, Address: addr(3), Role: core.RoleVoter},
	}
	if got := m.Members(); !slices.Equal(got, wantMembers) {
		t.Fatalf("Members() = %+v, want %+v", got, wantMembers)
	}
	wantCode(t, m.CheckIdentity(1, 1), core.CodeNodeRetired)
	want := core.ControlState{
		Bootstrapped:    true,
		BootstrapHash:   cred(0),
		LastNodeID:      3,
		LastIncarnation: 3,
		Members:         wantMembers,
		Issued:          []core.Identity{{NodeID: 1, Incarnation: 1}, {NodeID: 2, Incarnation: 2}, {NodeID: 3, Incarnation: 3}},
		Retired:         []core.Identity{{NodeID: 1, Incarnation: 1}},
		JoinCredentials: []core.JoinCredential{{Hash: cred(1), State: core.CredentialConsumed}},
	}
	if got := m.ControlState(); !reflect.DeepEqual(got, want) {
		t.Fatalf("ControlState() =\n %+v\nwant\n %+v", got, want)
	}
	checkControlInvariants(t, m)

	// lifecycle() runs the same steps.
	other := core.NewMachine()
	lifecycle(t, other)
	if other.Digest() != m.Digest() {
		t.Fatal("lifecycle() diverges from the step-by-step run")
	}
}

// The abort path: the replacement learner is retired, the old voter stays,
// and the next replacement gets a fresh identity.
func TestControlAbortPath(t *testing.T) {
	m := core.NewMachine()
	mustApply(t, m, clusterReplacing...)
	mustApply(t, m,
		step{core.AbortReplacement(2, 4, 4), controlApplied(4, 4)},
		// The aborted replacement is gone for good.
		step{core.Promote(4, 4), controlRejected(core.ReasonNodeRetired)},
		step{core.Retire(4, 4), controlRejected(core.ReasonNodeRetired)},
		step{core.CompleteReplacement(2, 4, 4), controlRejected(core.ReasonNoReplacement)},
		// A new attempt at the same address gets node 5, incarnation 5.
		step{core.PrepareReplacement(2, addr(4)), replacementPrepared(5, 5)},
		step{core.AbortReplacement(2, 4, 4), controlRejected(core.ReasonReplacementMismatch)},
		step{core.CompleteReplacement(2, 5, 5), controlApplied(5, 5)},
	)
	wantCode(t, m.CheckIdentity(4, 4), core.CodeNodeRetired)
	wantCode(t, m.CheckIdentity(2, 2), core.CodeNodeRetired)
	if err := m.CheckIdentity(5, 5); err != nil {
		t.Fatal(err)
	}
	cs := m.ControlState()
	if !slices.Equal(cs.Retired, []core.Identity{{NodeID: 2, Incarnation: 2}, {NodeID: 4, Incarnation: 4}}) {
		t.Fatalf("Retired = %+v", cs.Retired)
	}
	checkControlInvariants(t, m)
}

// Reuse of the bootstrap credential, a join credential, a retired NodeID
// and an old incarnation is rejected by Apply and by CheckIdentity.
func TestControlReuseRejected(t *testing.T) {
	m := core.NewMachine()
	mustApply(t, m, clusterReplacing...)
	mustApply(t, m,
		step{core.CompleteReplacement(2, 4, 4), controlApplied(4, 4)}, // node 2 retired
		step{core.Retire(3, 3), controlApplied(3, 3)},                 // node 3 retired
	)
	before := m.Digest()
	for _, s := range []step{
		// Bootstrap credential.
		{core.Bootstrap(cred(0), addr(9)), controlRejected(core.ReasonAlreadyBootstrapped)},
		{core.MintJoin(cred(0)), controlRejected(core.ReasonCredentialReused)},
		{core.Admit(cred(0), addr(9)), controlRejected(core.ReasonCredentialReused)},
		// Join credentials, consumed by nodes still present or retired.
		{core.Admit(cred(1), addr(9)), controlRejected(core.ReasonCredentialReused)},
		{core.Admit(cred(2), addr(9)), controlRejected(core.ReasonCredentialReused)},
		{core.MintJoin(cred(1)), controlRejected(core.ReasonCredentialReused)},
		{core.MintJoin(cred(2)), controlRejected(core.ReasonCredentialReused)},
		// Retired NodeIDs, with their own or any incarnation.
		{core.Promote(3, 3), controlRejected(core.ReasonNodeRetired)},
		{core.Retire(2, 2), controlRejected(core.ReasonNodeRetired)},
		{core.Retire(3, 4), controlRejected(core.ReasonNodeRetired)},
		{core.PrepareReplacement(2, addr(9)), controlRejected(core.ReasonNodeRetired)},
		// Old incarnations of current members.
		{core.Promote(4, 2), controlRejected(core.ReasonStaleIncarnation)},
		{core.Retire(4, 3), controlRejected(core.ReasonStaleIncarnation)},
		{core.Retire(1, 4), controlRejected(core.ReasonStaleIncarnation)},
	} {
		if got := m.Apply(s.cmd); got != s.want {
			t.Errorf("Apply(%v) = %v, want %v", s.cmd.Control, got, s.want)
		}
	}
	if m.Digest() != before {
		t.Fatal("a rejected reuse changed the state")
	}
	for _, tc := range []struct {
		id, inc uint64
		err     error
	}{
		{1, 1, nil},
		{4, 4, nil},
		{2, 2, core.ErrNodeRetired},
		{2, 4, core.ErrNodeRetired},
		{3, 3, core.ErrNodeRetired},
		{4, 2, core.ErrStaleIncarnation},
		{4, 5, core.ErrStaleIncarnation},
		{1, 0, core.ErrStaleIncarnation},
		{5, 5, core.ErrUnknownNode},
		{0, 0, core.ErrUnknownNode},
		{0, 1, core.ErrUnknownNode},
		{math.MaxUint64, 1, core.ErrUnknownNode},
	} {
		err := m.CheckIdentity(tc.id, tc.inc)
		if tc.err == nil {
			if err != nil {
				t.Errorf("CheckIdentity(%d, %d) = %v, want nil", tc.id, tc.inc, err)
			}
			continue
		}
		wantCode(t, err, tc.err.(*core.Error).Code)
		if !errors.Is(err, tc.err) {
			t.Errorf("CheckIdentity(%d, %d) = %v, want %v", tc.id, tc.inc, err, tc.err)
		}
	}
}

// Identities are never reissued: across every transition the counters
// only grow, and a NodeID once retired never reappears.
func TestControlIdentitiesNeverReissued(t *testing.T) {
	m := core.NewMachine()
	mustApply(t, m, bootstrapped...)
	retired := map[uint64]bool{}
	var last uint64 = 1
	for i := range 200 {
		h := cred(1000 + i)
		mustApply(t, m, step{core.MintJoin(h), minted})
		r := m.Apply(core.Admit(h, addr(2)))
		if r.Kind != core.ResultAdmissionAccepted || r.NodeID != last+1 || r.Incarnation != last+1 || retired[r.NodeID] {
			t.Fatalf("round %d: admit = %v after %d", i, r, last)
		}
		last = r.NodeID
		if i%2 == 0 {
			mustApply(t, m, step{core.Retire(r.NodeID, r.Incarnation), controlApplied(r.NodeID, r.Incarnation)})
		} else {
			mustApply(t, m,
				step{core.Promote(r.NodeID, r.Incarnation), controlApplied(r.NodeID, r.Incarnation)},
				step{core.PrepareReplacement(r.NodeID, addr(2)), replacementPrepared(last+1, last+1)},
				step{core.AbortReplacement(r.NodeID, last+1, last+1), controlApplied(last+1, last+1)},
				step{core.Retire(r.NodeID, r.Incarnation), controlApplied(r.NodeID, r.Incarnation)},
			)
			retired[last+1] = true
			last++
		}
		retired[r.NodeID] = true
	}
	cs := m.ControlState()
	if cs.LastNodeID != last || len(cs.Issued) != int(last) || len(cs.Retired) != len(retired) || len(cs.Members) != 1 {
		t.Fatalf("last %d, issued %d, retired %d (want %d), members %d", cs.LastNodeID, len(cs.Issued), len(cs.Retired), len(retired), len(cs.Members))
	}
	for id := range retired {
		wantCode(t, m.CheckIdentity(id, id), core.CodeNodeRetired)
	}
	checkControlInvariants(t, m)
}

func TestControlLimits(t *testing.T) {
	t.Parallel() // large states; runs beside TestProperty
	// A state one credential below the limit mints one more, then no more.
	t.Run("join credentials", func(t *testing.T) {
		m := core.NewMachine()
		mustApply(t, m, bootstrapped...)
		cs := m.ControlState()
		for i := range core.MaxJoinCredentials - 1 {
			var h [32]byte
			h[0], h[1], h[2] = 0xee, byte(i>>8), byte(i)
			cs.JoinCredentials = append(cs.JoinCredentials, core.JoinCredential{Hash: h, State: core.CredentialState(1 + i%2)})
		}
		if err := m.LoadControl(core.EncodeControlState(cs)); err != nil {
			t.Fatal(err)
		}
		mustApply(t, m, step{core.MintJoin(cred(2)), minted})
		before := m.Digest()
		if r := m.Apply(core.MintJoin(cred(1))); r != controlRejected(core.ReasonLimitReached) {
			t.Fatalf("mint beyond the limit = %v", r)
		}
		if m.Digest() != before {
			t.Fatal("a rejected mint changed the state")
		}
		checkControlInvariants(t, m)
	})
	// A state that has issued MaxControlNodes identities (all but one
	// retired) issues no more.
	t.Run("issued nodes", func(t *testing.T) {
		cs := core.ControlState{
			Bootstrapped: true, BootstrapHash: cred(0),
			LastNodeID: core.MaxControlNodes, LastIncarnation: core.MaxControlNodes,
			Members:         []core.Member{{NodeID: core.MaxControlNodes, Incarnation: core.MaxControlNodes, Address: addr(1), Role: core.RoleVoter}},
			JoinCredentials: []core.JoinCredential{{Hash: cred(1), State: core.CredentialMinted}},
		}
		for id := uint64(1); id <= core.MaxControlNodes; id++ {
			cs.Issued = append(cs.Issued, core.Identity{NodeID: id, Incarnation: id})
			if id < core.MaxControlNodes {
				cs.Retired = append(cs.Retired, core.Identity{NodeID: id, Incarnation: id})
			}
		}
		m := core.NewMachine()
		if err := m.LoadControl(core.EncodeControlState(cs)); err != nil {
			t.Fatal(err)
		}
		before := m.Digest()
		mustApply(t, m,
			step{core.Admit(cred(1), addr(2)), controlRejected(core.ReasonLimitReached)},
			step{core.PrepareReplacement(core.MaxControlNodes, addr(2)), controlRejected(core.ReasonLimitReached)},
		)
		if m.Digest() != before {
			t.Fatal("a rejected issuance changed the state")
		}
		// One more identity in the record is beyond the decoder's bound.
		cs.Issued = append(cs.Issued, core.Identity{NodeID: core.MaxControlNodes + 1, Incarnation: core.MaxControlNodes + 1})
		cs.Retired = append(cs.Retired, core.Identity{NodeID: core.MaxControlNodes + 1, Incarnation: core.MaxControlNodes + 1})
		cs.LastNodeID, cs.LastIncarnation = core.MaxControlNodes+1, core.MaxControlNodes+1
		wantCode(t, m.LoadControl(core.EncodeControlState(cs)), core.CodeMalformed)
	})
	t.Run("exhausted counters", func(t *testing.T) {
		for _, last := range []struct{ id, inc uint64 }{{math.MaxUint64, 1}, {1, math.MaxUint64}} {
			cs := core.ControlState{
				Bootstrapped: true, BootstrapHash: cred(0), LastNodeID: last.id, LastIncarnation: last.inc,
				Members:         []core.Member{{NodeID: 1, Incarnation: 1, Address: addr(1), Role: core.RoleVoter}},
				Issued:          []core.Identity{{NodeID: 1, Incarnation: 1}},
				JoinCredentials: []core.JoinCredential{{Hash: cred(1), State: core.CredentialMinted}},
			}
			m := core.NewMachine()
			if err := m.LoadControl(core.EncodeControlState(cs)); err != nil {
				t.Fatal(err)
			}
			mustApply(t, m,
				step{core.Admit(cred(1), addr(2)), controlRejected(core.ReasonLimitReached)},
				step{core.PrepareReplacement(1, addr(2)), controlRejected(core.ReasonLimitReached)},
			)
		}
	})
}

func TestControlValidate(t *testing.T) {
	h := cred(1)
	req := func(r core.ControlRequest) core.Command { return core.Command{Kind: core.KindControl, Control: r} }
	tests := []struct {
		name string
		cmd  core.Command
		ok   bool
	}{
		{"bootstrap", core.Bootstrap(h, "a:1"), true},
		{"mint", core.MintJoin(h), true},
		{"admit", core.Admit(h, "[::1]:65535"), true},
		{"promote", core.Promote(1, 1), true},
		{"prepare", core.PrepareReplacement(math.MaxUint64, strings.Repeat("h", core.MaxAddressLen-2)+":1"), true},
		{"complete", core.CompleteReplacement(1, 2, math.MaxUint64), true},
		{"abort", core.AbortReplacement(2, 1, 1), true},
		{"retire", core.Retire(1, 1), true},

		{"op 0", req(core.ControlRequest{NodeID: 1, Incarnation: 1}), false},
		{"op 9", req(core.ControlRequest{Op: 9, NodeID: 1, Incarnation: 1}), false},
		{"op 255", req(core.ControlRequest{Op: 255}), false},
		{"bootstrap zero hash", core.Bootstrap([32]byte{}, "a:1"), false},
		{"bootstrap no address", core.Bootstrap(h, ""), false},
		{"bootstrap bad address", core.Bootstrap(h, "no-port"), false},
		{"bootstrap carrying a node id", req(core.ControlRequest{Op: core.ControlBootstrap, CredentialHash: h, Address: "a:1", NodeID: 1}), false},
		{"mint zero hash", core.MintJoin([32]byte{}), false},
		{"mint carrying an address", req(core.ControlRequest{Op: core.ControlMintJoin, CredentialHash: h, Address: "a:1"}), false},
		{"admit zero hash", core.Admit([32]byte{}, "a:1"), false},
		{"admit oversize address", core.Admit(h, strings.Repeat("h", core.MaxAddressLen-1)+":1"), false},
		{"admit carrying a new incarnation", req(core.ControlRequest{Op: core.ControlAdmit, CredentialHash: h, Address: "a:1", NewIncarnation: 1}), false},
		{"promote node 0", core.Promote(0, 1), false},
		{"promote incarnation 0", core.Promote(1, 0), false},
		{"promote carrying a hash", req(core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1, CredentialHash: h}), false},
		{"promote carrying an old node", req(core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1, OldNodeID: 1}), false},
		{"prepare old 0", core.PrepareReplacement(0, "a:1"), false},
		{"prepare no address", core.PrepareReplacement(1, ""), false},
		{"prepare carrying a new node", req(core.ControlRequest{Op: core.ControlPrepareReplacement, OldNodeID: 1, Address: "a:1", NewNodeID: 2}), false},
		{"complete old 0", core.CompleteReplacement(0, 2, 2), false},
		{"complete new 0", core.CompleteReplacement(1, 0, 2), false},
		{"complete new incarnation 0", core.CompleteReplacement(1, 2, 0), false},
		{"complete old equals new", core.CompleteReplacement(2, 2, 2), false},
		{"abort old equals new", core.AbortReplacement(3, 3, 3), false},
		{"abort carrying an incarnation", req(core.ControlRequest{Op: core.ControlAbortReplacement, OldNodeID: 1, NewNodeID: 2, NewIncarnation: 2, Incarnation: 1}), false},
		{"retire node 0", core.Retire(0, 1), false},
		{"retire carrying an address", req(core.ControlRequest{Op: core.ControlRetire, NodeID: 1, Incarnation: 1, Address: "a:1"}), false},
		{"control carrying a key", core.Command{Kind: core.KindControl, Key: "k", Control: core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1}}, false},
		{"control carrying a token", core.Command{Kind: core.KindControl, Token: 1, Control: core.ControlRequest{Op: core.ControlPromote, NodeID: 1, Incarnation: 1}}, false},
		{"control carrying a lease", core.Command{Kind: core.KindControl, LeaseMS: lease, Control: core.ControlRequest{Op: core.ControlMintJoin, CredentialHash: h}}, false},
		{"control carrying an owner", core.Command{Kind: core.KindControl, Owner: "o", Control: core.ControlRequest{Op: core.ControlMintJoin, CredentialHash: h}}, false},
		{"control carrying granted_at", core.Command{Kind: core.KindControl, GrantedAtMS: 1, Control: core.ControlRequest{Op: core.ControlMintJoin, CredentialHash: h}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cmd.Validate()
			if tc.ok {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			wantCode(t, err, core.CodeInvalidArgument)
			// An invalid control command is a Noop, not a rejection, and
			// changes nothing.
			m := core.NewMachine()
			mustApply(t, m, clusterOf3...)
			before := m.Digest()
			if got := m.Apply(tc.cmd); got != noop {
				t.Fatalf("Apply = %v, want noop", got)
			}
			if m.Digest() != before {
				t.Fatal("an invalid control command changed the state")
			}
		})
	}
}

func TestValidateAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"a:1", true},
		{"10.0.0.1:7000", true},
		{"node-1.cluster.example.com:4222", true},
		{"[::1]:7000", true},
		{"[fe80::1%eth0]:65535", true},
		{strings.Repeat("h", core.MaxAddressLen-2) + ":1", true},

		{"", false},
		{strings.Repeat("h", core.MaxAddressLen-1) + ":1", false},
		{"host", false},
		{":7000", false},
		{"host:", false},
		{"host:0", false},
		{"host:07000", false},
		{"host:65536", false},
		{"host:123456", false},
		{"host:70a0", false},
		{"host:-1", false},
		{"::1:7000", false},
		{"[::1:7000", false},
		{"host :7000", false},
		{"host:7000\n", false},
		{"hö st:7000", false},
		{"\x00:1", false},
		{"host\x7f:1", false},
	} {
		err := core.ValidateAddress(tc.addr)
		switch {
		case tc.ok && err != nil:
			t.Errorf("ValidateAddress(%q) = %v", tc.addr, err)
		case !tc.ok && err == nil:
			t.Errorf("ValidateAddress(%q) accepted", tc.addr)
		case !tc.ok:
			wantCode(t, err, core.CodeInvalidArgument)
		}
	}
}

// sampleControlEntries covers every control op with boundary values.
func sampleControlEntries() []core.Entry {
	h := cred(1)
	ff := [32]byte{}
	for i := range ff {
		ff[i] = 0xff
	}
	return []core.Entry{
		{RequestID: 99, Command: core.SetClusterVersion(core.MaxClusterVersion)},
		{RequestID: 0, Command: core.Bootstrap(h, "a:1")},
		{RequestID: math.MaxUint64, Command: core.Bootstrap(ff, strings.Repeat("h", core.MaxAddressLen-6)+":65535")},
		{RequestID: 1, Command: core.MintJoin(h)},
		{RequestID: 2, Command: core.Admit(h, "[::1]:7000")},
		{RequestID: 3, Command: core.Promote(1, 1)},
		{RequestID: 4, Command: core.Promote(math.MaxUint64, math.MaxUint64)},
		{RequestID: 5, Command: core.PrepareReplacement(128, addr(4))},
		{RequestID: 6, Command: core.CompleteReplacement(1, 1<<40, 300)},
		{RequestID: 7, Command: core.AbortReplacement(math.MaxUint64, 1, 127)},
		{RequestID: 8, Command: core.Retire(2, 2)},
	}
}

func TestControlEntryRoundTrip(t *testing.T) {
	for _, e := range sampleControlEntries() {
		b := core.EncodeEntry(e)
		got, err := core.DecodeEntry(b)
		if err != nil {
			t.Fatalf("DecodeEntry(EncodeEntry(%v)): %v", e.Command.Control, err)
		}
		if got != e {
			t.Fatalf("round trip: got %+v, want %+v", got, e)
		}
		if len(b) > core.MaxEntrySize {
			t.Fatalf("control entry encodes to %d bytes", len(b))
		}
		for n := range len(b) {
			_, err := core.DecodeEntry(b[:n])
			wantCode(t, err, core.CodeMalformed)
		}
	}
}

// Golden bytes pin the control payload of entry format version 1.
func TestControlEntryGolden(t *testing.T) {
	h := [32]byte{0: 0xab, 31: 0xcd}
	const hh = "ab000000000000000000000000000000000000000000000000000000000000cd"
	tests := []entryGolden{
		// 01 version | 05 request id | 04 control | 01 bootstrap | hash | 03 "a:1"
		{"bootstrap", core.Entry{RequestID: 5, Command: core.Bootstrap(h, "a:1")}, "010504" + "01" + hh + "03613a31"},
		// ... | 02 mint_join | hash
		{"mint_join", core.Entry{RequestID: 5, Command: core.MintJoin(h)}, "010504" + "02" + hh},
		// ... | 03 admit | hash | 03 "b:2"
		{"admit", core.Entry{RequestID: 5, Command: core.Admit(h, "b:2")}, "010504" + "03" + hh + "03623a32"},
		// ... | 04 promote | 02 node | 80 01 incarnation 128
		{"promote", core.Entry{RequestID: 5, Command: core.Promote(2, 128)}, "010504" + "04" + "02" + "8001"},
		// ... | 05 prepare | 01 old | 03 "c:3"
		{"prepare_replacement", core.Entry{RequestID: 5, Command: core.PrepareReplacement(1, "c:3")}, "010504" + "05" + "01" + "03633a33"},
		// ... | 06 complete | 01 old | 04 new | 04 new incarnation
		{"complete_replacement", core.Entry{RequestID: 5, Command: core.CompleteReplacement(1, 4, 4)}, "010504" + "06" + "010404"},
		// ... | 07 abort | 01 old | 04 new | 05 new incarnation
		{"abort_replacement", core.Entry{RequestID: 5, Command: core.AbortReplacement(1, 4, 5)}, "010504" + "07" + "010405"},
		// ... | 08 retire | 03 node | 03 incarnation
		{"retire", core.Entry{RequestID: 5, Command: core.Retire(3, 3)}, "010504" + "08" + "0303"},
	}
	checkEntryGolden(t, tests)
}

func TestDecodeControlEntryRejects(t *testing.T) {
	h := cred(1)
	hb := h[:]
	ctl := func(op byte, fields ...[]byte) []byte {
		return cat([]byte{1, 0, byte(core.KindControl), op}, cat(fields...))
	}
	tests := []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"op missing", []byte{1, 0, 4}, core.CodeMalformed},
		{"op 0", ctl(0), core.CodeMalformed},
		{"op 0 with fields", ctl(0, uv(1), uv(1)), core.CodeMalformed},
		{"op 9", ctl(9, uv(1), uv(1)), core.CodeMalformed},
		{"op 255", ctl(255), core.CodeMalformed},
		{"hash truncated", ctl(2, hb[:31]), core.CodeMalformed},
		{"hash missing", ctl(2), core.CodeMalformed},
		{"mint trailing byte", ctl(2, hb, []byte{0}), core.CodeMalformed},
		{"bootstrap address missing", ctl(1, hb), core.CodeMalformed},
		{"bootstrap address beyond input", ctl(1, hb, uv(10), []byte("a:1")), core.CodeMalformed},
		{"bootstrap address length above MaxAddressLen", ctl(1, hb, uv(core.MaxAddressLen+1), bytes.Repeat([]byte{'a'}, core.MaxAddressLen+1)), core.CodeMalformed},
		{"bootstrap address non-canonical length", ctl(1, hb, []byte{0x83, 0x00}, []byte("a:1")), core.CodeMalformed},
		{"promote non-canonical node id", ctl(4, []byte{0x81, 0x00}, uv(1)), core.CodeMalformed},
		{"promote non-canonical incarnation", ctl(4, uv(1), []byte{0x81, 0x80, 0x00}), core.CodeMalformed},
		{"promote incarnation missing", ctl(4, uv(1)), core.CodeMalformed},
		{"promote trailing byte", ctl(4, uv(1), uv(1), []byte{1}), core.CodeMalformed},
		{"complete new incarnation missing", ctl(6, uv(1), uv(2)), core.CodeMalformed},
		{"retire varint overflow", ctl(8, bytes.Repeat([]byte{0xff}, 10), []byte{1}, uv(1)), core.CodeMalformed},
		// Structurally fine, but Validate rejects it.
		{"bootstrap zero hash", ctl(1, make([]byte, 32), str("a:1")), core.CodeInvalidArgument},
		{"mint zero hash", ctl(2, make([]byte, 32)), core.CodeInvalidArgument},
		{"bootstrap empty address", ctl(1, hb, str("")), core.CodeInvalidArgument},
		{"admit address without port", ctl(3, hb, str("host")), core.CodeInvalidArgument},
		{"admit address with NUL", ctl(3, hb, str("a\x00:1")), core.CodeInvalidArgument},
		{"admit address with invalid UTF-8", ctl(3, hb, str("\xff:1")), core.CodeInvalidArgument},
		{"promote node 0", ctl(4, uv(0), uv(1)), core.CodeInvalidArgument},
		{"retire incarnation 0", ctl(8, uv(1), uv(0)), core.CodeInvalidArgument},
		{"prepare old 0", ctl(5, uv(0), str("a:1")), core.CodeInvalidArgument},
		{"complete old equals new", ctl(6, uv(2), uv(2), uv(2)), core.CodeInvalidArgument},
		{"abort new incarnation 0", ctl(7, uv(1), uv(2), uv(0)), core.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := core.DecodeEntry(tc.in)
			wantCode(t, err, tc.code)
			if e != (core.Entry{}) {
				t.Fatalf("failed decode returned a non-zero entry %+v", e)
			}
		})
	}
	// The builder agrees with the encoder.
	if got, want := ctl(1, hb, str("a:1")), core.EncodeEntry(core.Entry{Command: core.Bootstrap(h, "a:1")}); !bytes.Equal(got, want) {
		t.Fatalf("builder disagrees with EncodeEntry: %x vs %x", got, want)
	}
}

// grownMachine has every kind of control state: members of both roles,
// retired nodes, minted and consumed credentials, a pending in-place
// replacement, and locks.
func grownMachine(t testing.TB) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	applyAll(m, core.Grant("a", "o", lease, 1), core.Grant("b", "", lease, 2))
	mustApply(t, m, clusterOf3...)
	mustApply(t, m,
		step{core.MintJoin(cred(4)), minted},
		step{core.Admit(cred(3), addr(4)), admissionAccepted(4, 4)},
		step{core.Retire(4, 4), controlApplied(4, 4)},
		step{core.PrepareReplacement(1, addr(1)), replacementPrepared(5, 5)},
	)
	return m
}

func TestControlStateRoundTrip(t *testing.T) {
	for name, m := range map[string]*core.Machine{
		"fresh":     core.NewMachine(),
		"bootstrap": func() *core.Machine { m := core.NewMachine(); mustApply(t, m, bootstrapped...); return m }(),
		"lifecycle": func() *core.Machine { m := core.NewMachine(); lifecycle(t, m); return m }(),
		"grown":     grownMachine(t),
	} {
		t.Run(name, func(t *testing.T) {
			rec := m.ControlSnapshot()
			cs, err := core.DecodeControlState(rec)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cs, m.ControlState()) {
				t.Fatalf("decoded %+v, want %+v", cs, m.ControlState())
			}
			if again := core.EncodeControlState(cs); !bytes.Equal(again, rec) {
				t.Fatal("re-encoding differs")
			}
			// Restoring the whole snapshot and rebuilding from lock records
			// plus the control record give the same state.
			viaSnap := core.NewMachine()
			if err := viaSnap.Restore(m.Snapshot()); err != nil {
				t.Fatal(err)
			}
			viaRecs := rebuildFromRecords(t, nil, m)
			for _, other := range []*core.Machine{viaSnap, viaRecs} {
				if other.Digest() != m.Digest() || !bytes.Equal(other.ControlSnapshot(), rec) {
					t.Fatal("replica differs")
				}
			}
			st, err := core.DecodeSnapshotState(m.Snapshot())
			if err != nil || !reflect.DeepEqual(st.Control, cs) || !slices.Equal(st.Locks, m.Locks()) || st.LastToken != m.LastToken() {
				t.Fatalf("DecodeSnapshotState = %+v, %v", st, err)
			}
			if !bytes.Equal(core.EncodeSnapshotState(st), m.Snapshot()) {
				t.Fatal("EncodeSnapshotState(DecodeSnapshotState(s)) != s")
			}
			// Every truncation fails, and so does every bit flip.
			for n := range len(rec) {
				_, err := core.DecodeControlState(rec[:n])
				wantCode(t, err, core.CodeMalformed)
			}
			for i := range len(rec) * 8 {
				c := slices.Clone(rec)
				c[i/8] ^= 1 << (i % 8)
				if _, err := core.DecodeControlState(c); err == nil {
					t.Fatalf("control record with bit %d flipped decoded", i)
				}
			}
		})
	}
}

// EncodeControlState sorts, so the order of a hand-built state's lists
// does not matter.
func TestEncodeControlStateSorts(t *testing.T) {
	cs := grownMachine(t).ControlState()
	want := core.EncodeControlState(cs)
	shuffled := cs
	shuffled.Members = slices.Clone(cs.Members)
	shuffled.Issued = slices.Clone(cs.Issued)
	shuffled.JoinCredentials = slices.Clone(cs.JoinCredentials)
	slices.Reverse(shuffled.Members)
	slices.Reverse(shuffled.Issued)
	slices.Reverse(shuffled.JoinCredentials)
	if got := core.EncodeControlState(shuffled); !bytes.Equal(got, want) {
		t.Fatal("list order leaks into the encoding")
	}
	if !slices.IsSortedFunc(cs.Members, func(a, b core.Member) int { return int(a.NodeID) - int(b.NodeID) }) {
		t.Fatal("ControlState().Members not sorted")
	}
}

func TestControlStateGolden(t *testing.T) {
	m := core.NewMachine()
	h0 := [32]byte{0: 0x0b}
	h1 := [32]byte{0: 0x01}
	h2 := [32]byte{0: 0x02}
	mustApply(t, m,
		step{core.Bootstrap(h0, "a:1"), bootstrapRecorded(1, 1)},
		step{core.MintJoin(h2), minted},
		step{core.MintJoin(h1), minted},
		step{core.Admit(h2, "b:2"), admissionAccepted(2, 2)},
		step{core.Retire(2, 2), controlApplied(2, 2)},
		step{core.PrepareReplacement(1, "a:1"), replacementPrepared(3, 3)},
	)
	z31 := strings.Repeat("00", 31)
	// "TKC" | 01 version
	// | 03 flags: bootstrapped, pending | 0b.. bootstrap hash | 03 last node | 03 last incarnation
	// | 02 members: 01 01 02 voter 03 "a:1"; 03 03 01 learner 03 "a:1"
	// | 03 issued: 01 01, 02 02, 03 03 | 01 retired: 02 02
	// | 02 credentials: 01.. 01 minted, 02.. 02 consumed
	// | pending: 01 old 03 new 03 new incarnation 03 "a:1"
	// | crc32c
	golden := "544b4301" +
		"03" + "0b" + z31 + "03" + "03" +
		"02" + "010102" + "03613a31" + "030301" + "03613a31" +
		"03" + "0101" + "0202" + "0303" + "01" + "0202" +
		"02" + "01" + z31 + "01" + "02" + z31 + "02" +
		"010303" + "03613a31"
	rec := m.ControlSnapshot()
	want := seal(mustHex(t, golden))
	if !bytes.Equal(rec, want) {
		t.Fatalf("ControlSnapshot = %x, want %x", rec, want)
	}
	// The snapshot carries the same control section after the lock table.
	snap := m.Snapshot()
	if wantSnap := seal(cat(snapHeader(0, 0), mustHex(t, golden)[4:])); !bytes.Equal(snap, wantSnap) {
		t.Fatalf("Snapshot = %x, want %x", snap, wantSnap)
	}
	if got := core.NewMachine().ControlSnapshot(); !bytes.Equal(got, seal(cat([]byte("TKC\x01"), ctl0))) {
		t.Fatalf("empty control record = %x", got)
	}
}

// ctlRec builds a control record from a body.
func ctlRec(body ...[]byte) []byte { return seal(cat([]byte("TKC\x01"), cat(body...))) }

func member(id, inc uint64, role core.Role, address string) []byte {
	return cat(uv(id), uv(inc), []byte{byte(role)}, str(address))
}

func ident(id, inc uint64) []byte { return cat(uv(id), uv(inc)) }

func TestDecodeControlStateRejects(t *testing.T) {
	h0 := cred(0)
	boot := h0[:]
	h1, h2 := [32]byte{0: 1}, [32]byte{0: 2}
	v, l := core.RoleVoter, core.RoleLearner
	// body of a valid state: voters 1 and 2, learner 3 pending as the
	// replacement of 2, node 4 retired, one consumed credential.
	valid := func() []byte {
		return cat([]byte{3}, boot, uv(4), uv(4),
			uv(3), member(1, 1, v, "a:1"), member(2, 2, v, "b:2"), member(3, 3, l, "c:3"),
			uv(4), ident(1, 1), ident(2, 2), ident(3, 3), ident(4, 4),
			uv(1), ident(4, 4),
			uv(1), h1[:], []byte{2},
			uv(2), uv(3), uv(3), str("c:3"))
	}
	if _, err := core.DecodeControlState(ctlRec(valid())); err != nil {
		t.Fatalf("the valid base case does not decode: %v", err)
	}
	// single voter, no lists: flags | hash | counters | members | issued | retired | creds
	single := func(flags byte, last uint64, members, issued, retired, creds, pending []byte) []byte {
		return cat([]byte{flags}, boot, uv(last), uv(last), members, issued, retired, creds, pending)
	}
	one := cat(uv(1), member(1, 1, v, "a:1"))
	issued1 := cat(uv(1), ident(1, 1))
	tests := []struct {
		name string
		in   []byte
		code core.Code
	}{
		{"empty", nil, core.CodeMalformed},
		{"too short", []byte("TKC\x01\x00\x00\x00"), core.CodeMalformed},
		{"bad magic", seal(cat([]byte("TKX\x01"), ctl0)), core.CodeMalformed},
		{"a snapshot", core.NewMachine().Snapshot(), core.CodeMalformed},
		{"version 0", seal(cat([]byte("TKC\x00"), ctl0)), core.CodeUnknownVersion},
		{"version 4", seal(cat([]byte("TKC\x04"), ctl0)), core.CodeUnknownVersion},
		{"bad checksum", func() []byte { b := ctlRec(valid()); b[len(b)-2] ^= 1; return b }(), core.CodeMalformed},
		{"checksum missing", cat([]byte("TKC\x01"), ctl0), core.CodeMalformed},
		{"trailing byte", ctlRec(valid(), []byte{0}), core.CodeMalformed},
		{"truncated", ctlRec(valid()[:40]), core.CodeMalformed},
		{"unknown flag", ctlRec([]byte{0x80}, ctl0[1:]), core.CodeMalformed},
		{"non-canonical counter", ctlRec([]byte{1}, boot, []byte{0x81, 0x00}, uv(1), one, issued1, uv(0), uv(0)), core.CodeMalformed},
		{"non-canonical member count", ctlRec([]byte{1}, boot, uv(1), uv(1), []byte{0x81, 0x00}, member(1, 1, v, "a:1"), issued1, uv(0), uv(0)), core.CodeMalformed},
		{"member count beyond input", ctlRec(single(1, 1, cat(uv(50), member(1, 1, v, "a:1")), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"member count above limit", ctlRec(single(1, 1, uv(core.MaxControlNodes+1), nil, nil, nil, nil)), core.CodeMalformed},
		{"issued count max uint64", ctlRec(single(1, 1, one, uv(math.MaxUint64), uv(0), uv(0), nil)), core.CodeMalformed},
		{"credential count beyond input", ctlRec(single(1, 1, one, issued1, uv(0), uv(2), cat(h1[:], []byte{1}))), core.CodeMalformed},
		{"oversize address length", ctlRec(single(1, 1, cat(uv(1), uv(1), uv(1), []byte{2}, uv(core.MaxAddressLen+1), bytes.Repeat([]byte{'a'}, core.MaxAddressLen+1)), issued1, uv(0), uv(0), nil)), core.CodeMalformed},

		// Before bootstrap everything is empty.
		{"counters before bootstrap", ctlRec([]byte{0, 1, 0, 0, 0, 0, 0}), core.CodeMalformed},
		{"members before bootstrap", ctlRec([]byte{0, 1, 1}, one, issued1, uv(0), uv(0)), core.CodeMalformed},
		{"credential before bootstrap", ctlRec([]byte{0, 0, 0, 0, 0, 0, 1}, h1[:], []byte{1}), core.CodeMalformed},
		{"pending before bootstrap", ctlRec([]byte{2, 0, 0, 0, 0, 0, 0}, uv(1), uv(2), uv(2), str("a:1")), core.CodeMalformed},

		// After bootstrap.
		{"zero bootstrap hash", ctlRec([]byte{1}, make([]byte, 32), uv(1), uv(1), one, issued1, uv(0), uv(0)), core.CodeMalformed},
		{"no members", ctlRec(single(1, 1, uv(0), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"no voter", ctlRec(single(1, 1, cat(uv(1), member(1, 1, l, "a:1")), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"role 0", ctlRec(single(1, 1, cat(uv(1), member(1, 1, 0, "a:1")), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"role 3", ctlRec(single(1, 1, cat(uv(1), member(1, 1, 3, "a:1")), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"member id 0", ctlRec(single(1, 1, cat(uv(1), member(0, 1, v, "a:1")), cat(uv(1), ident(0, 1)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"member incarnation 0", ctlRec(single(1, 1, cat(uv(1), member(1, 0, v, "a:1")), cat(uv(1), ident(1, 0)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"member above the node counter", ctlRec([]byte{1}, boot, uv(1), uv(2), cat(uv(1), member(2, 2, v, "a:1")), cat(uv(1), ident(2, 2)), uv(0), uv(0)), core.CodeMalformed},
		{"member above the incarnation counter", ctlRec([]byte{1}, boot, uv(2), uv(1), cat(uv(1), member(2, 2, v, "a:1")), cat(uv(1), ident(2, 2)), uv(0), uv(0)), core.CodeMalformed},
		{"members unsorted", ctlRec(single(1, 2, cat(uv(2), member(2, 2, v, "b:2"), member(1, 1, v, "a:1")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"members duplicate", ctlRec(single(1, 2, cat(uv(2), member(1, 1, v, "a:1"), member(1, 1, v, "b:2")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"member address invalid", ctlRec(single(1, 1, cat(uv(1), member(1, 1, v, "nope")), issued1, uv(0), uv(0), nil)), core.CodeInvalidArgument},
		{"members share an address", ctlRec(single(1, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, l, "a:1")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"issued missing a member", ctlRec(single(1, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, v, "b:2")), issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"issued with another incarnation", ctlRec(single(1, 2, one, cat(uv(1), ident(1, 2)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"issued never a member or retired", ctlRec(single(1, 2, one, cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), nil)), core.CodeMalformed},
		{"issued unsorted", ctlRec(single(1, 2, one, cat(uv(2), ident(2, 2), ident(1, 1)), cat(uv(1), ident(2, 2)), uv(0), nil)), core.CodeMalformed},
		{"incarnation issued twice", ctlRec(single(1, 2, one, cat(uv(2), ident(1, 1), ident(2, 1)), cat(uv(1), ident(2, 1)), uv(0), nil)), core.CodeMalformed},
		{"retired member", ctlRec(single(1, 1, one, issued1, cat(uv(1), ident(1, 1)), uv(0), nil)), core.CodeMalformed},
		{"retired not issued", ctlRec(single(1, 2, one, issued1, cat(uv(1), ident(2, 2)), uv(0), nil)), core.CodeMalformed},
		{"retired unsorted", ctlRec(single(1, 3, one, cat(uv(3), ident(1, 1), ident(2, 2), ident(3, 3)), cat(uv(2), ident(3, 3), ident(2, 2)), uv(0), nil)), core.CodeMalformed},
		{"retired id 0", ctlRec(single(1, 1, one, issued1, cat(uv(1), ident(0, 0)), uv(0), nil)), core.CodeMalformed},
		{"credentials unsorted", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(2), h2[:], []byte{1}, h1[:], []byte{1}), nil)), core.CodeMalformed},
		{"credentials duplicate", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(2), h1[:], []byte{1}, h1[:], []byte{2}), nil)), core.CodeMalformed},
		{"credential state 0", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(1), h1[:], []byte{0}), nil)), core.CodeMalformed},
		{"credential state 3", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(1), h1[:], []byte{3}), nil)), core.CodeMalformed},
		{"credential zero hash", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(1), make([]byte, 32), []byte{1}), nil)), core.CodeMalformed},
		{"credential is the bootstrap hash", ctlRec(single(1, 1, one, issued1, uv(0), cat(uv(1), boot, []byte{1}), nil)), core.CodeMalformed},

		// Pending replacement.
		{"pending missing", ctlRec(single(3, 1, one, issued1, uv(0), uv(0), nil)), core.CodeMalformed},
		{"pending address missing", ctlRec(valid()[:len(valid())-4]), core.CodeMalformed},
		{"pending old not a member", ctlRec(single(3, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, l, "b:2")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), cat(uv(5), uv(2), uv(2), str("b:2")))), core.CodeMalformed},
		{"pending old a learner", ctlRec(single(3, 3, cat(uv(3), member(1, 1, v, "a:1"), member(2, 2, l, "b:2"), member(3, 3, l, "c:3")), cat(uv(3), ident(1, 1), ident(2, 2), ident(3, 3)), uv(0), uv(0), cat(uv(2), uv(3), uv(3), str("c:3")))), core.CodeMalformed},
		{"pending new a voter", ctlRec(single(3, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, v, "b:2")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), cat(uv(1), uv(2), uv(2), str("b:2")))), core.CodeMalformed},
		{"pending new not a member", ctlRec(single(3, 1, one, issued1, uv(0), uv(0), cat(uv(1), uv(2), uv(2), str("b:2")))), core.CodeMalformed},
		{"pending new incarnation differs", ctlRec(single(3, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, l, "b:2")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), cat(uv(1), uv(2), uv(1), str("b:2")))), core.CodeMalformed},
		{"pending address differs", ctlRec(single(3, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, l, "b:2")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), cat(uv(1), uv(2), uv(2), str("c:3")))), core.CodeMalformed},
		{"pending old equals new", ctlRec(single(3, 1, one, issued1, uv(0), uv(0), cat(uv(1), uv(1), uv(1), str("a:1")))), core.CodeMalformed},
		{"pending oversize address", ctlRec(single(3, 1, one, issued1, uv(0), uv(0), cat(uv(1), uv(2), uv(2), uv(core.MaxAddressLen+1), bytes.Repeat([]byte{'a'}, core.MaxAddressLen+1)))), core.CodeMalformed},
		{"pending shares an address with a third member", ctlRec(single(3, 3, cat(uv(3), member(1, 1, v, "a:1"), member(2, 2, v, "b:2"), member(3, 3, l, "a:1")), cat(uv(3), ident(1, 1), ident(2, 2), ident(3, 3)), uv(0), uv(0), cat(uv(2), uv(3), uv(3), str("a:1")))), core.CodeMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := core.DecodeControlState(tc.in)
			wantCode(t, err, tc.code)
			if !reflect.DeepEqual(cs, core.ControlState{}) {
				t.Fatalf("failed decode returned %+v", cs)
			}
			// The same body inside a snapshot is rejected too (when the
			// record's own checksum is right, so that the body is the fault).
			if len(tc.in) > 8 && string(tc.in[:4]) == "TKC\x01" && bytes.Equal(seal(tc.in[:len(tc.in)-4]), tc.in) {
				body := tc.in[4 : len(tc.in)-4]
				if _, err := core.DecodeSnapshotState(seal(cat(snapHeader(0, 0), body))); err == nil {
					t.Fatal("a snapshot with this control section decodes")
				}
			}
			m := grownMachine(t)
			before := m.Digest()
			if err := m.LoadControl(tc.in); err == nil {
				t.Fatal("LoadControl accepted it")
			}
			if m.Digest() != before {
				t.Fatal("a failed LoadControl changed the machine")
			}
		})
	}
	// An in-place replacement may share the old node's address.
	inPlace := ctlRec(single(3, 2, cat(uv(2), member(1, 1, v, "a:1"), member(2, 2, l, "a:1")), cat(uv(2), ident(1, 1), ident(2, 2)), uv(0), uv(0), cat(uv(1), uv(2), uv(2), str("a:1"))))
	if _, err := core.DecodeControlState(inPlace); err != nil {
		t.Fatalf("in-place replacement: %v", err)
	}
}

// Load replaces the lock table only; LoadControl replaces the control state
// only; Restore replaces both.
func TestLoadAndLoadControlAreIndependent(t *testing.T) {
	src := grownMachine(t)
	m := core.NewMachine()
	if err := m.LoadControl(src.ControlSnapshot()); err != nil {
		t.Fatal(err)
	}
	m.Load(src.LastToken(), src.Locks())
	if m.Digest() != src.Digest() {
		t.Fatal("LoadControl + Load differs from the source")
	}
	m.Load(0, nil)
	if !reflect.DeepEqual(m.ControlState(), src.ControlState()) || m.Len() != 0 {
		t.Fatal("Load touched the control state")
	}
	if err := m.LoadControl(core.NewMachine().ControlSnapshot()); err != nil {
		t.Fatal(err)
	}
	if m.Bootstrapped() || m.Digest() != core.NewMachine().Digest() {
		t.Fatal("LoadControl of the empty state did not clear it")
	}
	// Restore discards previous control state, also from a v1 snapshot.
	if err := src.Restore(snapshotV1(7, []core.Lock{lk("z", 7)})); err != nil {
		t.Fatal(err)
	}
	if src.Bootstrapped() || len(src.Members()) != 0 || src.LastToken() != 7 {
		t.Fatal("Restore(v1) kept the previous control state")
	}
}

// The zero Machine answers every control accessor and accepts Bootstrap.
func TestZeroMachineControl(t *testing.T) {
	var m core.Machine
	if m.Bootstrapped() || m.Members() != nil || !reflect.DeepEqual(m.ControlState(), core.ControlState{}) {
		t.Fatal("zero machine has control state")
	}
	if _, ok := m.PendingReplacement(); ok {
		t.Fatal("zero machine has a pending replacement")
	}
	wantCode(t, m.CheckIdentity(1, 1), core.CodeUnknownNode)
	if !bytes.Equal(m.ControlSnapshot(), core.NewMachine().ControlSnapshot()) {
		t.Fatal("zero machine and NewMachine differ")
	}
	var z core.Machine
	if err := z.LoadControl(core.NewMachine().ControlSnapshot()); err != nil {
		t.Fatal(err)
	}
	lifecycle(t, &m)
	lifecycle(t, &z)
	if m.Digest() != z.Digest() {
		t.Fatal("lifecycle on zero machines diverges")
	}
}

// Map iteration order must not leak: machines that reach the same state by
// different insertion orders encode it identically.
func TestControlEncodingDeterministic(t *testing.T) {
	build := func(order []int) *core.Machine {
		m := core.NewMachine()
		mustApply(t, m, bootstrapped...)
		for _, i := range order {
			mustApply(t, m, step{core.MintJoin(cred(100 + i)), minted})
		}
		return m
	}
	order := make([]int, 64)
	for i := range order {
		order[i] = i
	}
	a := build(order)
	slices.Reverse(order)
	b := build(order)
	for range 5 {
		if !bytes.Equal(a.Snapshot(), b.Snapshot()) || !bytes.Equal(a.ControlSnapshot(), b.ControlSnapshot()) {
			t.Fatal("insertion order leaks into the encoding")
		}
	}
	cs := a.ControlState()
	if !slices.IsSortedFunc(cs.JoinCredentials, func(x, y core.JoinCredential) int { return bytes.Compare(x.Hash[:], y.Hash[:]) }) {
		t.Fatal("JoinCredentials not sorted by hash")
	}
}

func TestControlStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{bootstrapRecorded(1, 1).String(), "bootstrap_recorded{node:1,incarnation:1}"},
		{admissionAccepted(2, 3).String(), "admission_accepted{node:2,incarnation:3}"},
		{replacementPrepared(4, 4).String(), "replacement_prepared{node:4,incarnation:4}"},
		{controlApplied(5, 6).String(), "control_applied{node:5,incarnation:6}"},
		{controlRejected(core.ReasonCredentialReused).String(), "control_rejected{reason:credential_reused}"},
		{core.ResultControlRejected.String(), "control_rejected"},
		{core.ControlRetire.String(), "retire"},
		{core.ControlOp(0).String(), "control_op(0)"},
		{core.RoleVoter.String(), "voter"},
		{core.RoleLearner.String(), "learner"},
		{core.Role(0).String(), "role(0)"},
		{core.CredentialConsumed.String(), "consumed"},
		{core.ControlRequest{}.String(), "none"},
		{core.Promote(2, 3).Control.String(), "promote{node_id:2,incarnation:3}"},
		{core.PrepareReplacement(1, "a:1").Control.String(), `prepare_replacement{old_node_id:1,address:"a:1"}`},
		{core.MintJoin([32]byte{31: 1}).Control.String(), "mint_join{credential_hash:" + strings.Repeat("00", 31) + "01}"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
