package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
)

// TestFenceCommands: fence pubkey prints the key a grant's fence verifies
// with (and, with --json, the cluster ID), lock check exits 0 for the
// current token and 1, printing the holder's token, for another, and
// admin fence rotate makes a new current key that the next grant is signed
// with while the first key stays listed.
func TestFenceCommands(t *testing.T) {
	bin := binary(t)
	const cred = "fence-cli-test-control-credential"
	c := testcluster.New(t, 1, testcluster.WithConfig(func(i int, cfg *daemon.Config) {
		cfg.ControlListen = testkit.FreeAddr(t)
		cfg.ControlCredential = cred
	}))
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(0)) })
	url := c.ClientURL(0)
	credFile := filepath.Join(t.TempDir(), "control.cred")
	if err := os.WriteFile(credFile, []byte(cred), 0o600); err != nil {
		t.Fatal(err)
	}

	verifier := func() (*fence.Verifier, []string) {
		t.Helper()
		r := runCLI(t, bin, "fence", "pubkey", "--nats", url)
		if r.code != 0 {
			t.Fatalf("fence pubkey: exit %d %q", r.code, r.stderr)
		}
		lines := strings.Fields(r.stdout)
		var keys []fence.PublicKey
		for _, l := range lines {
			k, err := fence.ParsePublicKey(l)
			if err != nil {
				t.Fatalf("fence pubkey line %q: %v", l, err)
			}
			keys = append(keys, k)
		}
		v, _, code := cli(t, bin, "fence", "pubkey", "--json", "--nats", url)
		id, err := fence.ParseClusterID(fmt.Sprint(v["cluster_id"]))
		if code != 0 || err != nil || id != c.Node(0).ClusterID() || v["current"] != lines[len(lines)-1] {
			t.Fatalf("fence pubkey --json: exit %d %v (%v), cluster %016x", code, v, err, c.Node(0).ClusterID())
		}
		ver, err := fence.NewVerifier(id, keys...)
		if err != nil {
			t.Fatal(err)
		}
		return ver, lines
	}
	acquire := func(key string) (uint64, fence.Fence) {
		t.Helper()
		v, stderr, code := cli(t, bin, "lock", "acquire", key, "--lease", "1m", "--nats", url)
		if code != 0 {
			t.Fatalf("acquire: exit %d %q", code, stderr)
		}
		ver, _ := verifier()
		f, err := ver.Verify(fmt.Sprint(v["fence"]))
		if err != nil || f.Key != key || f.Token != token(t, v) {
			t.Fatalf("acquire's fence %v: %+v %v", v["fence"], f, err)
		}
		return f.Token, f
	}

	tok, f1 := acquire("fenced/1")
	v, stderr, code := cli(t, bin, "lock", "check", "fenced/1", fmt.Sprint(tok), "--nats", url)
	if code != 0 || v["current"] != true || token(t, v) != tok {
		t.Fatalf("check of the holder's token: exit %d %v %q", code, v, stderr)
	}
	v, stderr, code = cli(t, bin, "lock", "check", "fenced/1", fmt.Sprint(tok+7), "--nats", url)
	if code != exitFailure || v["current"] != false || token(t, v) != tok || stderr != "" {
		t.Fatalf("check of another token: exit %d %v %q", code, v, stderr)
	}
	if r := runCLI(t, bin, "lock", "check", "fenced/1", "0", "--nats", url); r.code != exitUsage {
		t.Fatalf("check of token 0: exit %d %q", r.code, r.stderr)
	}

	v, stderr, code = cli(t, bin, "admin", "fence", "rotate", "--control", "http://"+c.Config(0).ControlListen, "--control-credential-file", credFile)
	if code != 0 || v["result"] != "control_applied" {
		t.Fatalf("admin fence rotate: exit %d %v %q", code, v, stderr)
	}
	_, lines := verifier()
	if len(lines) != 2 || v["fence_key"] != lines[1] {
		t.Fatalf("after the rotation fence pubkey prints %v, rotate said %v", lines, v["fence_key"])
	}
	_, f2 := acquire("fenced/2")
	if f2.KeyID == f1.KeyID {
		t.Fatalf("the grant after the rotation is signed with the old key %s", f1.KeyID)
	}
}
