package faults

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// TestLeaseClockOnlyTimesLeases: a node whose lease clock
// (daemon.Options.Now) is 3s behind real time, as after a backward jump of
// the fault run, must still let an acquire wait in the queue for the wait
// it asked for. Regression test: natsapi used to stamp requests with the
// lease clock and turn the stamp into a real-time context deadline
// (already past), so the wait ended at once with "timeout: request
// abandoned while waiting", and a follower answered every forwarded
// acquire with indeterminate without waiting for the leader (fixed in
// be9c3bb, found by the clock-jump fault).
func TestLeaseClockOnlyTimesLeases(t *testing.T) {
	c, err := startInProcess(t, 1, testkit.QuietLogger(), 20, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if !waitLeader(c, 10*time.Second) {
		t.Fatal("single node did not lead")
	}
	_ = c.jump(0, -3*time.Second)
	cl, err := connectClient(c.clientURLs())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cl.Acquire(ctx, "bug/clock", sdk.WithLease(time.Minute)); err != nil {
		t.Fatal(err)
	}
	const wait = 800 * time.Millisecond
	start := time.Now()
	_, err = cl.Acquire(ctx, "bug/clock", sdk.WithLease(time.Second), sdk.WithWait(wait))
	took := time.Since(start)
	if !errors.Is(err, sdk.ErrTimeout) {
		t.Fatalf("acquire of a held key with a wait: %v, want timeout", err)
	}
	if took < wait/2 {
		t.Fatalf("the wait of %v ended after %v: %v", wait, took, err)
	}
}
