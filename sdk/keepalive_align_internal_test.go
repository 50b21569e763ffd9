package sdk

import (
	"testing"
	"time"
)

// TestKeepAliveAlign: a session keepalive is sent on the client's grid:
// never after it is due, less than one grid step (at most a twentieth of
// the interval) before, and keepalives due within one step of each other
// go out at the same moment. With no grid, or a due time before the
// client existed, it goes out exactly when due.
func TestKeepAliveAlign(t *testing.T) {
	start := time.Now()
	aligned := &Client{cfg: config{keepAliveAlign: keepAliveAlign}, epoch: start}
	exact := &Client{cfg: config{keepAliveAlign: 0}, epoch: start}
	for _, tc := range []struct {
		interval time.Duration
		step     time.Duration // the grid's step: a keepalive goes less than it early
	}{
		{19700 * time.Millisecond, 20 * time.Millisecond}, // TTL 60 s
		{2700 * time.Millisecond, 20 * time.Millisecond},  // TTL 10 s
		{300 * time.Millisecond, 15 * time.Millisecond},   // TTL 1 s
		{19 * time.Millisecond, 950 * time.Microsecond},
		{10, 0}, // a step under 1 ns: none
	} {
		moments := map[time.Time]int{}
		span := 10 * tc.step
		if span == 0 {
			span = time.Millisecond
		}
		for off := time.Duration(0); off < span; off += 37 * time.Microsecond {
			next := start.Add(time.Second + off)
			got := aligned.alignKeepAlive(next, tc.interval)
			if got.After(next) {
				t.Fatalf("interval %v: due at %v, sent %v later", tc.interval, next.Sub(start), got.Sub(next))
			}
			if early := next.Sub(got); early >= max(tc.step, 1) {
				t.Fatalf("interval %v: sent %v early, the step is %v", tc.interval, early, tc.step)
			}
			moments[got]++
			if e := exact.alignKeepAlive(next, tc.interval); !e.Equal(next) {
				t.Fatalf("no grid: due at %v, sent at %v", next.Sub(start), e.Sub(start))
			}
		}
		if tc.step > 0 && len(moments) > 11 {
			t.Fatalf("interval %v: keepalives due over 10 steps went out at %d moments", tc.interval, len(moments))
		}
	}
	before := start.Add(-time.Hour)
	if got := aligned.alignKeepAlive(before, 19700*time.Millisecond); !got.Equal(before) {
		t.Fatalf("due before the client existed: sent %v early", before.Sub(got))
	}
}
