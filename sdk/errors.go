package sdk

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// Error is every error the SDK returns about a request. Code is the
// stable protocol code (from the server's reply, or chosen by the SDK when
// no usable reply arrived); Op is "acquire", "release", "renew", "withdraw", "get", "list", "watch", "campaign" or "status";
// Key is the lock key when there is one; Err is the underlying cause (a
// NATS or context error), if any, and is reachable through errors.Is and
// errors.As.
//
// errors.Is(err, ErrX) is true when err carries the code of sentinel ErrX.
// In addition ErrUnavailable matches every retryable code (not_leader,
// unavailable, shutting_down): all of them mean "nothing changed, try
// again later". An Error with a code this SDK does not know (from a newer
// server) matches no sentinel; compare CodeOf(err) instead.
type Error struct {
	Code    protocol.Code
	Message string
	Op      string
	Key     string
	// Leader is the raft id of the leader when the server named one
	// (not_leader); informational only.
	Leader uint64
	// Token is the token of the ended grant (ErrGrantEnded).
	Token uint64
	// Delay is what is left of the key's lock-delay on the leader's clock
	// (ErrHeld of a key freed by a failed holder, docs/protocol.md §11);
	// 0 otherwise.
	Delay time.Duration
	// Err is the cause, if any.
	Err error
}

// Sentinels for errors.Is. They carry only a code and match every *Error
// with that code.
var (
	ErrHeld            = &Error{Code: protocol.CodeHeld}
	ErrNotFound        = &Error{Code: protocol.CodeNotFound}
	ErrInvalidArgument = &Error{Code: protocol.CodeInvalidArgument}
	ErrIndeterminate   = &Error{Code: protocol.CodeIndeterminate}
	ErrTimeout         = &Error{Code: protocol.CodeTimeout}
	ErrDenied          = &Error{Code: protocol.CodeDenied}
	ErrUnavailable     = &Error{Code: protocol.CodeUnavailable}
	ErrNotLeader       = &Error{Code: protocol.CodeNotLeader}
	ErrShuttingDown    = &Error{Code: protocol.CodeShuttingDown}
	ErrMalformed       = &Error{Code: protocol.CodeMalformed}
	ErrTooLarge        = &Error{Code: protocol.CodeTooLarge}
	ErrInternal        = &Error{Code: protocol.CodeInternal}
	ErrControlRefused  = &Error{Code: protocol.CodeControlRefused}
	// ErrWrongGroup: in a partitioned deployment (WithPartitioned) the
	// group that received the request does not serve its key: the NATS
	// mapping and the nodes' group count disagree, or the key is moving
	// to a new group (docs/scaling.md). Nothing changed.
	ErrWrongGroup = &Error{Code: protocol.CodeWrongGroup}
	// ErrPermissionDenied: the server's access list does not let the
	// identity NATS authenticated for this connection perform the operation
	// on the key. Nothing changed; retrying does not help.
	ErrPermissionDenied = &Error{Code: protocol.CodePermissionDenied}
	// ErrResourceExhausted: a cluster limit refused the request (the lock
	// table or the caller's quota is full, a waiter queue is full, or the
	// leader's disk is low). Nothing changed. The SDK does not retry it:
	// retrying at once would only be refused again. Retry later, after
	// releasing locks (or once an operator freed space); releases are
	// never refused with it.
	ErrResourceExhausted = &Error{Code: protocol.CodeResourceExhausted}
	// ErrGrantEnded: an Acquire with WithRequestID whose request id
	// already produced a grant of the key that has ended (released or
	// expired); Error.Token is its token. Nothing was granted. Acquire
	// never returns it for a request id of its own making (it acquires
	// anew with a fresh one, docs/protocol.md §5.1).
	ErrGrantEnded = &Error{Code: protocol.CodeGrantEnded}
	// ErrUnsupported: the request needs a cluster version the cluster
	// has not reached (WithRequestID before every member runs cluster
	// version 3). Nothing changed.
	ErrUnsupported = &Error{Code: protocol.CodeUnsupported}
)

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("ticketd")
	if e.Op != "" {
		b.WriteString(": ")
		b.WriteString(e.Op)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " %q", e.Key)
	}
	b.WriteString(": ")
	b.WriteString(string(e.Code))
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if e.Err != nil {
		if cause := strings.ReplaceAll(e.Err.Error(), "\n", "; "); !strings.Contains(e.Message, cause) {
			b.WriteString(": ")
			b.WriteString(cause)
		}
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is a sentinel (an *Error with only a Code) for
// e's code; ErrUnavailable also matches every retryable code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Message != "" || t.Op != "" || t.Key != "" || t.Err != nil || t.Leader != 0 || t.Token != 0 {
		return false
	}
	if t.Code == e.Code {
		return true
	}
	return t.Code == protocol.CodeUnavailable && e.Code.Retryable()
}

// CodeOf returns the stable code carried by err (an *Error or a
// *protocol.Error anywhere in its chain), or "" if it carries none.
func CodeOf(err error) protocol.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsIndeterminate reports whether err is ErrIndeterminate: the outcome of
// the request is unknown, and for an acquire a lock may exist that the
// caller does not know about (it expires within its lease). Errors with a
// definite code (held, not_found, timeout, denied, invalid_argument,
// malformed, too_large, control_refused, permission_denied,
// resource_exhausted and the retryable codes) mean the request had no
// effect; internal and codes unknown to this SDK say nothing either way and
// should be handled like indeterminate.
func IsIndeterminate(err error) bool { return errors.Is(err, ErrIndeterminate) }
