package sdk_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// writeWithToken stands for the protected resource: it must reject a
// fencing token lower than the highest it has accepted.
func writeWithToken(token uint64) error { return nil }

// Take a lock, use its fencing token, give it back. (Not run: it needs a
// ticketd cluster on nats://127.0.0.1:4222.)
func ExampleClient_Acquire() {
	c, err := sdk.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lock, err := c.Acquire(ctx, "orders/42",
		sdk.WithOwner("worker-1"),
		sdk.WithLease(10*time.Second),
		sdk.WithWait(5*time.Second), // queue for up to 5s if the key is held
	)
	switch {
	case errors.Is(err, sdk.ErrTimeout), errors.Is(err, sdk.ErrHeld):
		log.Printf("busy, try later: %v", err) // nothing was granted
		return
	case sdk.IsIndeterminate(err):
		// The reply was lost: a grant may exist and expires within its
		// lease. Do not assume you hold it; do not re-acquire with the
		// same owner expecting the same lock.
		log.Printf("unknown outcome: %v", err)
		return
	case err != nil:
		log.Printf("acquire failed (code %s): %v", sdk.CodeOf(err), err)
		return
	}

	// Only act while the lock is valid, and always fence with the token.
	if lock.Valid() {
		if err := writeWithToken(lock.Token); err != nil {
			log.Print(err)
		}
	}

	if err := lock.Release(ctx); err != nil && !errors.Is(err, sdk.ErrNotFound) {
		// ErrIndeterminate here may be retried: a second release with the
		// same token is harmless (it yields ErrNotFound).
		log.Printf("release: %v", err)
	}
}

// Look up the current holder of a key.
func ExampleClient_Get() {
	c, err := sdk.Connect("nats://127.0.0.1:4222", sdk.WithRequestTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	h, err := c.Get(context.Background(), "orders/42")
	if err != nil {
		log.Fatal(err)
	}
	if h.Held {
		log.Printf("%s is held by %q with token %d, %v left", h.Key, h.Owner, h.Token, h.Remaining)
	}
}
