package core_test

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// v2Machine is a machine whose cluster agreed on version 2, with a lock
// granted to an identity and one without.
func v2Machine(t testing.TB) *core.Machine {
	t.Helper()
	m := core.NewMachine()
	if r := m.Apply(core.SetClusterVersion(2)); r.Kind != core.ResultControlApplied {
		t.Fatalf("SetClusterVersion(2) = %v", r)
	}
	g := core.Grant("jobs/1", "worker", lease, 5)
	g.Identity = "ACCOUNT_A/alice"
	applyAll(m, g, core.Grant("jobs/2", "", lease, 6))
	return m
}

func TestEntryVersionGoldens(t *testing.T) {
	identityGrant := core.Grant("k", "o", 1000, 5)
	identityGrant.Identity = "acct"
	tests := []struct {
		name string
		cmd  core.Command
		hex  string
	}{
		// Cluster version 1 commands keep entry version 1, byte for byte.
		{"grant without identity is v1", core.Grant("k", "o", 1000, 5), "010701016be807016f05"},
		{"grant with identity is v2", identityGrant, "020701016be807016f050461636374"},
		{"renew", core.Renew("k", 9, 2000), "020705016b09d00f"},
		{"renew keeping the lease", core.Renew("k", 9, 0), "020705016b0900"},
		{"set cluster version", core.SetClusterVersion(2), "0207040902"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := core.EncodeEntry(core.Entry{RequestID: 7, Command: tc.cmd})
			if got := hex.EncodeToString(b); got != tc.hex {
				t.Fatalf("EncodeEntry = %s, want %s", got, tc.hex)
			}
			e, err := core.DecodeEntry(b)
			if err != nil || e.Command != tc.cmd || e.RequestID != 7 {
				t.Fatalf("DecodeEntry = %+v, %v", e, err)
			}
		})
	}
}

func TestEntryVersionRejects(t *testing.T) {
	for _, tc := range []struct{ name, hex string }{
		// A version 2 grant without identity has a version 1 encoding.
		{"v2 grant with empty identity", "020701016be807016f0500"},
		{"renew in a v1 entry", "010705016b09d00f"},
		{"set cluster version in a v1 entry", "0107040902"},
		{"set cluster version 7 (unknown to this binary)", "0207040907"},
		{"set cluster version 1", "0207040901"},
		{"renew lease below the minimum", "020705016b0901"},
		{"renew token 0", "020705016b00d00f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := hex.DecodeString(tc.hex)
			if e, err := core.DecodeEntry(b); err == nil {
				t.Fatalf("DecodeEntry(%s) = %+v, want an error", tc.hex, e)
			} else {
				checkDecodeError(t, err)
			}
		})
	}
}

func TestVersion2CommandsWaitForTheClusterVersion(t *testing.T) {
	m := core.NewMachine()
	applyAll(m, core.Grant("k", "", lease, 0))
	identityGrant := core.Grant("other", "", lease, 0)
	identityGrant.Identity = "acct"
	before := m.Digest()
	for _, c := range []core.Command{core.Renew("k", 1, 2*lease), identityGrant} {
		if r := m.Apply(c); r != noop {
			t.Fatalf("Apply(%+v) at cluster version 1 = %v, want noop", c, r)
		}
	}
	if m.Digest() != before || m.ClusterVersion() != 1 {
		t.Fatal("a version 2 command changed a version 1 machine")
	}
	if r := m.Apply(core.SetClusterVersion(2)); r.Kind != core.ResultControlApplied || m.ClusterVersion() != 2 {
		t.Fatalf("SetClusterVersion(2) = %v, version %d", r, m.ClusterVersion())
	}
	if r := m.Apply(core.SetClusterVersion(2)); r != controlRejected(core.ReasonVersionNotNewer) {
		t.Fatalf("second SetClusterVersion(2) = %v", r)
	}
	if r := m.Apply(identityGrant); r.Kind != core.ResultGranted {
		t.Fatalf("identity grant at version 2 = %v", r)
	}
	if l, _ := m.Get("other"); l.Identity != "acct" {
		t.Fatalf("identity not kept: %+v", l)
	}
}

func TestRenew(t *testing.T) {
	m := v2Machine(t)
	l, _ := m.Get("jobs/1")
	tests := []struct {
		name      string
		cmd       core.Command
		want      core.Result
		wantLease uint64
	}{
		{"wrong token", core.Renew("jobs/1", l.Token+1, 5*lease), notFound, lease},
		{"free key", core.Renew("nobody", l.Token, 5*lease), notFound, lease},
		{"keep the lease", core.Renew("jobs/1", l.Token, 0), core.Result{Kind: core.ResultRenewed, Token: l.Token}, lease},
		{"lengthen", core.Renew("jobs/1", l.Token, 5*lease), core.Result{Kind: core.ResultRenewed, Token: l.Token}, 5 * lease},
		// A shorter lease never shortens what a holder may assume.
		{"never shorten", core.Renew("jobs/1", l.Token, core.MinLeaseMS), core.Result{Kind: core.ResultRenewed, Token: l.Token}, 5 * lease},
	}
	for _, tc := range tests {
		last := m.LastToken()
		if got := m.Apply(tc.cmd); got != tc.want {
			t.Fatalf("%s: Apply = %v, want %v", tc.name, got, tc.want)
		}
		got, _ := m.Get("jobs/1")
		if got.Token != l.Token || got.LeaseMS != tc.wantLease || got.Owner != l.Owner || got.Identity != l.Identity || m.LastToken() != last {
			t.Fatalf("%s: lock %+v (last token %d), want token %d lease %d", tc.name, got, m.LastToken(), l.Token, tc.wantLease)
		}
	}
}

func TestFormatsFollowTheClusterVersion(t *testing.T) {
	v1 := core.NewMachine()
	applyAll(v1, core.Grant("a", "o", lease, 1))
	if s, c := v1.Snapshot(), v1.ControlSnapshot(); s[3] != core.SnapshotVersion2 || c[3] != core.ControlStateVersion1 {
		t.Fatalf("cluster version 1 wrote snapshot v%d, control record v%d", s[3], c[3])
	}
	l, _ := v1.Get("a")
	if rec := core.EncodeLockRecord(l); rec[0] != core.LockRecVersion1 {
		t.Fatalf("lock without identity written as record v%d", rec[0])
	}

	m := v2Machine(t)
	snap, rec := m.Snapshot(), m.ControlSnapshot()
	if snap[3] != core.SnapshotVersion3 || rec[3] != core.ControlStateVersion2 {
		t.Fatalf("cluster version 2 wrote snapshot v%d, control record v%d", snap[3], rec[3])
	}
	restored := core.NewMachine()
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if restored.Digest() != m.Digest() || restored.ClusterVersion() != 2 || !bytes.Equal(restored.Snapshot(), snap) {
		t.Fatal("snapshot v3 did not restore the same state")
	}
	if got, _ := restored.Get("jobs/1"); got.Identity != "ACCOUNT_A/alice" {
		t.Fatalf("identity lost through the snapshot: %+v", got)
	}
	cs, err := core.DecodeControlState(rec)
	if err != nil || cs.ClusterVersion != 2 {
		t.Fatalf("control record v2: %+v, %v", cs, err)
	}
	held, _ := m.Get("jobs/1")
	lrec := core.EncodeLockRecord(held)
	if lrec[0] != core.LockRecVersion2 {
		t.Fatalf("lock with identity written as record v%d", lrec[0])
	}
	if got, err := core.DecodeLockRecord(lrec); err != nil || got != held {
		t.Fatalf("lock record v2 round trip: %+v, %v", got, err)
	}
	// A v2 record must carry an identity (else it has a v1 encoding).
	empty := append([]byte{core.LockRecVersion2}, lrec[1:len(lrec)-len(held.Identity)-1]...)
	if _, err := core.DecodeLockRecord(append(empty, 0)); err == nil {
		t.Fatal("lock record v2 with an empty identity decoded")
	}
}
