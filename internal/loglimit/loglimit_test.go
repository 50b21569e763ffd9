package loglimit

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := &Limiter{Burst: 2}
	t0 := time.Unix(100, 0)
	for i, want := range []bool{true, true, false, false} {
		if ok, _ := l.Allow(t0.Add(time.Duration(i) * time.Millisecond)); ok != want {
			t.Fatalf("line %d: allowed %v, want %v", i, ok, want)
		}
	}
	ok, suppressed := l.Allow(t0.Add(time.Second))
	if !ok || suppressed != 2 {
		t.Fatalf("next second: allowed %v, suppressed %d, want true, 2", ok, suppressed)
	}
	var none *Limiter
	if ok, _ := none.Allow(t0); !ok {
		t.Fatal("a nil limiter refused a line")
	}
}

// A longer window: one line per Per, the rest counted.
func TestLimiterPer(t *testing.T) {
	l := &Limiter{Burst: 1, Per: 30 * time.Second}
	t0 := time.Unix(100, 0)
	if ok, _ := l.Allow(t0); !ok {
		t.Fatal("first line refused")
	}
	for i := 1; i < 30; i++ {
		if ok, _ := l.Allow(t0.Add(time.Duration(i) * time.Second)); ok {
			t.Fatalf("line at +%ds allowed inside the 30 s window", i)
		}
	}
	if ok, suppressed := l.Allow(t0.Add(30 * time.Second)); !ok || suppressed != 29 {
		t.Fatalf("after the window: allowed %v, suppressed %d, want true, 29", ok, suppressed)
	}
}
