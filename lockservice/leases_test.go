package lockservice

import (
	"testing"
	"time"
)

func TestLeaseHeapNeverShortens(t *testing.T) {
	h := newLeaseHeap()
	t0 := time.Unix(1000, 0)
	h.arm("k", 7, "", 10*time.Second, t0)
	// Re-arming the same token earlier (a new leader with a slower view)
	// must not pull the deadline in.
	h.arm("k", 7, "", 10*time.Second, t0.Add(-5*time.Second))
	if it, _ := h.get("k"); !it.deadline.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("deadline moved earlier: %v", it.deadline)
	}
	// Re-arming later extends it.
	h.arm("k", 7, "", 10*time.Second, t0.Add(3*time.Second))
	if it, _ := h.get("k"); !it.deadline.Equal(t0.Add(13 * time.Second)) {
		t.Fatalf("deadline not extended: %v", it.deadline)
	}
	// A new token replaces the old timer.
	h.arm("k", 8, "", time.Second, t0)
	if it, _ := h.get("k"); it.token != 8 || h.Len() != 1 {
		t.Fatalf("new token did not replace: %+v len %d", it, h.Len())
	}
	// Removing with a stale token does nothing.
	h.remove("k", 7)
	if _, ok := h.get("k"); !ok {
		t.Fatal("stale remove dropped the current timer")
	}
	h.remove("k", 8)
	if _, ok := h.get("k"); ok || h.Len() != 0 {
		t.Fatal("remove with the right token left a timer")
	}
}

func TestLeaseHeapDueOrderAndRetry(t *testing.T) {
	h := newLeaseHeap()
	t0 := time.Unix(1000, 0)
	for i, key := range []string{"c", "a", "d", "b"} {
		h.arm(key, uint64(i+1), "", time.Duration(i+1)*time.Second, t0)
	}
	if next, ok := h.next(); !ok || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next %v %v", next, ok)
	}
	due := h.due(t0.Add(2500*time.Millisecond), time.Second, 100)
	if len(due) != 2 || due[0].key != "c" || due[1].key != "a" {
		t.Fatalf("due %+v, want c then a", due)
	}
	// Due items are pushed back by the retry interval, not dropped: if
	// their Expire is lost they come due again.
	if again := h.due(t0.Add(2600*time.Millisecond), time.Second, 100); len(again) != 0 {
		t.Fatalf("items due again before their retry: %+v", again)
	}
	again := h.due(t0.Add(3600*time.Millisecond), time.Second, 100)
	keys := map[string]bool{}
	for _, it := range again {
		keys[it.key] = true
	}
	if !keys["c"] || !keys["a"] || !keys["d"] || keys["b"] {
		t.Fatalf("after retry interval: %+v", again)
	}
	if h.Len() != 4 {
		t.Fatalf("due removed timers: len %d", h.Len())
	}
}
