package core_test

import (
	"fmt"
	"testing"

	"github.com/ticketd/ticketd/core"
)

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/lock/%08d", i)
	}
	return keys
}

// BenchmarkApplyGrantRelease measures one Grant plus the Release of the
// token it issued, cycling over 4096 keys.
func BenchmarkApplyGrantRelease(b *testing.B) {
	keys := benchKeys(4096)
	m := core.NewMachine()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		r := m.Apply(core.Grant(k, "owner", lease, uint64(i)))
		if m.Apply(core.Release(k, r.Token)).Kind != core.ResultReleased {
			b.Fatal("release failed")
		}
		i++
	}
}

// BenchmarkApplyGrantReleaseRequestID is BenchmarkApplyGrantRelease at
// cluster version 3 with a request id on every Grant (as the SDK sends):
// each release moves a record to the ended FIFO, and the clock (10 ms per
// grant) passes the retention, so records are pruned as fast as they end.
func BenchmarkApplyGrantReleaseRequestID(b *testing.B) {
	keys := benchKeys(4096)
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = fmt.Sprintf("req-%016x", i)
	}
	m := core.NewMachine()
	m.Apply(core.SetClusterVersion(3))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		r := m.Apply(core.Grant(k, "owner", lease, 10*uint64(i)).WithRequest("ACCOUNT/user", ids[i%len(ids)]))
		if m.Apply(core.Release(k, r.Token)).Kind != core.ResultReleased {
			b.Fatalf("release failed after %v", r)
		}
		i++
	}
	b.ReportMetric(float64(m.RequestRecords()), "records")
}

// BenchmarkApplyGrant measures Grants of distinct keys into a growing
// table. Keys are precomputed; every 1<<16 grants the table starts over,
// so map growth is part of the figure.
func BenchmarkApplyGrant(b *testing.B) {
	keys := benchKeys(1 << 16)
	m := core.NewMachine()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(keys) {
			m, i = core.NewMachine(), 0
		}
		if m.Apply(core.Grant(keys[i], "owner", lease, 0)).Kind != core.ResultGranted {
			b.Fatal("grant failed")
		}
		i++
	}
}

// BenchmarkEncodeDecodeEntry measures one EncodeEntry plus DecodeEntry of a
// typical Grant.
func BenchmarkEncodeDecodeEntry(b *testing.B) {
	e := core.Entry{RequestID: 123456789, Command: core.Grant("tenant-42/orders/checkout", "worker-7f3a", lease, 1_733_000_000_000)}
	b.SetBytes(int64(len(core.EncodeEntry(e))))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := core.DecodeEntry(core.EncodeEntry(e)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot10k measures Snapshot plus Restore of 10k locks.
func BenchmarkSnapshot10k(b *testing.B) {
	src := core.NewMachine()
	for _, k := range benchKeys(10_000) {
		src.Apply(core.Grant(k, "owner", lease, 1_733_000_000_000))
	}
	dst := core.NewMachine()
	b.SetBytes(int64(len(src.Snapshot())))
	b.ReportAllocs()
	for b.Loop() {
		if err := dst.Restore(src.Snapshot()); err != nil {
			b.Fatal(err)
		}
	}
	if dst.Digest() != src.Digest() {
		b.Fatal("restored state differs")
	}
}

// BenchmarkApplyKinds measures one Grant plus the Release of the token it
// issued on keys that already have holders-1 other holders (cluster
// version 5), cycling over 64 keys: the cost of a multi-holder key next
// to BenchmarkApplyGrantRelease's mutex.
func BenchmarkApplyKinds(b *testing.B) {
	for _, tc := range []struct {
		name    string
		limit   uint32
		mode    core.Mode
		holders int
	}{
		{"semaphore/limit=4/held=3", 4, core.ModeExclusive, 4},
		{"semaphore/limit=1024/held=1023", core.MaxSemaphoreLimit, core.ModeExclusive, core.MaxSemaphoreLimit},
		{"shared/held=15", 0, core.ModeShared, 16},
	} {
		b.Run(tc.name, func(b *testing.B) {
			keys := benchKeys(64)
			m := core.NewMachine()
			m.Apply(core.SetClusterVersion(5))
			for _, k := range keys {
				for range tc.holders - 1 {
					m.Apply(core.Grant(k, "owner", lease, 0).WithKind(tc.limit, tc.mode))
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := keys[i%len(keys)]
				r := m.Apply(core.Grant(k, "owner", lease, uint64(i)).WithKind(tc.limit, tc.mode))
				if m.Apply(core.Release(k, r.Token)).Kind != core.ResultReleased {
					b.Fatalf("release failed after %v", r)
				}
				i++
			}
		})
	}
}
