package faults

import (
	"context"
	"testing"
	"time"

	"github.com/ticketd/ticketd/daemon"
	"github.com/ticketd/ticketd/internal/testkit"
)

// TestStartContextDoesNotBoundPeerTransport (was a known bug): daemon.Start documented no
// meaning for its context, and a caller naturally bounds start-up with
// one; but the peer transport derives its lifetime from it
// (peer.Transport.Start: context.AfterFunc(ctx, ln.Close)), so once that
// context ends the node keeps running with its peer listener closed and
// its outbound peers stopped: a cluster started that way never elects a
// leader. Either Start should not hand its context to long-lived parts or
// its doc must say the context bounds the node's life.
func TestStartContextDoesNotBoundPeerTransport(t *testing.T) {
	// Fixed: daemon.Start's context bounds start-up only. This test stays
	// as the regression test.
	quiet := testkit.QuietLogger()
	c, err := startInProcess(t, 3, quiet, 20, 10)
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	var nodes []*daemon.Daemon
	defer func() {
		for _, d := range nodes {
			d.Close()
		}
	}()
	for i := 0; i < c.size(); i++ {
		cfg := c.kit.Config(i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := daemon.Start(ctx, cfg, daemon.Options{Logger: quiet})
		cancel() // start-up is over
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, d)
	}
	testkit.Eventually(t, 10*time.Second, "a leader (none: the peer transports stopped with the start-up context)", func() bool {
		for _, d := range nodes {
			if d.Locks().IsLeader() {
				return true
			}
		}
		return false
	})
}
