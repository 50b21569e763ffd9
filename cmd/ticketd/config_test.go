package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/daemon"
)

func TestLoadConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ticketd.yaml")
	if err := os.WriteFile(file, []byte("id: 3\ndata: /from/file\nnats-listen: 127.0.0.1:5000\ntick-ms: 50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"TICKETD_DATA=/from/env", "TICKETD_LOG_LEVEL=debug", "HOME=/x"}
	cfg, err := loadConfig([]string{"--config", file, "--nats-listen", "127.0.0.1:6000"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ID != 3 || cfg.TickMS != 50 {
		t.Errorf("file values lost: %+v", cfg)
	}
	if cfg.Data != "/from/env" || cfg.LogLevel != "debug" {
		t.Errorf("env did not override file: %+v", cfg)
	}
	if cfg.NATSListen != "127.0.0.1:6000" {
		t.Errorf("flag did not override file: %q", cfg.NATSListen)
	}
	if cfg.ElectionTicks != daemon.Defaults().ElectionTicks {
		t.Errorf("default lost: %+v", cfg)
	}
}

func TestLoadConfigRejects(t *testing.T) {
	dir := t.TempDir()
	typo := filepath.Join(dir, "typo.yaml")
	_ = os.WriteFile(typo, []byte("nats-lisen: 127.0.0.1:1\n"), 0o600)
	secretFile := filepath.Join(dir, "secret")
	_ = os.WriteFile(secretFile, []byte("a-secret-from-a-file-0123\n"), 0o600)
	cases := []struct {
		name string
		args []string
		env  []string
	}{
		{"unknown file key", []string{"--config", typo}, nil},
		{"unknown env key", nil, []string{"TICKETD_NO_SUCH=1"}},
		{"missing file", []string{"--config", filepath.Join(dir, "absent.yaml")}, nil},
		{"id zero", []string{"--id", "0"}, nil},
		{"bad tick", []string{"--tick-ms", "-1"}, nil},
		{"election below heartbeat", []string{"--election-ticks", "1", "--heartbeat-ticks", "1"}, nil},
		{"bad log level", []string{"--log-level", "loud"}, nil},
		{"bad listen", []string{"--nats-listen", "nowhere"}, nil},
		{"cluster without secret", []string{"--initial-cluster", "1=127.0.0.1:1,2=127.0.0.1:2", "--peer-listen", "127.0.0.1:1"}, nil},
		{"self not in cluster", []string{"--id", "9", "--initial-cluster", "1=127.0.0.1:1,2=127.0.0.1:2", "--peer-listen", "127.0.0.1:1"}, []string{"TICKETD_PEER_SECRET=0123456789abcdef"}},
		{"duplicate member", []string{"--initial-cluster", "1=127.0.0.1:1,1=127.0.0.1:2", "--peer-listen", "127.0.0.1:1"}, []string{"TICKETD_PEER_SECRET=0123456789abcdef"}},
		{"password in nats-url", []string{"--nats-url", "nats://u:p4ss@127.0.0.1:4222"}, nil},
		{"password in TICKETD_NATS_URL", nil, []string{"TICKETD_NATS_URL=nats://u:p4ss@127.0.0.1:4222"}},
		{"token in nats-url", []string{"--nats-url", "nats://t0ken@127.0.0.1:4222"}, nil},
		{"token and user", []string{"--nats-url", "nats://127.0.0.1:4222", "--nats-user", "u"}, []string{"TICKETD_NATS_TOKEN=t0ken", "TICKETD_NATS_PASSWORD=p"}},
		{"pprof off loopback", []string{"--pprof", "--metrics-listen", "0.0.0.0:9090"}, nil},
		{"stray argument", []string{"extra"}, nil},
		{"control off loopback without TLS", []string{"--control-listen", "0.0.0.0:7100"}, nil},
		{"control on all interfaces without TLS", []string{"--control-listen", ":7100"}, nil},
		{"short control credential", nil, []string{"TICKETD_CONTROL_CREDENTIAL=short"}},
		{"short bootstrap credential", nil, []string{"TICKETD_BOOTSTRAP_CREDENTIAL=0123456789abcde"}},
		{"control TLS cert without key", []string{"--control-tls-cert", "c.pem"}, nil},
		{"nats-config with nats-url", []string{"--nats-config", "n.conf", "--nats-url", "nats://h:4222"}, nil},
		{"nats-config with routes", []string{"--nats-config", "n.conf", "--nats-routes", "127.0.0.1:6222"}, nil},
		{"acl on an open embedded NATS", []string{"--acl", "acl.yaml"}, nil},
		{"two NATS credentials", []string{"--nats-user", "u", "--nats-creds", "c.creds"}, nil},
		{"secret and its file disagree", []string{"--peer-secret-file", secretFile}, []string{"TICKETD_PEER_SECRET=another-secret-0123456789"}},
		{"missing secret file", []string{"--control-credential-file", filepath.Join(dir, "absent")}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(tc.args, tc.env, io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, daemon.ErrConfig) {
				t.Fatalf("error %v is not daemon.ErrConfig", err)
			}
		})
	}
}

// Secrets come from files or the environment; the file's trailing newline
// is not part of the secret.
func TestLoadConfigSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := loadConfig([]string{
		"--peer-secret-file", write("peer", "peer-secret-0123456789"),
		"--control-credential-file", write("control", "control-credential-0123"),
		"--nats-user", "ticketd", "--nats-password-file", write("nats", "nats-password"), "--peer-listen", "127.0.0.1:7001",
	}, []string{"TICKETD_BOOTSTRAP_CREDENTIAL=bootstrap-credential-0123"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PeerSecret != "peer-secret-0123456789" || cfg.ControlCredential != "control-credential-0123" ||
		cfg.NATSPassword != "nats-password" || cfg.BootstrapCredential != "bootstrap-credential-0123" {
		t.Fatalf("secrets not loaded: %+v", cfg)
	}
	cfg, err = loadConfig([]string{"--nats-user", "ticketd"}, []string{"TICKETD_NATS_PASSWORD=from-env"}, io.Discard)
	if err != nil || cfg.NATSPassword != "from-env" {
		t.Fatalf("password from the environment: %q, %v", cfg.NATSPassword, err)
	}
}

// An unknown key is named where it came from, so that a stray TICKETD_*
// variable (a test's or a script's) is recognisable as one.
func TestLoadConfigNamesWhereAnUnknownKeyCameFrom(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ticketd.yaml")
	_ = os.WriteFile(file, []byte("data: d1\nlog-levle: debug\n"), 0o600)
	cases := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"unknown variable", nil, []string{"TICKETD_BENCH_BIN=/tmp/x", "TICKETD_LOG_LEVEL=debug"},
			[]string{"unknown keys TICKETD_BENCH_BIN in the environment", "unset it"}},
		{"two unknown variables", nil, []string{"TICKETD_BIG=1", "TICKETD_FIGURES=1"},
			[]string{"unknown keys TICKETD_BIG, TICKETD_FIGURES in the environment"}},
		{"unknown key in the file", []string{"--config", file}, nil,
			[]string{"unknown keys log-levle (in " + file + ")"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(tc.args, tc.env, io.Discard)
			if !errors.Is(err, daemon.ErrConfig) {
				t.Fatalf("error %v, want daemon.ErrConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
