package control

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestIdentityFile(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := ReadIdentity(dir); ok || err != nil {
		t.Fatalf("no file: ok %v err %v", ok, err)
	}
	want := Identity{NodeID: 4, Incarnation: 7, ControlURLs: []string{"http://a:7100", "http://b:7100"}}
	if err := WriteIdentity(dir, want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ReadIdentity(dir)
	if err != nil || !ok || got.NodeID != 4 || got.Incarnation != 7 || strings.Join(got.ControlURLs, ",") != "http://a:7100,http://b:7100" {
		t.Fatalf("read back %+v %v %v", got, ok, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "{\n  \"node_id\": 4,\n  \"incarnation\": 7,\n  \"control_urls\": [\n    \"http://a:7100\",\n    \"http://b:7100\"\n  ]\n}" {
		t.Fatalf("file format changed:\n%s", b)
	}
	for name, body := range map[string]string{
		"not JSON":        "{",
		"unknown field":   `{"node_id":1,"incarnation":1,"extra":true}`,
		"no node id":      `{"incarnation":1}`,
		"no incarnation":  `{"node_id":1}`,
		"wrong type":      `{"node_id":"1","incarnation":1}`,
		"empty":           ``,
		"zero everything": `{"node_id":0,"incarnation":0}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, "identity.json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := ReadIdentity(dir); ok || err == nil || !strings.Contains(err.Error(), "identity file is corrupt") {
			t.Errorf("%s: ok %v err %v", name, ok, err)
		}
	}
}

type fakeLog struct {
	last uint64
	err  error
}

func (l fakeLog) LastIndex() (uint64, error) { return l.last, l.err }

// TestResolveIdentity covers the start-up decisions that need no cluster.
func TestResolveIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// No identity, no join: the configured id stands.
	if r, err := ResolveIdentity(ctx, StartConfig{DataDir: t.TempDir()}); err != nil || r != (Resolved{}) {
		t.Fatalf("static: %+v %v", r, err)
	}
	// An identity file with nobody to ask about it is used as is.
	dir := t.TempDir()
	if err := WriteIdentity(dir, Identity{NodeID: 5, Incarnation: 2}); err != nil {
		t.Fatal(err)
	}
	if r, err := ResolveIdentity(ctx, StartConfig{DataDir: dir, Log: fakeLog{last: 10}}); err != nil || r.NodeID != 5 || r.Join != nil {
		t.Fatalf("identity file: %+v %v", r, err)
	}
	// A node with raft state but no identity may not join with it.
	_, err := ResolveIdentity(ctx, StartConfig{DataDir: t.TempDir(), Join: true, JoinURLs: []string{"http://127.0.0.1:1"}, Log: fakeLog{last: 3}})
	if err == nil || !strings.Contains(err.Error(), "holds raft state but no identity") {
		t.Fatalf("join with raft state: %v", err)
	}
}

// TestResolveIdentityJoin: a joining node writes the identity it was
// issued; an identity the cluster refuses stops the node.
func TestResolveIdentityJoin(t *testing.T) {
	_, _, _, url := newTestAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	urls := []string{url}
	if _, err := Call(ctx, urls, "/v1/bootstrap", testAdmin, Request{Credential: testBoot}); err != nil {
		t.Fatal(err)
	}
	mint, err := Call(ctx, urls, "/v1/join-credentials", testAdmin, Request{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := StartConfig{DataDir: dir, Join: true, JoinURLs: urls, JoinCredential: mint.Credential, PeerListen: "127.0.0.1:7002", Log: fakeLog{}}
	r, err := ResolveIdentity(ctx, cfg)
	if err != nil || r.NodeID != 2 || r.Join == nil || r.Join.NodeID != 2 || len(r.Join.Members) != 2 {
		t.Fatalf("join: %+v %v", r, err)
	}
	id, ok, err := ReadIdentity(dir)
	if err != nil || !ok || id.NodeID != 2 || id.Incarnation != r.Join.Incarnation || strings.Join(id.ControlURLs, ",") != url {
		t.Fatalf("identity written %+v %v %v", id, ok, err)
	}
	// Restarted, it is confirmed and does not join again.
	if r, err := ResolveIdentity(ctx, cfg); err != nil || r.NodeID != 2 || r.Join != nil {
		t.Fatalf("restart: %+v %v", r, err)
	}
	// An incarnation the cluster never issued is refused.
	if err := WriteIdentity(dir, Identity{NodeID: 2, Incarnation: 99, ControlURLs: urls}); err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveIdentity(ctx, StartConfig{DataDir: dir}); err == nil || !strings.Contains(err.Error(), "refuses identity 2/99") {
		t.Fatalf("stale incarnation: %v", err)
	}
}
