package connlimit

import (
	"fmt"
	"slices"
	"testing"
)

// admitted is a connection a test admitted, and whether it was closed.
type admitted struct {
	e      *Entry
	closed int
}

type harness struct {
	t     *testing.T
	tb    *Table
	conns map[string]*admitted
}

func newHarness(t *testing.T, l Limits) *harness {
	return &harness{t: t, tb: New(l), conns: map[string]*admitted{}}
}

// admit admits connection name from source and returns how many it
// evicted, or -1 if it was refused.
func (h *harness) admit(name, source string, reserved bool) int {
	h.t.Helper()
	a := &admitted{}
	e, evicted := h.tb.Admit(source, reserved, func() { a.closed++ })
	if e == nil {
		return -1
	}
	a.e = e
	h.conns[name] = a
	return evicted
}

// closed lists the connections closed by eviction, sorted.
func (h *harness) closed() []string {
	var out []string
	for name, a := range h.conns {
		if a.closed > 1 {
			h.t.Fatalf("%s closed %d times", name, a.closed)
		}
		if a.closed == 1 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func TestAdmit(t *testing.T) {
	type step struct {
		name, source string
		reserved     bool
		hold         bool // Hold it once admitted
		want         int  // evicted, or -1 refused
	}
	for _, tc := range []struct {
		name   string
		lim    Limits
		steps  []step
		closed []string
	}{
		{
			name:  "room",
			lim:   Limits{Total: 3, PerSource: 2},
			steps: []step{{"a1", "a", false, false, 0}, {"b1", "b", false, false, 0}, {"a2", "a", false, false, 0}},
		},
		{
			name:   "a source at its limit loses its own oldest",
			lim:    Limits{Total: 10, PerSource: 2},
			steps:  []step{{"a1", "a", false, false, 0}, {"b1", "b", false, false, 0}, {"a2", "a", false, false, 0}, {"a3", "a", false, false, 1}},
			closed: []string{"a1"},
		},
		{
			name:   "a full table loses its oldest, whatever the source",
			lim:    Limits{Total: 3, PerSource: 3},
			steps:  []step{{"a1", "a", false, false, 0}, {"b1", "b", false, false, 0}, {"c1", "c", false, false, 0}, {"d1", "d", false, false, 1}, {"e1", "e", false, false, 1}},
			closed: []string{"a1", "b1"},
		},
		{
			name:   "held connections stay; the oldest evictable goes",
			lim:    Limits{Total: 3, PerSource: 3},
			steps:  []step{{"a1", "a", false, true, 0}, {"b1", "b", false, false, 0}, {"c1", "c", false, false, 0}, {"d1", "d", false, false, 1}},
			closed: []string{"b1"},
		},
		{
			name:  "nothing evictable: refused",
			lim:   Limits{Total: 2, PerSource: 2},
			steps: []step{{"a1", "a", false, true, 0}, {"b1", "b", false, true, 0}, {"c1", "c", false, false, -1}},
		},
		{
			name:  "a source whose connections are all held is refused",
			lim:   Limits{Total: 10, PerSource: 1},
			steps: []step{{"a1", "a", false, true, 0}, {"a2", "a", false, false, -1}, {"b1", "b", false, false, 0}},
		},
		{
			name: "reserved sources are outside the total and never evicted by others",
			lim:  Limits{Total: 2, PerSource: 2},
			steps: []step{
				{"m1", "m", true, false, 0}, {"m2", "m", true, false, 0},
				{"x1", "x", false, false, 0}, {"y1", "y", false, false, 0}, {"z1", "z", false, false, 1},
				{"m3", "m", true, false, 1},
			},
			closed: []string{"m1", "x1"},
		},
		{
			name:  "only reserved connections: a stranger is refused",
			lim:   Limits{Total: 1, PerSource: 1},
			steps: []step{{"m1", "m", true, false, 0}, {"x1", "x", false, true, 0}, {"y1", "y", false, false, -1}},
		},
		{
			name:   "evicting its own makes room in a full table too",
			lim:    Limits{Total: 2, PerSource: 1},
			steps:  []step{{"x1", "x", false, false, 0}, {"y1", "y", false, false, 0}, {"y2", "y", false, false, 1}},
			closed: []string{"y1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.lim)
			for _, s := range tc.steps {
				if got := h.admit(s.name, s.source, s.reserved); got != s.want {
					t.Fatalf("admit %s: %d, want %d", s.name, got, s.want)
				}
				if s.hold && s.want >= 0 {
					h.tb.Hold(h.conns[s.name].e)
				}
			}
			if got := h.closed(); !slices.Equal(got, tc.closed) {
				t.Fatalf("closed %v, want %v", got, tc.closed)
			}
		})
	}
}

// Release makes a connection the newest evictable one; Done frees its
// slot, and is harmless after an eviction.
func TestReleaseAndDone(t *testing.T) {
	h := newHarness(t, Limits{Total: 2, PerSource: 2})
	h.admit("a", "s", false)
	h.admit("b", "t", false)
	h.tb.Hold(h.conns["a"].e)
	h.tb.Release(h.conns["a"].e) // idle again, now newer than b
	if h.admit("c", "u", false) != 1 || !slices.Equal(h.closed(), []string{"b"}) {
		t.Fatalf("closed %v, want b", h.closed())
	}
	h.tb.Done(h.conns["b"].e) // evicted already
	h.tb.Done(h.conns["a"].e)
	h.tb.Done(h.conns["a"].e)
	if total, _ := h.tb.Len(""); total != 1 {
		t.Fatalf("%d connections left, want 1", total)
	}
	if h.admit("d", "v", false) != 0 {
		t.Fatal("a freed slot was not reused")
	}
}

// A flood from many sources never takes more than Total slots, and
// sources at their limit never exceed it.
func TestBoundsUnderFlood(t *testing.T) {
	lim := Limits{Total: 64, PerSource: 8}
	h := newHarness(t, lim)
	for i := range 10_000 {
		src := fmt.Sprintf("10.0.%d.%d", i%40, i%7)
		h.admit(fmt.Sprint(i), src, false)
		total, n := h.tb.Len(src)
		if total > lim.Total || n > lim.PerSource {
			t.Fatalf("after %d: %d in all, %d from %s", i, total, n, src)
		}
	}
	h.admit("member", "10.9.9.9", true)
	if total, _ := h.tb.Len(""); total != lim.Total+1 {
		t.Fatalf("%d in all, want %d", total, lim.Total+1)
	}
}
