package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/fence/fencetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	fencetest.Run(t, func(*testing.T) fence.Store { return fence.NewMemoryStore(0) })
}

// TestMemoryStoreFull: a full store refuses new keys, never forgets old
// ones, and keeps serving the keys it holds.
func TestMemoryStoreFull(t *testing.T) {
	ctx := context.Background()
	s := fence.NewMemoryStore(2)
	for _, k := range []string{"a", "b"} {
		if err := s.Advance(ctx, k, 5); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Advance(ctx, "c", 1); !errors.Is(err, fence.ErrStoreFull) {
		t.Fatalf("a third key in a store of two: %v, want fence_store_full", err)
	}
	if err := s.Advance(ctx, "a", 6); err != nil {
		t.Fatalf("a held key in a full store: %v", err)
	}
	if err := s.Advance(ctx, "b", 4); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a stale token in a full store: %v", err)
	}
	if cur, ok := s.Current("a"); !ok || cur != 6 || s.Len() != 2 {
		t.Fatalf("Current(a) = %d, %v; Len %d", cur, ok, s.Len())
	}
}
