package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
)

// startNode is one in-process node on an embedded NATS; it returns the
// NATS URL.
func startNode(t *testing.T) string {
	t.Helper()
	cfg := daemon.Defaults()
	cfg.Data, cfg.NATSListen, cfg.NoSync, cfg.TickMS = filepath.Join(t.TempDir(), "data"), testkit.FreeAddr(t), true, testkit.TickMS
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool { return testcluster.Settled(d) })
	return "nats://" + cfg.NATSListen
}

// lockJSON runs a lock command that prints one JSON object.
func lockJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	code, out, errOut := runInProcess(args...)
	var v map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("ticketd %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
	}
	return v
}

// lock exec resolves its command before taking the lock: a missing or
// non-executable command ends with 127 or 126, naming it, and uses up no
// token. lock acquire and lock exec default the owner to USER@HOST:PID.
func TestExecMissingCommandTakesNoToken(t *testing.T) {
	url := startNode(t)
	flags := []string{"--nats", url, "--timeout", "5s"}
	first := lockJSON(t, append([]string{"lock", "acquire", "first/1", "--lease", "10s"}, flags...)...)
	host, _ := os.Hostname()
	if owner, _ := first["owner"].(string); !strings.HasSuffix(owner, fmt.Sprintf("@%s:%d", host, os.Getpid())) {
		t.Errorf("lock acquire's default owner %q, want USER@%s:%d", owner, host, os.Getpid())
	}
	noexec := filepath.Join(t.TempDir(), "noexec.sh")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		command string
		code    int
	}{
		{"./missing.sh", exitNotFound},
		{"no-such-command-ticketd", exitNotFound},
		{noexec, exitCannotRun},
	} {
		code, out, errOut := runInProcess(append(append([]string{"lock", "exec", "exec/1"}, flags...), "--", tc.command)...)
		if code != tc.code || out != "" || !strings.HasPrefix(errOut, "error: lock exec: ") || !strings.Contains(errOut, tc.command) {
			t.Errorf("lock exec -- %s: exit %d, stdout %q, stderr %q; want %d naming the command", tc.command, code, out, errOut, tc.code)
		}
	}
	next := lockJSON(t, append([]string{"lock", "acquire", "first/2", "--lease", "10s"}, flags...)...)
	if next["token"].(float64) != first["token"].(float64)+1 {
		t.Fatalf("tokens %v then %v: lock exec of a missing command used up a token", first["token"], next["token"])
	}
	if got := lockJSON(t, append([]string{"lock", "get", "exec/1"}, flags...)...); got["held"] != false {
		t.Fatalf("exec/1 is held after a command that could not run: %v", got)
	}
}

// snapshot save refuses an existing file before it asks the leader; admin
// mint-join --out refuses one before it mints.
func TestSaveAndMintRefuseExistingFiles(t *testing.T) {
	existing := filepath.Join(t.TempDir(), "exists")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"snapshot", "save", existing, "--control", "http://127.0.0.1:1"},
		{"admin", "mint-join", "--out", existing, "--control", "http://127.0.0.1:1"},
	} {
		code, _, errOut := runInProcess(args...)
		if code != exitFailure || !strings.Contains(errOut, existing+" exists") {
			t.Errorf("ticketd %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Fatalf("the existing file was changed: %q", b)
	}
}

// writeFileAtomic writes mode 0600 (even over a stale .part of another
// mode) and refuses an existing file unless told to replace it.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path+".part", []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAtomic(path, []byte("one"), false); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if _, err := os.Stat(path + ".part"); !os.IsNotExist(err) {
		t.Fatalf("the temporary file is left: %v", err)
	}
	if err := writeFileAtomic(path, []byte("two"), false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("overwrite without force: %v", err)
	}
	if err := writeFileAtomic(path, []byte("two"), true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("content %q after a forced write", b)
	}
}

// A client command pointed at an address where no node listens (the
// newcomer's first mistake: no node started, or the wrong port) fails
// with the stable code unavailable, the OS's reason, and a hint to start
// a node.
func TestNoNodeThereIsUnavailableWithAHint(t *testing.T) {
	url := "nats://" + testkit.FreeAddr(t) // nothing listens there
	for _, args := range [][]string{
		{"status"},
		{"lock", "acquire", "orders/42", "--lease", "10s"},
		{"lock", "get", "orders/42"},
		{"lock", "release", "orders/42", "--token", "1"},
		{"lock", "ls", "orders/"},
		{"lock", "watch", "orders/42"},
		{"fence", "pubkey"},
	} {
		t.Run(strings.Join(args[:min(2, len(args))], " "), func(t *testing.T) {
			code, _, errOut := runInProcess(append(args, "--nats", url, "--timeout", "5s")...)
			if code != exitFailure || !strings.HasPrefix(errOut, "error: unavailable: ") ||
				!strings.Contains(errOut, "connection refused") || !strings.Contains(errOut, "hint: no NATS server answered") {
				t.Errorf("ticketd %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
			}
		})
	}
}
