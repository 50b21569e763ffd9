package lockservice

import (
	"errors"
	"testing"

	"github.com/ticketd/ticketd/raftstore"
)

// A try-acquire of a held key is answered "held" only by a node that a
// ReadIndex still confirms as leader: a deposed leader (paused, cut off)
// sees the holder it knew, which may be gone. Found by the fault
// harness: a leader resumed after SIGSTOP answered held for a lock the new
// leader had already let expire.
func TestHeldOnlyFromAConfirmedLeader(t *testing.T) {
	s, f := newLeader(t, Config{})
	g, err := acquire(s, "", "k", 0)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}

	if _, err := acquire(s, "", "k", 0); !errors.Is(err, ErrHeld) {
		t.Fatalf("try-acquire of a held key: %v, want held", err)
	}
	if n := f.readIndexes.Load(); n != 1 {
		t.Fatalf("held answered after %d ReadIndex calls, want 1", n)
	}

	// Deposed: the ReadIndex fails, so the answer is not_leader, not held.
	f.readIndex = func() error { return raftstore.ErrNotLeader }
	_, err = acquire(s, "", "k", 0)
	var nl *NotLeaderError
	if errors.Is(err, ErrHeld) || !errors.As(err, &nl) {
		t.Fatalf("try-acquire on a node whose ReadIndex fails: %v, want not_leader", err)
	}

	// Released while the leadership was being confirmed: the second look
	// finds the key free and grants it.
	f.readIndex = func() error {
		f.readIndex = nil
		return s.Release(t.Context(), "k", g.Token)
	}
	g2, err := acquire(s, "", "k", 0)
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("try-acquire after a release during the ReadIndex: %+v, %v; want a new grant", g2, err)
	}
}
