package sdk

import (
	"github.com/ticketd/ticketd/transports/protocol"
)

// Counting semaphores and read/write locks (docs/protocol.md, "Semaphores
// and read/write locks"; cluster version 5, ErrUnsupported before).

// WithLimit makes the key a counting semaphore of n holders (2..
// protocol.MaxLimit; 1, the default, is a mutex): up to n holders hold it
// at once, each with its own token, and the others wait in one FIFO queue.
// Every holder and waiter of a key must name the same limit: another one
// is ErrInvalidArgument naming the key's. Release, renewal, expiry and
// lock-delay are per holder.
func WithLimit(n int) AcquireOption {
	return func(o *acquireOptions) { o.limit = n }
}

// WithShared makes the acquire a shared hold of a read/write lock: shared
// holders hold the key together, an exclusive one (an acquire without
// WithShared, today's mutex) excludes every other holder. Requests are
// served in one FIFO queue across both modes, so a waiting exclusive
// acquire is never overtaken by later shared ones (a shared try behind it
// is ErrHeld). Not with WithLimit above 1.
func WithShared() AcquireOption {
	return func(o *acquireOptions) { o.shared = true }
}

// validateKind checks WithLimit and WithShared before anything is sent.
func (o *acquireOptions) validateKind(bad func(format string, args ...any) error) error {
	switch {
	case o.limit < 0 || o.limit > protocol.MaxLimit:
		return bad("limit %d is outside [0, %d]", o.limit, protocol.MaxLimit)
	case o.limit > 1 && o.shared:
		return bad("a semaphore (limit %d) has no shared mode", o.limit)
	}
	return nil
}

// setKind writes the acquire's kind into req: a limit above 1, or the
// shared mode; nothing for a mutex (so the request stays what a server
// before cluster version 5 reads).
func (o *acquireOptions) setKind(req *protocol.AcquireRequest) {
	if o.limit > 1 {
		req.Limit = int64(o.limit)
	}
	if o.shared {
		req.Mode = protocol.ModeShared
	}
}
