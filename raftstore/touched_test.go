package raftstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// TestTouchedRowsFirstTouchOrder checks touchedRows against a plain map
// and list on random runs of several sizes.
func TestTouchedRowsFirstTouchOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 26))
	for _, n := range []int{0, 1, 5, 15, 16, 17, 48, 500} {
		for round := 0; round < 20; round++ {
			var got touchedRows
			var want []string
			seen := map[string]bool{}
			control := false
			for i := 0; i < 2*n; i++ {
				if rng.IntN(20) == 0 {
					got.add(core.Command{Kind: core.KindControl})
					control = true
					continue
				}
				key := fmt.Sprintf("k%d", rng.IntN(n+1))
				got.add(core.Command{Key: key})
				if !seen[key] {
					seen[key] = true
					want = append(want, key)
				}
			}
			if !slices.Equal(got.keys, want) || got.control != control {
				t.Fatalf("n=%d round %d: keys %v control %v, want %v %v", n, round, got.keys, got.control, want, control)
			}
		}
	}
}
