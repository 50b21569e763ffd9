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
		// The context ended while an attempt's outcome was unknown, and
		// no leader could settle it (the SDK retried with the acquire's
		// request_id until then): a grant may exist and expires within
		// its lease. Do not assume you hold it.
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

// A job that may be restarted names each run in its request id: a restart
// whose first acquire's reply was lost (the process died meanwhile) gets
// the grant that acquire made, the same token, instead of queueing behind
// its own lock until the lease ends. (Not run: it needs a cluster.)
func ExampleWithRequestID() {
	c, err := sdk.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	lock, err := c.Acquire(ctx, "jobs/nightly", sdk.WithLease(time.Minute), sdk.WithRequestID("nightly-2026-12-04"))
	var e *sdk.Error
	switch {
	case errors.As(err, &e) && errors.Is(err, sdk.ErrGrantEnded):
		// This run's grant (token e.Token) was released or expired: the
		// run that held it is over.
		log.Printf("already ran: token %d ended", e.Token)
		return
	case err != nil:
		log.Fatal(err)
	}
	if lock.Repeated {
		log.Printf("resuming with token %d, %v left", lock.Token, lock.Remaining())
	}
	_ = writeWithToken(lock.Token)
	_ = lock.Release(ctx)
}
