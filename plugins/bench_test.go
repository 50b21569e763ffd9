package plugins

import (
	"context"
	"testing"
	"time"
)

// benchConfig lengthens the call deadline: a benchmark measures cost, and
// on a loaded machine a wall-clock deadline of 50ms can fire.
var benchConfig = Config{CallTimeout: 10 * time.Second, InitTimeout: time.Minute}

// BenchmarkValidateGrant is the cost of one policy call on a warm pooled
// instance of the ownerprefix example: encode, copy in, run the guest
// (decode, decide, encode), copy out, decode.
func BenchmarkValidateGrant(b *testing.B) {
	p := load(b, "ownerprefix", benchConfig)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		v, err := p.ValidateGrant(ctx, Grant{Key: "payments/invoice-7", Owner: "svc-payments-api-1", Identity: "", LeaseMS: 1000})
		if err != nil || !v.Allow {
			b.Fatal(v, err)
		}
	}
}

// BenchmarkValidateGrantParallel runs the same call from GOMAXPROCS
// goroutines against the pool.
func BenchmarkValidateGrantParallel(b *testing.B) {
	p := load(b, "ownerprefix", benchConfig)
	b.ReportAllocs()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			v, err := p.ValidateGrant(ctx, Grant{Key: "payments/invoice-7", Owner: "intruder", Identity: "", LeaseMS: 1000})
			if err != nil || v.Allow {
				b.Fatal(v, err)
			}
		}
	})
}

// BenchmarkOnApplied is the cost of one audit call on the audit example.
func BenchmarkOnApplied(b *testing.B) {
	p := load(b, "audit", benchConfig)
	cmd, res := grantFixture()
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if evs, err := p.OnApplied(ctx, 7, cmd, res); err != nil || len(evs) != 1 {
			b.Fatal(evs, err)
		}
	}
}

// BenchmarkInstantiate is what a fresh instance costs (instantiate and run
// a Go guest's _initialize): the price an instance-per-call design would
// pay on every call, and what the pool pays after a trap.
func BenchmarkInstantiate(b *testing.B) {
	p := load(b, "ownerprefix", benchConfig)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		inst, err := p.instantiate(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = inst.mod.Close(context.Background())
	}
}
