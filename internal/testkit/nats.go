package testkit

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// natsReadyTimeout bounds how long NATSServer waits for the server to
// accept connections.
const natsReadyTimeout = 10 * time.Second

// NATSServer starts an embedded nats-server on a random 127.0.0.1 port,
// with no logging and no signal handlers, and shuts it down at cleanup.
// Each tweak may change the options first (a fixed Port to restart a
// server where its clients expect it, JetStream with a StoreDir).
func NATSServer(t testing.TB, tweaks ...func(*server.Options)) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true}
	for _, f := range tweaks {
		f(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(natsReadyTimeout) {
		s.Shutdown()
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// Connect connects to url and closes the connection at cleanup.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
