package raftstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/ticketd/ticketd/core"
)

// TestMoveThatRaftGivesUpTakesProposalsAgain: when the transfer a move
// started ends with this node still leading (raft gives a transfer up
// after an election timeout; here the start function starts none), the
// move returns ErrNoTransfer at once instead of waiting for its context,
// and the loop takes proposals again; while the move ran it refused them.
func TestMoveThatRaftGivesUpTakesProposalsAgain(t *testing.T) {
	st := openTestStore(t, t.TempDir())
	n := startSingle(t, st, Config{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refusing := false
	start := time.Now()
	err := n.move(ctx, 2, func(*raft.RawNode) error {
		refusing = n.refuseProposals // on the loop: safe to read
		return nil                   // no transfer started: as if raft had given it up
	})
	took := time.Since(start)
	if !errors.Is(err, ErrNoTransfer) {
		t.Fatalf("move: %v, want ErrNoTransfer", err)
	}
	if !refusing {
		t.Fatal("the loop took proposals while the move ran")
	}
	if took > 2*time.Second {
		t.Fatalf("move took %v: it waited for its context", took)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	if _, err := n.Propose(pctx, core.Grant("after-move", "o", 10000, 0)); err != nil {
		t.Fatalf("propose after the move: %v", err)
	}
}
