package lockservice

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestLeaseHeapNeverShortens(t *testing.T) {
	h := newLeaseTable()
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
	h := newLeaseTable()
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

// check verifies the table's internal invariants: every live record is
// found through the index under its own key, the heap positions agree,
// the heap is ordered, and the identity counts match the records.
func (h *leaseTable) check(t *testing.T) {
	t.Helper()
	live := 0
	counts := map[uint32]int{}
	for i := range h.recs {
		r := &h.recs[i]
		if r.heapAt < 0 {
			continue
		}
		live++
		counts[r.identity]++
		if n, _ := h.find(string(h.key(r))); n != int32(i) {
			t.Fatalf("record %d (%q) found as %d", i, h.key(r), n)
		}
		if int(r.heapAt) >= len(h.heap) || h.heap[r.heapAt] != int32(i) {
			t.Fatalf("record %d at heap %d, which holds another", i, r.heapAt)
		}
	}
	if live != len(h.heap) {
		t.Fatalf("%d live records, heap of %d", live, len(h.heap))
	}
	for i := 1; i < len(h.heap); i++ {
		if h.less(i, (i-1)/2) {
			t.Fatalf("heap out of order at %d", i)
		}
	}
	inIndex := 0
	for _, e := range h.index {
		if e != 0 {
			inIndex++
		}
	}
	if inIndex != live {
		t.Fatalf("index holds %d entries for %d timers", inIndex, live)
	}
	h.idents.Each(func(id uint32, name string, held int) {
		if held != counts[id] {
			t.Fatalf("identity %q counts %d, records %d", name, held, counts[id])
		}
	})
}

// TestLeaseTableAgainstModel runs random operations on the table and on a
// plain map and compares them after each: the same timers, tokens,
// deadlines, leases and counts, with the table's invariants intact. The
// keys are few (so arms replace, removes hit) and long-lived enough for
// the index to grow, runs of removals to shift entries back, and the key
// arena to be compacted.
func TestLeaseTableAgainstModel(t *testing.T) {
	type timer struct {
		token    uint64
		identity string
		lease    time.Duration
		deadline time.Time
		renewing int
	}
	rng := rand.New(rand.NewPCG(1, 2))
	h := newLeaseTable()
	model := map[string]*timer{}
	t0 := time.Unix(1000, 0)
	now := t0
	token := uint64(0)
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k/%d/%s", i, strings.Repeat("x", i%40))
	}
	idents := []string{"", "a", "b/c", "d"}
	steps := 20000
	if testing.Short() {
		steps = 5000
	}
	for step := 0; step < steps; step++ {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(100); {
		case op < 40: // a grant (new token) or a re-arm of the same one
			m := model[key]
			tok := uint64(0)
			if m != nil && rng.IntN(4) == 0 {
				tok = m.token
			} else {
				token++
				tok = token
			}
			lease := time.Duration(1+rng.IntN(5000)) * time.Millisecond
			id := idents[rng.IntN(len(idents))]
			h.arm(key, tok, id, lease, now)
			if m != nil && m.token == tok {
				if d := now.Add(lease); d.After(m.deadline) {
					m.deadline = d
				}
			} else {
				model[key] = &timer{token: tok, identity: id, lease: lease, deadline: now.Add(lease)}
			}
		case op < 70: // release or expire, with the right token or not
			m := model[key]
			tok := uint64(rng.IntN(3))
			if m != nil && rng.IntN(4) != 0 {
				tok = m.token
			}
			h.remove(key, tok)
			if m != nil && m.token == tok {
				delete(model, key)
			}
		case op < 80: // an applied renewal
			m := model[key]
			tok := uint64(7)
			if m != nil {
				tok = m.token
			}
			lease := time.Duration(1+rng.IntN(5000)) * time.Millisecond
			ok := h.extend(key, tok, lease, now)
			if ok != (m != nil && m.token == tok) {
				t.Fatalf("step %d: extend(%q) = %v", step, key, ok)
			}
			if ok {
				m.lease = max(m.lease, lease)
				if d := now.Add(m.lease); d.After(m.deadline) {
					m.deadline = d
				}
			}
		case op < 86: // a Renew in or out of flight
			m := model[key]
			if m == nil {
				if h.addRenewing(key, 1, +1) {
					t.Fatalf("step %d: addRenewing found a timer for %q", step, key)
				}
				break
			}
			d := 1
			if m.renewing > 0 && rng.IntN(2) == 0 {
				d = -1
			}
			h.addRenewing(key, m.token, d)
			m.renewing += d
		default: // the expiry loop
			retry := time.Duration(1+rng.IntN(100)) * time.Millisecond
			limit := 1 + rng.IntN(20)
			due := h.due(now, retry, limit)
			if len(due) > limit {
				t.Fatalf("step %d: %d due, limit %d", step, len(due), limit)
			}
			seen := map[string]bool{}
			for _, it := range due {
				m := model[it.key]
				if m == nil || m.token != it.token || m.deadline.After(now) || m.renewing > 0 || seen[it.key] {
					t.Fatalf("step %d: due %+v, model %+v", step, it, m)
				}
				seen[it.key] = true
			}
			for k, m := range model {
				got, _ := h.get(k)
				switch {
				case got.deadline.Equal(m.deadline):
					if len(due) < limit && !m.deadline.After(now) {
						t.Fatalf("step %d: %q due and not taken with room left", step, k)
					}
				case !m.deadline.After(now) && got.deadline.Equal(now.Add(retry)):
					m.deadline = got.deadline // pushed back
				default:
					t.Fatalf("step %d: %q deadline %v, model %v", step, k, got.deadline.Sub(t0), m.deadline.Sub(t0))
				}
				if seen[k] != (got.expiring && seen[k]) {
					t.Fatalf("step %d: %q returned but not marked expiring", step, k)
				}
			}
		}
		if step%997 == 0 || step == steps-1 {
			h.check(t)
			if h.Len() != len(model) {
				t.Fatalf("step %d: %d timers, model %d", step, h.Len(), len(model))
			}
			held := map[string]int{}
			for k, m := range model {
				held[m.identity]++
				got, ok := h.get(k)
				if !ok || got.token != m.token || !got.deadline.Equal(m.deadline) || got.lease != m.lease || int(got.renewing) != m.renewing {
					t.Fatalf("step %d: %q = %+v %v, model %+v", step, k, got, ok, m)
				}
			}
			for _, id := range idents {
				if h.held(id) != held[id] {
					t.Fatalf("step %d: held(%q) = %d, model %d", step, id, h.held(id), held[id])
				}
			}
			if next, ok := h.next(); ok {
				for k, m := range model {
					if m.deadline.Before(next) {
						t.Fatalf("step %d: next %v, but %q is due at %v", step, next.Sub(t0), k, m.deadline.Sub(t0))
					}
				}
			}
		}
	}
}

// TestLeaseTableArmBatchMatchesArm: armBatch leaves the same timers as arm
// called on the same requests in their order: with timers already armed
// (the same token, moved only later; another token, replaced), a key twice
// in one batch (the later arm wins), and the index growing mid-batch.
func TestLeaseTableArmBatchMatchesArm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	one, batch := newLeaseTable(), newLeaseTable() // both start small: they grow
	keys := make([]string, 5000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k/%d/%s", i, strings.Repeat("y", i%17))
	}
	idents := []string{"", "a", "b/c"}
	now := time.Unix(1000, 0)
	token := uint64(0)
	tokens := map[string]uint64{} // the token each key was last armed with
	var scratch []armReq
	for round := 0; round < 30; round++ {
		now = now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
		reqs := make([]armReq, 1+rng.IntN(2000))
		for i := range reqs {
			key := keys[rng.IntN(len(keys))]
			tok, ok := tokens[key]
			if !ok || rng.IntN(3) == 0 {
				token++
				tok = token
			}
			tokens[key] = tok
			reqs[i] = armReq{key: key, identity: idents[rng.IntN(len(idents))], token: tok,
				lease: time.Duration(1+rng.IntN(3000)) * time.Millisecond}
		}
		for _, r := range reqs {
			one.arm(r.key, r.token, r.identity, r.lease, now)
		}
		scratch = batch.armBatch(slices.Clone(reqs), now, scratch)
		one.check(t)
		batch.check(t)
		if one.Len() != batch.Len() {
			t.Fatalf("round %d: %d timers armed one by one, %d in a batch", round, one.Len(), batch.Len())
		}
		for _, k := range keys {
			a, aok := one.get(k)
			b, bok := batch.get(k)
			if aok != bok || a != b {
				t.Fatalf("round %d: %q one by one %+v %v, in a batch %+v %v", round, k, a, aok, b, bok)
			}
		}
		for _, id := range idents {
			if one.held(id) != batch.held(id) {
				t.Fatalf("round %d: held(%q) %d one by one, %d in a batch", round, id, one.held(id), batch.held(id))
			}
		}
		// Some expire, so that later rounds arm keys that have no timer.
		for _, it := range one.due(now.Add(time.Second), time.Millisecond, 500) {
			one.remove(it.key, it.token)
			batch.remove(it.key, it.token)
		}
	}
}

// TestLeaseTableMemory: a timer costs well under 100 bytes, in a fixed
// number of pointer-free blocks whatever the count (so the collector has
// nothing to scan per timer): arming into a table with room allocates
// nothing per timer.
func TestLeaseTableMemory(t *testing.T) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("lock/%07d", i)
	}
	var h *leaseTable
	now := time.Unix(1000, 0)
	arm := func() {
		h = newLeaseTableFor(n)
		for i, k := range keys {
			h.arm(k, uint64(i+1), "", time.Minute, now)
		}
	}
	if allocs := testing.AllocsPerRun(3, arm); allocs > 20 {
		t.Fatalf("arming %d timers made %.0f allocations", n, allocs)
	}
	bytes := int(unsafe.Sizeof(leaseRec{}))*cap(h.recs) + 4*len(h.index) + 4*cap(h.heap) + cap(h.keys)
	t.Logf("%d bytes per timer (12-byte keys)", bytes/n)
	if bytes/n > 90 {
		t.Fatalf("%d bytes per timer", bytes/n)
	}
}

// BenchmarkLeaseTableArm1M is a new leader's re-arm of a million locks
// (the timers alone, without the walk of the machine).
func BenchmarkLeaseTableArm1M(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("lock/%07d", i)
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		h := newLeaseTableFor(n)
		for i, k := range keys {
			h.arm(k, uint64(i+1), "", 24*time.Hour, now)
		}
	}
}

// BenchmarkLeaseTableArmBatch1M is the same re-arm as the service does it:
// armBatch, RearmChunkDefault timers at a time.
func BenchmarkLeaseTableArmBatch1M(b *testing.B) {
	const n = 1_000_000
	reqs := make([]armReq, n)
	for i := range reqs {
		reqs[i] = armReq{key: fmt.Sprintf("lock/%07d", i), token: uint64(i + 1), lease: 24 * time.Hour}
	}
	now := time.Now()
	b.ReportAllocs()
	var scratch []armReq
	for b.Loop() {
		h := newLeaseTableFor(n)
		for i := 0; i < n; i += RearmChunkDefault {
			scratch = h.armBatch(reqs[i:min(n, i+RearmChunkDefault)], now, scratch)
		}
	}
}
