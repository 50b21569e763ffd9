package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// The lock commands authenticate with the NATS client flags (the password
// from TICKETD_NATS_PASSWORD) and show permission_denied, exit status 1,
// when the access list refuses.
func TestCLIAuthAndPermissionDenied(t *testing.T) {
	dir := t.TempDir()
	listen := testkit.FreeAddr(t)
	conf := filepath.Join(dir, "nats.conf")
	// The lock subjects only: an export of ticketd.v1.> would hold the
	// followers' forward subjects, and --acl refuses to start with it.
	imp := `imports = [{ service: { account: TICKETD, subject: "ticketd.v1.lock.>" }, share: true }]`
	body := fmt.Sprintf(`listen: %s
accounts {
  TICKETD { users = [{ user: ticketd, password: ticketd-password }], exports = [{ service: "ticketd.v1.lock.>" }] }
  TENANT_A { users = [{ user: alice, password: alice-password }], %s }
}
`, listen, imp)
	acl := filepath.Join(dir, "acl.yaml")
	for path, content := range map[string]string{conf: body, acl: "TENANT_A:\n  \"a/\": [acquire, release, get]\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := daemon.Defaults()
	cfg.Data, cfg.NATSConfig, cfg.ACL, cfg.NoSync = filepath.Join(dir, "data"), conf, acl, true
	cfg.NATSUser, cfg.NATSPassword = "ticketd", "ticketd-password"
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	testkit.Eventually(t, 10*time.Second, "a leader", func() bool { return d.Locks().IsLeader() })

	t.Setenv("TICKETD_NATS_PASSWORD", "alice-password")
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		args = append(args, "--nats", "nats://"+listen, "--nats-user", "alice", "--timeout", "5s")
		code := run(context.Background(), args, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cli("lock", "acquire", "a/1", "--lease", "10s"); code != 0 || !strings.Contains(out, `"token":`) {
		t.Fatalf("acquire a/1: exit %d, %s %s", code, out, errs)
	}
	code, _, errs := cli("lock", "acquire", "b/1", "--lease", "10s")
	if code != exitFailure || !strings.HasPrefix(errs, "error: permission_denied: ") {
		t.Fatalf("acquire b/1: exit %d, stderr %q; want 1 and permission_denied", code, errs)
	}
	t.Setenv("TICKETD_NATS_PASSWORD", "wrong")
	if code, _, _ := cli("lock", "get", "a/1"); code == 0 {
		t.Fatal("a wrong password was accepted")
	}
}
