package control

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
)

// TestFirstFenceKey: the leader makes a fence key only once the cluster
// version is 3, and only when there is none; the key core applies is the
// one the reply and fence's KeyID name.
func TestFirstFenceKey(t *testing.T) {
	n := newFakeNode()
	p := New(Config{ID: 1, Node: n})
	n.m.Apply(core.SetClusterVersion(2))
	p.maybeSetFenceKey(context.Background())
	if len(n.proposed) != 0 {
		t.Fatalf("proposed %v at cluster version 2", n.proposed)
	}
	n.m.Apply(core.SetClusterVersion(3))
	p.maybeSetFenceKey(context.Background())
	p.maybeSetFenceKey(context.Background())
	if len(n.proposed) != 1 || n.proposed[0].Control.Op != core.ControlSetFenceKey {
		t.Fatalf("proposed %v, want one SetFenceKey", n.proposed)
	}
	var k core.FenceKey
	n.View(func(m *core.Machine) { k, _ = m.CurrentFenceKey() })
	pk, err := fence.PublicKeyFromPrivate(k.Private)
	if err != nil {
		t.Fatal(err)
	}
	if core.FenceKeyID(pk.ID()) != k.ID {
		t.Fatalf("core key ID %s, fence.KeyID %s", k.ID, pk.ID())
	}
	if cur := p.currentFenceKeyText(); cur != pk.String() {
		t.Fatalf("current key %q, want %q", cur, pk.String())
	}
}

// TestRotateFenceKey: POST /v1/fence/rotate needs the control credential
// and cluster version 3, makes a new current key and keeps the older ones
// (at most core.MaxFenceKeys); the seed never appears in a reply.
func TestRotateFenceKey(t *testing.T) {
	_, n, _, url := newTestAPI(t)
	n.m.Apply(core.SetClusterVersion(2))
	if status, body := post(t, "POST", url+"/v1/fence/rotate", testAdmin, ""); status != 503 || !strings.Contains(body, `"code":"unavailable"`) {
		t.Fatalf("at cluster version 2: %d %s", status, body)
	}
	n.m.Apply(core.SetClusterVersion(3))
	if status, body := post(t, "POST", url+"/v1/fence/rotate", "", ""); status != 401 {
		t.Fatalf("without the credential: %d %s", status, body)
	}
	var seen []string
	for i := 1; i <= core.MaxFenceKeys+1; i++ {
		status, body := post(t, "POST", url+"/v1/fence/rotate", testAdmin, "")
		if status != 200 {
			t.Fatalf("rotation %d: %d %s", i, status, body)
		}
		var rep Reply
		if err := json.Unmarshal([]byte(body), &rep); err != nil {
			t.Fatal(err)
		}
		if _, err := fence.ParsePublicKey(rep.FenceKey); err != nil {
			t.Fatalf("rotation %d: current key %q: %v", i, rep.FenceKey, err)
		}
		seen = append(seen, rep.FenceKey)
		want := seen[max(0, len(seen)-core.MaxFenceKeys):]
		if strings.Join(rep.FenceKeys, ",") != strings.Join(want, ",") || rep.FenceKey != want[len(want)-1] {
			t.Fatalf("rotation %d: keys %v current %s, want %v", i, rep.FenceKeys, rep.FenceKey, want)
		}
		var k core.FenceKey
		n.View(func(m *core.Machine) { k, _ = m.CurrentFenceKey() })
		if strings.Contains(body, string(k.Private)) || strings.Contains(strings.ToLower(body), "seed") {
			t.Fatalf("reply shows the secret: %s", body)
		}
	}
}
