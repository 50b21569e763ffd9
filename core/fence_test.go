package core_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// seed is test fence seed n (n > 0; 0 is the zero seed).
func seed(n int) core.FenceSeed {
	if n == 0 {
		return core.FenceSeed{}
	}
	return core.FenceSeed(sha256.Sum256([]byte(fmt.Sprintf("fence-seed-%d", n))))
}

func publicOf(s core.FenceSeed) ed25519.PublicKey {
	pub, _ := ed25519.NewKeyFromSeed(s[:]).Public().(ed25519.PublicKey)
	return pub
}

func TestSetFenceKey(t *testing.T) {
	m := v3Machine(t)
	if _, ok := m.CurrentFenceKey(); ok || m.FencePublicKeys() != nil || m.CurrentFenceKeyIs(publicOf(seed(1))) {
		t.Fatal("a fresh machine has a fence key")
	}
	applied := core.Result{Kind: core.ResultControlApplied}
	for i := 1; i <= core.MaxFenceKeys+2; i++ {
		before := m.Digest()
		if r := m.Apply(core.SetFenceKey(seed(i))); r != applied {
			t.Fatalf("SetFenceKey(%d) = %v", i, r)
		}
		if m.Digest() == before {
			t.Fatalf("SetFenceKey(%d) left the digest", i)
		}
		cur, ok := m.CurrentFenceKey()
		if !ok || !cur.Public.Equal(publicOf(seed(i))) {
			t.Fatalf("current key after SetFenceKey(%d) is not it", i)
		}
		if !m.CurrentFenceKeyIs(publicOf(seed(i))) || m.CurrentFenceKeyIs(publicOf(seed(i-1))) || m.CurrentFenceKeyIs(nil) {
			t.Fatalf("CurrentFenceKeyIs after SetFenceKey(%d) does not tell the current key", i)
		}
		// The ID is the fence package's: SHA-256 of the public key, 8 bytes.
		sum := sha256.Sum256(cur.Public)
		if !bytes.Equal(cur.ID[:], sum[:core.FenceKeyIDLen]) || cur.ID != core.FenceKeyIDOf(cur.Public) {
			t.Fatalf("key id %s", cur.ID)
		}
		msg := []byte("fence")
		if !ed25519.Verify(cur.Public, msg, ed25519.Sign(cur.Private, msg)) {
			t.Fatal("the current key does not sign")
		}
		// Oldest first, current last, at most MaxFenceKeys.
		var want []core.FencePublicKey
		for j := max(1, i-core.MaxFenceKeys+1); j <= i; j++ {
			want = append(want, core.FencePublicKey{ID: core.FenceKeyIDOf(publicOf(seed(j))), Key: publicOf(seed(j))})
		}
		got := m.FencePublicKeys()
		if !slices.EqualFunc(got, want, func(a, b core.FencePublicKey) bool { return a.ID == b.ID && a.Key.Equal(b.Key) }) {
			t.Fatalf("after %d keys: %d public keys, want %d", i, len(got), len(want))
		}
		checkControlInvariants(t, m)
		checkRequestsSurvive(t, m)
	}
	// A kept seed again is rejected and changes nothing; a dropped one may
	// come back (the leader never reuses one; this only shows the rule).
	before := m.Digest()
	if r := m.Apply(core.SetFenceKey(seed(core.MaxFenceKeys + 2))); r != controlRejected(core.ReasonFenceKeyExists) {
		t.Fatalf("repeated seed = %v", r)
	}
	if m.Digest() != before {
		t.Fatal("a rejected SetFenceKey changed the state")
	}
	// The private key handed out is a copy.
	cur, _ := m.CurrentFenceKey()
	clear(cur.Private)
	if again, _ := m.CurrentFenceKey(); again.Private.Equal(cur.Private) {
		t.Fatal("CurrentFenceKey hands out the machine's own key")
	}
}

// SetFenceKey needs no bootstrap: static clusters sign fences too. The keys
// survive every path the control state takes.
func TestFenceKeysTravel(t *testing.T) {
	static := v3Machine(t)
	bootstrappedM := v3Machine(t)
	mustApply(t, bootstrappedM, bootstrapped...)
	for name, m := range map[string]*core.Machine{"static": static, "bootstrapped": bootstrappedM} {
		applyAll(m, core.SetFenceKey(seed(1)), core.SetFenceKey(seed(2)))
		cs, err := core.DecodeControlState(m.ControlSnapshot())
		if err != nil || !slices.Equal(cs.FenceKeys, []core.FenceSeed{seed(1), seed(2)}) {
			t.Fatalf("%s: control record: %v, %d keys", name, err, len(cs.FenceKeys))
		}
		if m.ControlSnapshot()[3] != core.ControlStateVersion3 || m.Snapshot()[3] != core.SnapshotVersion4 {
			t.Fatalf("%s: control record v%d, snapshot v%d", name, m.ControlSnapshot()[3], m.Snapshot()[3])
		}
		checkRequestsSurvive(t, m)
		for _, o := range []core.ReseedOptions{{Static: true}, {Address: addr(9)}, {DropLocks: true, Address: addr(9)}} {
			x, _ := reseeded(t, m, o)
			cur, ok := x.CurrentFenceKey()
			if !ok || !cur.Public.Equal(publicOf(seed(2))) || len(x.FencePublicKeys()) != 2 {
				t.Fatalf("%s: reseed %+v lost the fence keys", name, o)
			}
		}
	}
}

// The seed never shows when a command, a request or a state is printed.
func TestFenceSeedNeverPrinted(t *testing.T) {
	s := seed(7)
	c := core.SetFenceKey(s)
	m := v3Machine(t)
	applyAll(m, c)
	cs := m.ControlState()
	secret := hex.EncodeToString(s[:])
	for _, out := range []string{
		fmt.Sprint(c), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%s", c.Control),
		fmt.Sprintf("%x", c.Control.FenceSeed), fmt.Sprintf("%+v", cs), fmt.Sprintf("%#v", cs), c.Control.String(),
	} {
		if strings.Contains(out, secret) || strings.Contains(out, secret[:16]) || strings.Contains(out, fmt.Sprint([32]byte(s))) {
			t.Fatalf("seed printed: %s", out)
		}
	}
	id := core.FenceKeyIDOf(publicOf(s)).String()
	if got := c.Control.String(); got != "set_fence_key{key_id:"+id+"}" {
		t.Fatalf("String() = %s", got)
	}
}

func TestSetFenceKeyValidate(t *testing.T) {
	if err := core.SetFenceKey(core.FenceSeed{}).Validate(); err == nil {
		t.Fatal("a zero seed validates")
	}
	r := core.SetFenceKey(seed(1))
	r.Control.Version = 3
	if err := r.Validate(); err == nil {
		t.Fatal("set_fence_key with a version validates")
	}
	p := core.Promote(1, 1)
	p.Control.FenceSeed = seed(1)
	if err := p.Validate(); err == nil {
		t.Fatal("promote with a fence seed validates")
	}
	if core.CommandVersion(core.SetFenceKey(seed(1))) != 3 {
		t.Fatal("SetFenceKey is not a version 3 command")
	}
}
