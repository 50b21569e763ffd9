//go:build unix

package sdk_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// BenchmarkSessionKeepAlives measures what the keepalives of many sessions
// held by one client cost, with the SDK's keepalive grid (align=20ms, the
// default) and with every keepalive sent exactly when due (align=0): one
// client holds benchSessions sessions on a one-node daemon (embedded
// NATS, fsync, the daemon's default ticks) with a TTL that makes about
// 500 keepalives a second, the rate of 10,000 sessions at a 60 s TTL.
// b.N is the number of keepalives to wait for; net-cpu-ns/op is the
// process's CPU (node and client together) per keepalive above the same
// process idle. Run it with
//
//	go test -run '^$' -bench BenchmarkSessionKeepAlives -benchtime 3000x ./sdk/
func BenchmarkSessionKeepAlives(b *testing.B) {
	const benchSessions = 500
	// interval = (TTL - TTL/10)/3 = 0.3*TTL: about one second.
	const ttl = 3400 * time.Millisecond
	def := daemon.Defaults()
	c := testcluster.New(b, 1, testcluster.WithTicks(def.TickMS, def.ElectionTicks))
	lead := c.Leader(30 * time.Second)
	testkit.Eventually(b, 30*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	idle0, idleStart := cpuTime(b), time.Now()
	time.Sleep(2 * time.Second) // a measurement window, not a wait for a condition
	idleRate := float64(cpuTime(b)-idle0) / float64(time.Since(idleStart))
	for _, align := range []time.Duration{0, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("align=%v", align), func(b *testing.B) {
			var keepalives atomic.Int64
			cl, err := sdk.Connect(c.ClientURL(lead), sdk.WithKeepAliveAlign(align), sdk.WithAttemptHook(func(op string, _ int, err error) {
				if op == protocol.SessionOpKeepAlive && err == nil {
					keepalives.Add(1)
				}
			}))
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = cl.Close() }()
			ctx := context.Background()
			sessions := make([]*sdk.Session, 0, benchSessions)
			defer func() {
				for _, s := range sessions {
					_, _ = s.Close(ctx)
				}
			}()
			for range benchSessions {
				s, err := sdk.NewSession(ctx, cl, sdk.WithSessionTTL(ttl))
				if err != nil {
					b.Fatal(err)
				}
				sessions = append(sessions, s)
			}
			b.ReportAllocs()
			k0, cpu0, start := keepalives.Load(), cpuTime(b), time.Now()
			b.ResetTimer()
			deadline := start.Add(time.Duration(b.N)*time.Second/400 + 10*time.Second)
			for keepalives.Load()-k0 < int64(b.N) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // polling the count, bounded by deadline
			}
			b.StopTimer()
			n := keepalives.Load() - k0
			if n < int64(b.N) {
				b.Fatalf("%d of %d keepalives within the deadline", n, b.N)
			}
			for _, s := range sessions {
				if err := s.Err(); err != nil {
					b.Fatalf("session %s: %v", s.ID, err)
				}
			}
			elapsed := time.Since(start)
			cpu := float64(cpuTime(b)-cpu0) - idleRate*float64(elapsed)
			b.ReportMetric(cpu/float64(n), "net-cpu-ns/op")
			b.ReportMetric(float64(n)/elapsed.Seconds(), "keepalives/s")
		})
	}
}
