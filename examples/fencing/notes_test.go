//go:build unix

package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/fence/fencepg"
)

// TestWriteFencedRefusesForgeries is the attack the signature stops: a
// client that invents a huge token would, at a resource that compares bare
// numbers, lock every honest holder out for ever. Each forgery below is
// refused with its code before the database is touched; the note and the
// highest accepted token stay the honest holder's, and the next honest
// holder still writes.
func TestWriteFencedRefusesForgeries(t *testing.T) {
	if testing.Short() {
		t.Skip("PostgreSQL test skipped in -short mode")
	}
	if pgServer == nil {
		t.Skip(pgSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepDeadline)
	defer cancel()
	const (
		key       = "notes/forged"
		clusterID = uint64(0x0123456789abcdef)
		huge      = uint64(math.MaxInt64)
	)
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := fence.PublicKeyFromPrivate(priv)
	if err != nil {
		t.Fatal(err)
	}
	v, err := fence.NewVerifier(clusterID, pub)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(priv ed25519.PrivateKey, cluster uint64, key string, token uint64) string {
		t.Helper()
		s, err := fence.Sign(priv, cluster, key, token)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	notes := &Notes{db: pgServer.NewDB(t), verifier: v}
	if err := notes.Setup(ctx, key); err != nil {
		t.Fatal(err)
	}
	honest := sign(priv, clusterID, key, 5)
	if tok, err := notes.WriteFenced(ctx, key, honest, "honest\n", "A"); err != nil || tok != 5 {
		t.Fatalf("the honest write: token %d, %v", tok, err)
	}
	want := Note{Key: key, Body: "honest\n", Writer: "A", Token: 5, Fence: 5}

	for _, tc := range []struct {
		name, fence string
		code        fence.Code
	}{
		{"a huge token signed by a key the resource does not trust", sign(otherPriv, clusterID, key, huge), fence.CodeUnknownKey},
		{"the honest fence with its token raised", withToken(t, honest, huge), fence.CodeForged},
		{"another cluster's fence (same key: a restored backup)", sign(priv, clusterID+1, key, huge), fence.CodeWrongCluster},
		{"an authentic fence for another lock key", sign(priv, clusterID, "notes/other", huge), fence.CodeWrongKey},
		{"a bare number, as an unfenced client sends", "9223372036854775807", fence.CodeMalformed},
		{"no fence", "", fence.CodeMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := notes.WriteFenced(ctx, key, tc.fence, "forged\n", "M")
			if got := fence.CodeOf(err); got != tc.code {
				t.Fatalf("WriteFenced: %v (code %q), want code %q", err, got, tc.code)
			}
			if got := readNote(t, notes.db, key); got != want {
				t.Fatalf("the note is %+v after a refused forgery, want %+v", got, want)
			}
		})
	}

	// The record was not poisoned: the next honest holder writes, and the
	// one before it is stale.
	if tok, err := notes.WriteFenced(ctx, key, sign(priv, clusterID, key, 6), "next\n", "B"); err != nil || tok != 6 {
		t.Fatalf("the next honest write: token %d, %v", tok, err)
	}
	if _, err := notes.WriteFenced(ctx, key, honest, "late\n", "A"); fence.CodeOf(err) != fence.CodeStale {
		t.Fatalf("the former holder's write: %v, want fence_stale", err)
	}
	if cur, err := fencepg.Current(ctx, notes.db, key); err != nil || cur != 6 {
		t.Fatalf("the highest accepted token is %d (%v), want 6", cur, err)
	}
}

// withToken is fc with the token in its payload replaced, the signature
// kept: what a client that edits its fence sends. The payload is version
// (1 byte), cluster ID (8), key ID (8), then the token (8, big-endian).
func withToken(t *testing.T, fc string, token uint64) string {
	t.Helper()
	parts := strings.Split(fc, ".")
	if len(parts) != 3 {
		t.Fatalf("not a fence: %q", fc)
	}
	p, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || len(p) < 25 {
		t.Fatalf("fence payload %q: %v", parts[1], err)
	}
	binary.BigEndian.PutUint64(p[17:25], token)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}
