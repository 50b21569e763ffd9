package daemon

import (
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
)

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 64 * mib, 100},
		{10 * mib, 64 * mib, 100},
		{64 * mib, 64 * mib, 100},
		{128 * mib, 64 * mib, 50},
		{150 * mib, 64 * mib, 42},
		{640 * mib, 64 * mib, 10},
		{4096 * mib, 64 * mib, minGCPercent},
	} {
		if got := gcPercentFor(c.live, c.headroom); got != c.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", c.live/mib, c.headroom/mib, got, c.want)
		}
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestTuneGCFollowsTheLiveHeap: with 48 MiB live and 16 MiB of headroom
// GOGC goes to about 33, and back to what it was when the tuning stops.
func TestTuneGCFollowsTheLiveHeap(t *testing.T) {
	t.Setenv("GOGC", "") // the variable set would turn the tuning off
	before := gogc()
	live := make([]byte, 48<<20)
	for i := range live {
		live[i] = byte(i)
	}
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tuneGC(ctx, 10*time.Millisecond, 16<<20) }()
	testkit.Eventually(t, 10*time.Second, "GOGC lowered for the live heap", func() bool {
		runtime.GC()
		return gogc() < 50
	})
	cancel()
	<-done
	runtime.KeepAlive(live)
	if got := gogc(); got != before {
		t.Fatalf("GOGC %d after the tuning stopped, was %d", got, before)
	}
}
