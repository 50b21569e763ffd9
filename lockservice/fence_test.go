package lockservice

import (
	"testing"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
)

// TestGrantFenceFollowsRotation: every grant's fence verifies with the
// key current when it was granted, also after a rotation (the prepared
// signer is kept between grants and must not outlive its key), and
// grants before the first key carry none.
func TestGrantFenceFollowsRotation(t *testing.T) {
	const cluster = 77
	s, f := newLeader(t, Config{ClusterID: cluster})
	g, err := acquire(s, "", "before", 0)
	if err != nil || g.Fence != "" {
		t.Fatalf("before any key: %+v %v, want a grant without a fence", g, err)
	}
	f.mu.Lock()
	f.m.Apply(core.SetClusterVersion(3))
	f.mu.Unlock()
	for round, seedByte := range []byte{1, 2, 3} {
		f.mu.Lock()
		f.m.Apply(core.SetFenceKey(core.FenceSeed{seedByte}))
		cur, _ := f.m.CurrentFenceKey()
		f.mu.Unlock()
		pk, err := fence.NewPublicKey(cur.Public)
		if err != nil {
			t.Fatal(err)
		}
		only, err := fence.NewVerifier(cluster, pk)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			key := "k" + string(rune('a'+round)) + string(rune('0'+i))
			g, err := acquire(s, "", key, 0)
			if err != nil {
				t.Fatal(err)
			}
			fc, err := only.Verify(g.Fence)
			if err != nil {
				t.Fatalf("round %d: the fence of %s does not verify with the current key: %v", round, key, err)
			}
			if fc.Key != key || fc.Token != g.Token || fc.KeyID != pk.ID() {
				t.Fatalf("round %d: fence %+v for grant %+v", round, fc, g)
			}
			if err := s.Release(t.Context(), key, g.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
}
