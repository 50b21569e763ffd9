package daemon_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// A password or a token in a NATS URL is refused at start, without
// repeating it; a token given as nats-token (TICKETD_NATS_TOKEN or
// nats-token-file) authenticates and appears in no log line and no error.
func TestNATSURLPasswordRedacted(t *testing.T) {
	const password = "url-password-s3cret"
	cfg := daemon.Defaults()
	cfg.Data = filepath.Join(t.TempDir(), "data")
	cfg.NATSURL = "nats://ticketd:" + password + "@127.0.0.1:4222"
	cfg.NoSync = true
	if _, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()}); !errors.Is(err, daemon.ErrConfig) || strings.Contains(err.Error(), password) {
		t.Fatalf("start with a password in nats-url: %v, want a config refusal without the password", err)
	}

	const token = "url-token-s3cret"
	ns := testkit.NATSServer(t, func(o *server.Options) { o.Authorization = token })
	host := strings.TrimPrefix(ns.ClientURL(), "nats://")
	cfg.NATSURL = "nats://" + token + "@" + host
	if _, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()}); !errors.Is(err, daemon.ErrConfig) || strings.Contains(err.Error(), token) {
		t.Fatalf("start with a token in nats-url: %v, want a config refusal without the token", err)
	}
	log, logs := testkit.CaptureLogger()
	cfg.NATSURL, cfg.NATSToken = ns.ClientURL(), token
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if out := logs.String(); strings.Contains(out, token) {
		t.Fatalf("logs hold the token:\n%s", out)
	}
	cfg.Data = filepath.Join(t.TempDir(), "data2")
	cfg.NATSToken = "wrong-" + token
	if _, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()}); err == nil || strings.Contains(err.Error(), token) {
		t.Fatalf("start with a wrong token: %v", err)
	}
}
