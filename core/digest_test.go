package core_test

import (
	"fmt"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// The incremental digest must equal the digest of the same state built
// from scratch (a restore of its snapshot), whatever the order of changes,
// and must see every field of a lock.
func TestDigestIncrementalMatchesRebuilt(t *testing.T) {
	m := core.NewMachine()
	for i := 0; i < 200; i++ {
		m.Apply(core.Grant(fmt.Sprintf("k%03d", i%37), fmt.Sprintf("o%d", i), lease+uint64(i), uint64(i)))
		if i%3 == 0 {
			m.Apply(core.Release(fmt.Sprintf("k%03d", (i*7)%37), uint64(i/2+1)))
		}
		if i%5 == 0 {
			m.Apply(core.Expire(fmt.Sprintf("k%03d", (i*11)%37), uint64(i/3+1)))
		}
		switch i {
		case 10:
			m.Apply(core.Bootstrap([32]byte{1}, "127.0.0.1:7001"))
		case 60:
			m.Apply(core.MintJoin([32]byte{2}))
		case 120:
			m.Apply(core.SetClusterVersion(2))
		}
		fresh := core.NewMachine()
		if err := fresh.Restore(m.Snapshot()); err != nil {
			t.Fatal(err)
		}
		if fresh.Digest() != m.Digest() {
			t.Fatalf("step %d: incremental digest differs from the rebuilt one", i)
		}
	}

	base := core.Lock{Key: "k", Token: 1, Owner: "o", LeaseMS: lease, GrantedAtMS: 5}
	variants := []core.Lock{base}
	for _, f := range []func(*core.Lock){
		func(l *core.Lock) { l.Key = "j" },
		func(l *core.Lock) { l.Owner = "p" },
		func(l *core.Lock) { l.Identity = "acct" },
		func(l *core.Lock) { l.LeaseMS++ },
		func(l *core.Lock) { l.GrantedAtMS++ },
	} {
		l := base
		f(&l)
		variants = append(variants, l)
	}
	seen := map[[32]byte]int{}
	for i, l := range variants {
		x := core.NewMachine()
		x.Load(1, []core.Lock{l})
		if j, dup := seen[x.Digest()]; dup {
			t.Fatalf("locks %+v and %+v give the same digest", variants[j], l)
		}
		seen[x.Digest()] = i
	}
	// The zero Machine and NewMachine are the same empty state.
	var zero core.Machine
	if zero.Digest() != core.NewMachine().Digest() {
		t.Fatal("zero Machine and NewMachine digests differ")
	}
}

// Digest costs the same on a table of 100k locks as on an empty one.
func BenchmarkDigest100k(b *testing.B) {
	m := core.NewMachine()
	for i := 0; i < 100_000; i++ {
		m.Apply(core.Grant(fmt.Sprintf("key-%07d", i), "owner", lease, 0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = m.Digest()
	}
}
