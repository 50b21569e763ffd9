package daemon_test

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestRenewFigures (opt-in, TICKETD_FIGURES=1) measures on a three-node
// in-process cluster with fsync on, in one run: the latency of renew
// (p50/p99 of 1000 sequential renews of one lock), and the throughput of
// acquire+release cycles by 8 concurrent clients without and with one
// renew per cycle (3 s each, alternated twice).
//
//	TICKETD_FIGURES=1 go test -run TestRenewFigures -v ./daemon/
func TestRenewFigures(t *testing.T) {
	if os.Getenv("TICKETD_FIGURES") == "" {
		t.Skip("opt-in measurement: TICKETD_FIGURES=1")
	}
	c := testcluster.New(t, 3)
	lead := c.Leader(10 * time.Second)
	testkit.Eventually(t, 10*time.Second, "cluster settled", func() bool { return testcluster.Settled(c.Node(lead)) })
	url := c.ClientURL(lead)
	nc := testkit.Connect(t, url)
	var g protocol.AcquireReply
	if e := rawRequest(t, nc, protocol.SubjectAcquire, `{"key":"figures/renew","lease_ms":60000}`, &g); e != nil {
		t.Fatal(e)
	}
	body := []byte(fmt.Sprintf(`{"key":"figures/renew","token":%d}`, g.Token))
	var lat []time.Duration
	for i := 0; i < 1000; i++ {
		start := time.Now()
		if e := rawRequest(t, nc, protocol.SubjectRenew, string(body), &protocol.RenewReply{}); e != nil {
			t.Fatal(e)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("renew latency over %d renews: p50 %v, p99 %v", len(lat), lat[len(lat)/2], lat[len(lat)*99/100])

	const clients = 8
	conns := make([]*nats.Conn, clients)
	for i := range conns {
		conns[i] = testkit.Connect(t, url)
	}
	for round := 0; round < 2; round++ {
		for _, withRenew := range []bool{false, true} {
			n := cycles(t, conns, withRenew, 3*time.Second)
			t.Logf("round %d, renew per cycle %-5v: %d cycles in 3s = %.0f cycles/s", round+1, withRenew, n, float64(n)/3)
		}
	}
}

// cycles runs acquire(+renew)+release loops on each connection for d and
// returns how many cycles completed.
func cycles(t *testing.T, conns []*nats.Conn, withRenew bool, d time.Duration) int64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for i, nc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("figures/%d", i)
			for time.Now().Before(stop) {
				var g protocol.AcquireReply
				if e := rawRequest(t, nc, protocol.SubjectAcquire, fmt.Sprintf(`{"key":%q,"lease_ms":10000}`, key), &g); e != nil {
					t.Error(e)
					return
				}
				if withRenew {
					if e := rawRequest(t, nc, protocol.SubjectRenew, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.RenewReply{}); e != nil {
						t.Error(e)
						return
					}
				}
				if e := rawRequest(t, nc, protocol.SubjectRelease, fmt.Sprintf(`{"key":%q,"token":%d}`, key, g.Token), &protocol.ReleaseReply{}); e != nil {
					t.Error(e)
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	return total.Load()
}
