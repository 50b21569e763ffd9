package sdk_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/sdk"
)

// TestFenceInGrants: once the cluster runs version 3 its leader makes a
// fence key by itself; every grant then carries a fence that verifies with
// the keys the cluster serves, names the grant's key, token and cluster,
// and is refused by a verifier of another cluster. A forged token (the
// fence of token 1 edited to say 2^40) is refused.
func TestFenceInGrants(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead)) // fence_keys forwarded by a follower at first
	ctx := t.Context()
	keys, err := cl.FenceKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.Keys) != 1 || keys.Current.String() != keys.Keys[0].String() {
		t.Fatalf("keys %+v, want one current key", keys)
	}
	if want := c.Node(lead).ClusterID(); keys.ClusterID != want {
		t.Fatalf("cluster ID %016x, want %016x", keys.ClusterID, want)
	}
	// The key ID core keeps is the fence package's: a fence names the key
	// that a resource looks up.
	var coreKey core.FenceKey
	c.Node(lead).Node().View(func(m *core.Machine) { coreKey, _ = m.CurrentFenceKey() })
	if core.FenceKeyIDOf(coreKey.Public) != core.FenceKeyID(keys.Current.ID()) || coreKey.ID != core.FenceKeyID(keys.Current.ID()) {
		t.Fatalf("core key ID %s, fence key ID %s", coreKey.ID, keys.Current.ID())
	}
	v, err := keys.Verifier()
	if err != nil {
		t.Fatal(err)
	}
	l, err := cl.Acquire(ctx, "orders/42", sdk.WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f, err := v.Verify(l.Fence)
	if err != nil {
		t.Fatalf("fence %q: %v", l.Fence, err)
	}
	if f.Key != "orders/42" || f.Token != l.Token || f.ClusterID != keys.ClusterID || f.KeyID != keys.Current.ID() {
		t.Fatalf("fence says %+v, lock %v", f, l)
	}
	foreign, err := fence.NewVerifier(keys.ClusterID+1, keys.Keys...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := foreign.Verify(l.Fence); !errors.Is(err, fence.ErrWrongCluster) {
		t.Fatalf("another cluster's verifier: %v, want ErrWrongCluster", err)
	}
	forged, err := fence.Sign(make([]byte, 64), keys.ClusterID, "orders/42", 1<<40)
	if err == nil {
		if _, err := v.Verify(forged); err == nil {
			t.Fatal("a fence signed with another key verified")
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCheckSupersededToken: lock check says false for a superseded token
// in the first round trip after the new grant's acquire returned, and
// never true for it again, across a leader change; the current token is
// reported true, a free key false with token 0.
func TestCheckSupersededToken(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	a, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Check(ctx, "k", a.Token); err != nil || !got.Current || got.Token != a.Token {
		t.Fatalf("check of the holder's token: %+v, %v", got, err)
	}
	// B waits for A's lease to run out and takes the key.
	b, err := cl.Acquire(ctx, "k", sdk.WithLease(10*time.Second), sdk.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Check(ctx, "k", a.Token); err != nil || got.Current || got.Token != b.Token {
		t.Fatalf("check of the superseded token right after the new grant: %+v, %v", got, err)
	}
	if err := c.Stop(lead); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for answered := 0; answered < 20 && time.Now().Before(deadline); {
		got, err := cl.Check(ctx, "k", a.Token)
		if err != nil {
			continue // the election: retried within the budget, or unavailable
		}
		answered++
		if got.Current {
			t.Fatalf("superseded token %d reported current again: %+v", a.Token, got)
		}
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Check(ctx, "k", b.Token); err != nil || got.Current || got.Token != 0 {
		t.Fatalf("check of a free key: %+v, %v", got, err)
	}
	if _, err := cl.Check(ctx, "k", 0); !errors.Is(err, sdk.ErrInvalidArgument) {
		t.Fatalf("token 0: %v", err)
	}
}
