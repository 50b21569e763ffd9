package daemon_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// A password in a NATS URL appears in no log line and no error (the issue
// found it logged verbatim at INFO).
func TestNATSURLPasswordRedacted(t *testing.T) {
	const password = "url-password-s3cret"
	ns := testkit.NATSServer(t, func(o *server.Options) { o.Username, o.Password = "ticketd", password })
	host := strings.TrimPrefix(ns.ClientURL(), "nats://")
	log, logs := testkit.CaptureLogger()
	cfg := daemon.Defaults()
	cfg.Data = filepath.Join(t.TempDir(), "data")
	cfg.NATSURL = "nats://ticketd:" + password + "@" + host
	cfg.NoSync = true
	d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if out := logs.String(); strings.Contains(out, password) || !strings.Contains(out, "REDACTED") {
		t.Fatalf("logs hold the password or no redacted URL:\n%s", out)
	}
	cfg.Data = filepath.Join(t.TempDir(), "data2")
	cfg.NATSURL = "nats://ticketd:wrong-" + password + "@" + host
	if _, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()}); err == nil || strings.Contains(err.Error(), password) {
		t.Fatalf("start with a wrong password: %v", err)
	}
}
