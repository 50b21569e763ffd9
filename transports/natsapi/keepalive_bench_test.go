package natsapi_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// BenchmarkSessionKeepAlive measures one session keepalive end to end on a
// real one-node daemon (embedded NATS, natsapi, lockservice, raftstore
// with fsync; the daemon's default ticks): a plain nats.go client keeps
// benchSessions open sessions alive in turn, with inflight requests
// outstanding at a time. inflight=1 is a keepalive at a time, as at a low
// rate; inflight=32 lets the node batch; paced=500/s sends one every 2 ms
// without waiting for the replies, as many clients at the rate of the
// issue 24 figure (10,000 sessions, TTL 60 s).
//
// Besides ns/op (wall) it reports cpu-ns/op, the process's CPU per
// keepalive (getrusage; node and client share the process, and the
// client's part is the same before and after a change of the node's), and
// allocs/op of the whole process. Run it with
//
//	go test -run '^$' -bench BenchmarkSessionKeepAlive -benchtime 5000x ./transports/natsapi/
//
// and -cpuprofile to see where the node spends it.
func BenchmarkSessionKeepAlive(b *testing.B) {
	const benchSessions = 256
	def := daemon.Defaults()
	c := testcluster.New(b, 1, testcluster.WithTicks(def.TickMS, def.ElectionTicks))
	lead := c.Leader(30 * time.Second)
	testkit.Eventually(b, 30*time.Second, "a settled leader", func() bool { return testcluster.Settled(c.Node(lead)) })
	nc := testkit.Connect(b, c.ClientURL(lead))
	testkit.Eventually(b, 10*time.Second, "the session subjects served", func() bool {
		_, err := nc.Request(protocol.SessionSubject(protocol.SessionOpKeepAlive), []byte(`{"session":"1"}`), 5*time.Second)
		return !errors.Is(err, nats.ErrNoResponders)
	})
	bodies := make([][]byte, benchSessions)
	for i := range bodies {
		m, err := nc.Request(protocol.SessionSubject(protocol.SessionOpOpen), []byte(`{"ttl_ms":60000}`), 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		var r protocol.SessionOpenReply
		if err := protocol.ParseReply(m.Data, &r); err != nil {
			b.Fatal(err)
		}
		bodies[i] = fmt.Appendf(nil, `{"session":%q}`, r.Session)
	}
	subject := protocol.SessionSubject(protocol.SessionOpKeepAlive)
	// The process's CPU per second with the sessions open and nothing
	// sent (the node's ticks and timers), measured over a fixed window:
	// the paced runs subtract it.
	idle0, idleStart := processCPU(b), time.Now()
	time.Sleep(2 * time.Second) // a measurement window, not a wait for a condition
	idleRate := float64(processCPU(b)-idle0) / float64(time.Since(idleStart))
	b.Run("paced=500/s", func(b *testing.B) {
		pacedKeepAlives(b, nc, subject, bodies, 2*time.Millisecond, idleRate)
	})
	for _, inflight := range []int{1, 32} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			var next atomic.Int64
			var failed atomic.Pointer[error]
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := 0; w < inflight; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) || failed.Load() != nil {
							return
						}
						m, err := nc.Request(subject, bodies[i%int64(len(bodies))], 5*time.Second)
						if err == nil {
							var r protocol.SessionKeepAliveReply
							err = protocol.ParseReply(m.Data, &r)
						}
						if err != nil {
							failed.CompareAndSwap(nil, &err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if p := failed.Load(); p != nil {
				b.Fatal(*p)
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// pacedKeepAlives sends b.N keepalives open-loop, one every interval (as
// many clients' keepalives arrive at a node), and reports the process's
// CPU per keepalive above idleRate (CPU per second of wall time with
// nothing sent) as net-cpu-ns/op.
func pacedKeepAlives(b *testing.B, nc *nats.Conn, subject string, bodies [][]byte, interval time.Duration, idleRate float64) {
	inbox := nc.NewRespInbox()
	var answered, failed atomic.Int64
	var firstErr atomic.Pointer[error]
	sub, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
		var r protocol.SessionKeepAliveReply
		if err := protocol.ParseReply(m.Data, &r); err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}
		answered.Add(1)
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	replies := make([]string, len(bodies))
	for i := range replies {
		replies[i] = fmt.Sprintf("%s.%d", inbox, i)
	}
	b.ReportAllocs()
	cpu0, start := processCPU(b), time.Now()
	b.ResetTimer()
	t := time.NewTicker(interval)
	for i := 0; i < b.N; i++ {
		<-t.C
		if err := nc.PublishRequest(subject, replies[i%len(replies)], bodies[i%len(bodies)]); err != nil {
			b.Fatal(err)
		}
	}
	t.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for answered.Load() < int64(b.N) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling the count, bounded by deadline
	}
	b.StopTimer()
	if n := answered.Load(); n < int64(b.N) {
		b.Fatalf("%d of %d keepalives answered", n, b.N)
	}
	if p := firstErr.Load(); p != nil {
		b.Fatalf("%d keepalives failed: %v", failed.Load(), *p)
	}
	cpu := float64(processCPU(b)-cpu0) - idleRate*float64(time.Since(start))
	b.ReportMetric(cpu/float64(b.N), "net-cpu-ns/op")
}

// processCPU is this process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
