package sdk_test

import (
	"testing"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// A repeat of a request id sent with another owner (the CLI's default
// owner names its process, so a second run with the same --request-id
// has another) reports the lock's owner, the first attempt's, not the
// repeat's: the grant was made for it.
func TestRepeatedGrantReportsTheLocksOwner(t *testing.T) {
	c, lead := cluster(t, 1)
	cl := client(t, c, lead)
	ctx := t.Context()
	first, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Minute), sdk.WithOwner("run-1"), sdk.WithRequestID("nightly"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := cl.Acquire(ctx, "k", sdk.WithLease(time.Minute), sdk.WithOwner("run-2"), sdk.WithRequestID("nightly"))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Repeated || again.Token != first.Token {
		t.Fatalf("repeat: %+v, want token %d repeated", again, first.Token)
	}
	h, err := cl.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if again.Owner != "run-1" || h.Owner != "run-1" {
		t.Fatalf("the repeat says owner %q, the lock's owner is %q; want run-1 for both", again.Owner, h.Owner)
	}
}
