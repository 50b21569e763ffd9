package secure_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// BenchmarkAcquireRelease compares one acquire+release cycle, fsync on,
// against an open node (plain TCP, no authentication, no access list) and
// against this example (TLS, nkey users, accounts and a service import,
// the access list), in the same run:
//
//	go test -run '^$' -bench AcquireRelease -benchtime 5s ./examples/secure
func BenchmarkAcquireRelease(b *testing.B) {
	b.Run("open", func(b *testing.B) {
		cfg := daemon.Defaults()
		cfg.Data = filepath.Join(b.TempDir(), "data")
		cfg.NATSListen = testkit.FreeAddr(b)
		cfg.TickMS, cfg.ElectionTicks = testkit.TickMS, testkit.ElectionTicks
		d, err := daemon.Start(context.Background(), cfg, daemon.Options{Logger: testkit.QuietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		testkit.Eventually(b, 10*time.Second, "a leader", func() bool { return d.Ready() == nil && d.Locks().IsLeader() })
		cycles(b, func() *sdk.Client {
			c, err := sdk.Connect(d.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			return c
		})
	})
	b.Run("tls+auth+acl", func(b *testing.B) {
		n := start(b, func(c *daemon.Config) { c.NoSync, c.AuditStream = false, "" })
		defer n.d.Close()
		cycles(b, func() *sdk.Client { return n.client(b, "alice") })
	})
}

// cycles runs acquire+release cycles from 8 clients per GOMAXPROCS, each
// on its own keys under a/ (which the access list lets alice touch).
func cycles(b *testing.B, connect func() *sdk.Client) {
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := connect()
		defer c.Close()
		ctx := context.Background()
		id, i := next.Add(1), 0
		for pb.Next() {
			key := fmt.Sprintf("a/bench/%d/%d", id, i%64)
			i++
			l, err := c.Acquire(ctx, key, sdk.WithLease(10*time.Second))
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
