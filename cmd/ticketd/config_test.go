package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
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
		{"self not in cluster", []string{"--id", "9", "--initial-cluster", "1=127.0.0.1:1,2=127.0.0.1:2", "--peer-listen", "127.0.0.1:1", "--peer-secret", "0123456789abcdef"}, nil},
		{"duplicate member", []string{"--initial-cluster", "1=127.0.0.1:1,1=127.0.0.1:2", "--peer-listen", "127.0.0.1:1", "--peer-secret", "0123456789abcdef"}, nil},
		{"stray argument", []string{"extra"}, nil},
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
