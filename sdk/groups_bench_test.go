//go:build unix

package sdk_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// BenchmarkPartitionMapping measures what the partition mapping of a
// partitioned deployment (docs/scaling.md) adds to one request: a NATS
// request-reply round trip through an embedded nats-server to an echoing
// responder, sent on the classic subject to a server without mappings,
// and on the key's hashed subject (protocol.KeyedSubject, computed per
// request) to a server whose configuration holds
// protocol.PartitionMapping, which rewrites it to the group's subject the
// responder listens on. Everything runs in this process, so cpu-ns/op
// (the process's user+system CPU per request) holds the server's, the
// requester's and the responder's work: the difference between the two
// is the mapping's whole cost, with the hashing of the key. Run:
//
//	go test -run '^$' -bench PartitionMapping -benchtime 20000x -count 5 ./sdk
func BenchmarkPartitionMapping(b *testing.B) {
	const groups = 8
	src, dest := protocol.PartitionMapping(groups)
	key := "tenant-3/orders/1234567"
	body := fmt.Appendf(nil, `{"key":%q,"owner":"worker-1","lease_ms":10000}`, key)
	reply := []byte(`{"key":"tenant-3/orders/1234567","token":42,"owner":"worker-1","lease_ms":10000,"index":99}`)
	for _, c := range []struct {
		name, conf, listen string
		subject            func() string
	}{
		{"classic", "listen: 127.0.0.1:-1\n", protocol.SubjectAcquire, func() string { return protocol.SubjectAcquire }},
		{"mapped", fmt.Sprintf("listen: 127.0.0.1:-1\nmappings { %q: %q }\n", src, dest),
			protocol.GroupSubject(protocol.GroupOf(key, groups), "acquire"), func() string { return protocol.KeyedSubject(key, "acquire") }},
	} {
		// request: one request-reply round trip per op, as a lock
		// operation makes.
		b.Run("request/"+c.name, func(b *testing.B) {
			ns := testkit.NATSServerFromConfig(b, c.conf)
			server := testkit.Connect(b, ns.ClientURL())
			if _, err := server.Subscribe(c.listen, func(m *nats.Msg) { _ = m.Respond(reply) }); err != nil {
				b.Fatal(err)
			}
			if err := server.Flush(); err != nil {
				b.Fatal(err)
			}
			client := testkit.Connect(b, ns.ClientURL())
			if _, err := client.Request(c.subject(), body, 5*time.Second); err != nil {
				b.Fatalf("the request does not reach the responder: %v", err)
			}
			before := cpuTime(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := client.Request(c.subject(), body, 5*time.Second); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
		// publish: messages without replies, back to back, so the
		// server's per-message work (where the mapping runs) is not
		// hidden under a round trip's waits.
		b.Run("publish/"+c.name, func(b *testing.B) {
			ns := testkit.NATSServerFromConfig(b, c.conf)
			sub := testkit.Connect(b, ns.ClientURL())
			got := make(chan struct{}, 1)
			var n int
			s, err := sub.Subscribe(c.listen, func(*nats.Msg) {
				if n++; n == b.N {
					got <- struct{}{}
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.SetPendingLimits(-1, -1); err != nil {
				b.Fatal(err)
			}
			if err := sub.Flush(); err != nil {
				b.Fatal(err)
			}
			pub := testkit.Connect(b, ns.ClientURL())
			before := cpuTime(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := pub.Publish(c.subject(), body); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-got:
			case <-time.After(time.Minute):
				b.Fatalf("%d of %d messages arrived", n, b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime(b)-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkPartitionTransform is the mapping's own work per message, as
// nats-server's subject transform does it (without the account's lookup
// of which mapping applies), next to the client's hashing of the key.
func BenchmarkPartitionTransform(b *testing.B) {
	src, dest := protocol.PartitionMapping(8)
	tr, err := natsserver.NewSubjectTransform(src, dest)
	if err != nil {
		b.Fatal(err)
	}
	subject := protocol.KeyedSubject("tenant-3/orders/1234567", "acquire")
	b.Run("server-transform", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := tr.Match(subject); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("client-keyed-subject", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_ = protocol.KeyedSubject("tenant-3/orders/1234567", "acquire")
		}
	})
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
