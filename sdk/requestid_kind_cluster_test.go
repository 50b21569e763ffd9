package sdk_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// WithRequestID's id reused for another kind or key on a real cluster is
// ErrInvalidArgument (code invalid_argument) naming what the id was used
// for, and changes nothing; reused unchanged it is the same grant, of its
// kind.
func TestRequestIDOfAnotherKindCluster(t *testing.T) {
	c, lead := cluster(t, 3)
	cl := client(t, c, c.Follower(lead))
	ctx := t.Context()
	first, err := cl.Acquire(ctx, "pool", sdk.WithLimit(3), sdk.WithRequestID("job-7"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  string
		opts []sdk.AcquireOption
		want string
	}{
		{name: "mutex", key: "pool", want: "semaphore of limit 3"},
		{name: "other limit", key: "pool", opts: []sdk.AcquireOption{sdk.WithLimit(2)}, want: "semaphore of limit 2"},
		{name: "shared", key: "pool", opts: []sdk.AcquireOption{sdk.WithShared()}, want: "a shared hold"},
		{name: "other key", key: "other", opts: []sdk.AcquireOption{sdk.WithLimit(3)}, want: `"pool"`},
	} {
		_, err := cl.Acquire(ctx, tc.key, append(tc.opts, sdk.WithRequestID("job-7"))...)
		if !errors.Is(err, sdk.ErrInvalidArgument) || sdk.CodeOf(err) != protocol.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want invalid_argument mentioning %s", tc.name, err, tc.want)
		}
	}
	again, err := cl.Acquire(ctx, "pool", sdk.WithLimit(3), sdk.WithRequestID("job-7"))
	if err != nil || !again.Repeated || again.Token != first.Token || again.Limit != 3 || again.Shared {
		t.Fatalf("unchanged retry: %+v %v, want token %d repeated, limit 3", again, err, first.Token)
	}
	h, err := cl.Get(ctx, "pool")
	if err != nil || len(h.Holders) != 1 {
		t.Fatalf("holders of pool: %+v %v, want the one grant", h, err)
	}
}
