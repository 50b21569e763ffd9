package protocol

import "github.com/ticketd/ticketd/core"

// Lock kinds on the wire (cluster version 5): an acquire's "limit" and
// "mode" (AcquireRequest), a get's or list's "limit", "mode" and
// "holders" (GetReply).

// MaxLimit is the largest semaphore limit (core.MaxSemaphoreLimit).
const MaxLimit = core.MaxSemaphoreLimit

// The modes of a read/write lock.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// validateKind checks an acquire's limit and mode: limit 0..MaxLimit, mode
// "", "exclusive" or "shared", and no shared semaphore.
func (r *AcquireRequest) validateKind() error {
	switch {
	case r.Limit < 0 || r.Limit > MaxLimit:
		return Errorf(CodeInvalidArgument, "limit %d is outside [0, %d]", r.Limit, MaxLimit)
	case r.Mode != "" && r.Mode != ModeExclusive && r.Mode != ModeShared:
		return Errorf(CodeInvalidArgument, "mode %q is not %q or %q", r.Mode, ModeExclusive, ModeShared)
	case r.Limit > 1 && r.Mode == ModeShared:
		return Errorf(CodeInvalidArgument, "a semaphore (limit %d) has no shared mode", r.Limit)
	}
	return nil
}

// Kind is the acquire's limit and mode for the lock service (valid after
// Validate): limit 1 is written 0, a mutex.
func (r *AcquireRequest) Kind() (limit uint32, mode core.Mode) {
	if r.Limit > 1 {
		limit = uint32(r.Limit)
	}
	if r.Mode == ModeShared {
		mode = core.ModeShared
	}
	return limit, mode
}

// ModeName is a core mode as the wire names it: "" for exclusive (the
// default, omitted), "shared".
func ModeName(m core.Mode) string {
	if m == core.ModeShared {
		return ModeShared
	}
	return ""
}
