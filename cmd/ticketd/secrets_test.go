package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A secret given as a flag value is refused before anything runs, naming
// the file flag and variables to use instead and never echoing the value.
func TestSecretValueFlagsRefused(t *testing.T) {
	const value = "a-secret-value-0123456789"
	for _, tc := range []struct {
		args []string
		use  string // the advice: the file flag
	}{
		{[]string{"serve", "--peer-secret", value}, "--peer-secret-file FILE, or TICKETD_PEER_SECRET_FILE or TICKETD_PEER_SECRET"},
		{[]string{"serve", "--peer-secret=" + value}, "--peer-secret-file"},
		{[]string{"serve", "--control-credential", value}, "--control-credential-file FILE, or TICKETD_CONTROL_CREDENTIAL_FILE"},
		{[]string{"serve", "--bootstrap-credential", value}, "--bootstrap-credential-file FILE, or TICKETD_BOOTSTRAP_CREDENTIAL_FILE"},
		{[]string{"serve", "--join-credential", value}, "--join-credential-file FILE, or TICKETD_JOIN_CREDENTIAL_FILE"},
		{[]string{"serve", "--nats-password", value}, "--nats-password-file FILE, or TICKETD_NATS_PASSWORD_FILE"},
		{[]string{"admin", "members", "--credential", value}, "--control-credential-file"},
		{[]string{"admin", "mint-join", "--control-credential", value}, "--control-credential-file"},
		{[]string{"admin", "bootstrap", "--bootstrap-credential", value}, "--bootstrap-credential-file"},
		{[]string{"snapshot", "save", "f.tkb", "--credential", value}, "--control-credential-file"},
		{[]string{"lock", "get", "k", "--nats-password", value}, "--nats-password-file"},
		{[]string{"status", "--password", value}, "--nats-password-file"},
	} {
		code, out, errOut := runInProcess(tc.args...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, "Error: --") || !strings.Contains(errOut, " is refused: ") ||
			!strings.Contains(errOut, tc.use) || strings.Contains(errOut, value) {
			t.Errorf("ticketd %s: exit %d, stderr:\n%s\nwant exit 2 and a refusal pointing at %s, without the value", strings.Join(tc.args, " "), code, errOut, tc.use)
		}
	}
}

// A password or a token inside a NATS URL is refused at start on every
// command that takes one, pointing at --nats-user and the password's file
// or variable, and at the token's.
func TestNATSURLPasswordRefusedByEveryCommand(t *testing.T) {
	for _, url := range []string{"nats://alice:hunter2@127.0.0.1:1", "nats://hunter2@127.0.0.1:1"} {
		testNATSURLRefused(t, url)
	}
}

func testNATSURLRefused(t *testing.T, url string) {
	t.Helper()
	for _, args := range [][]string{
		{"lock", "acquire", "k", "--nats", url},
		{"lock", "release", "k", "--token", "1", "--nats", url},
		{"lock", "get", "k", "--nats", url},
		{"lock", "renew", "k", "1", "--nats", url},
		{"lock", "ls", "k", "--nats", url},
		{"lock", "watch", "k", "--nats", url},
		{"lock", "exec", "k", "--nats", url, "--", "true"},
		{"status", "--nats", url},
		{"bench", "--nats", url},
		{"serve", "--nats-url", url},
	} {
		code, out, errOut := runInProcess(args...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, "password") || !strings.Contains(errOut, "TICKETD_NATS_PASSWORD") || !strings.Contains(errOut, "TICKETD_NATS_TOKEN") ||
			strings.Contains(errOut, "hunter2") {
			t.Errorf("ticketd %s: exit %d, stderr:\n%s", strings.Join(args, " "), code, errOut)
		}
	}
}

// fakeControl is a control API that records what it was sent and refuses
// everything.
type fakeControl struct {
	mu     sync.Mutex
	bearer []string
	bodies []string
}

func (f *fakeControl) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body json.RawMessage
	_ = json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.bearer = append(f.bearer, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	f.bodies = append(f.bodies, string(body))
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"fake control API"}}`))
}

func (f *fakeControl) last() (bearer, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bearer) == 0 {
		return "", ""
	}
	return f.bearer[len(f.bearer)-1], f.bodies[len(f.bodies)-1]
}

// Every command that takes --control-credential-file reads
// TICKETD_CONTROL_CREDENTIAL_FILE (and TICKETD_CONTROL_CREDENTIAL) the
// same way; admin bootstrap reads TICKETD_BOOTSTRAP_CREDENTIAL_FILE.
func TestControlCredentialFromEveryVariable(t *testing.T) {
	fake := &fakeControl{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fromFile := write("control", "control-from-env-file")
	flagFile := write("control-flag", "control-from-flag-file")
	bootFile := write("boot", "bootstrap-from-env-file")
	commands := [][]string{
		{"admin", "members"}, {"admin", "mint-join"}, {"admin", "retire", "--node", "3", "--incarnation", "1"},
		{"admin", "replace", "complete", "--old", "1", "--new", "2", "--incarnation", "1"},
		{"admin", "replace", "abort", "--old", "1", "--new", "2", "--incarnation", "1"},
		{"admin", "bootstrap"}, {"snapshot", "save", filepath.Join(dir, "backup.tkb")},
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		flags []string
		want  string
	}{
		{"TICKETD_CONTROL_CREDENTIAL_FILE", map[string]string{"TICKETD_CONTROL_CREDENTIAL_FILE": fromFile}, nil, "control-from-env-file"},
		{"TICKETD_CONTROL_CREDENTIAL", map[string]string{"TICKETD_CONTROL_CREDENTIAL": "control-from-env"}, nil, "control-from-env"},
		{"--control-credential-file", map[string]string{"TICKETD_CONTROL_CREDENTIAL_FILE": fromFile}, []string{"--control-credential-file", flagFile}, "control-from-flag-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TICKETD_BOOTSTRAP_CREDENTIAL_FILE", bootFile)
			for _, k := range []string{"TICKETD_CONTROL_CREDENTIAL", "TICKETD_CONTROL_CREDENTIAL_FILE"} {
				t.Setenv(k, tc.env[k])
			}
			for _, cmd := range commands {
				args := append(append(append([]string(nil), cmd...), "--control", srv.URL, "--timeout", "5s"), tc.flags...)
				code, _, errOut := runInProcess(args...)
				bearer, body := fake.last()
				if code != exitFailure || !strings.Contains(errOut, "unauthorized") || bearer != tc.want {
					t.Errorf("ticketd %s: exit %d, stderr %q, sent credential %q; want %q", strings.Join(args, " "), code, errOut, bearer, tc.want)
				}
				if cmd[1] == "bootstrap" && !strings.Contains(body, "bootstrap-from-env-file") {
					t.Errorf("admin bootstrap sent %s, without the bootstrap credential of TICKETD_BOOTSTRAP_CREDENTIAL_FILE", body)
				}
			}
		})
	}
}

// An admin command against an address where nothing listens fails within
// seconds (controlReachWait), naming the URL and the OS error (it used to
// wait 30 s for "context deadline exceeded").
func TestAdminUnreachableFailsFast(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL
	srv.Close()
	for _, args := range [][]string{{"admin", "members"}, {"snapshot", "save", filepath.Join(t.TempDir(), "b.tkb")}} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			args = append(args, "--control", dead, "--timeout", "30s")
			start := time.Now()
			code, _, errOut := runInProcess(args...)
			if took := time.Since(start); took > controlReachWait+5*time.Second {
				t.Errorf("ticketd %s took %v", strings.Join(args, " "), took)
			}
			host := strings.TrimPrefix(dead, "http://")
			if code != exitFailure || !strings.Contains(errOut, dead) || !strings.Contains(errOut, "dial tcp "+host+": connect: connection refused") {
				t.Errorf("ticketd %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
			}
		})
	}
}
