package lockservice

import (
	"errors"
	"fmt"
)

// Errors the lock service returns. They speak the domain; the transports
// map them to their wire codes in one table at the edge (natsapi). Each is
// wrapped with detail, so match with errors.Is / errors.As.
var (
	// ErrHeld: the key is held (or has a Grant in flight) and the request
	// would not wait. Nothing was proposed.
	ErrHeld = errors.New("lockservice: key is held")
	// ErrNotFound: no lock with that key and token. Nothing changed (the
	// Release applied and found nothing, or its token was above the last
	// one issued and it was not proposed).
	ErrNotFound = errors.New("lockservice: no lock with that key and token")
	// ErrDenied: the Grant policy refused the request (or failed, which
	// denies). Nothing was proposed and no token was consumed.
	ErrDenied = errors.New("lockservice: denied by policy")
	// ErrTimeout: the request's time ran out with nothing held for it (the
	// wait ended, or a late Grant was released again with its token).
	ErrTimeout = errors.New("lockservice: timed out")
	// ErrIndeterminate: the command was handed to raft but its outcome is
	// unknown; a Grant may exist and will expire within its lease.
	ErrIndeterminate = errors.New("lockservice: outcome unknown")
	// ErrUnavailable: the request cannot be served right now (for example
	// the cluster version does not allow its command yet); nothing was
	// proposed; retry later.
	ErrUnavailable = errors.New("lockservice: unavailable")
	// ErrShuttingDown: the service or its node is stopping; nothing changed.
	ErrShuttingDown = errors.New("lockservice: stopping")
	// ErrPermissionDenied: the access list does not let the caller's
	// identity perform the operation on the key. Nothing was proposed.
	ErrPermissionDenied = errors.New("lockservice: permission denied")
	// ErrResourceExhausted: a limit refused the request (a *LimitError says
	// which: quota.go). Nothing was proposed.
	ErrResourceExhausted = errors.New("lockservice: resource exhausted")
	// ErrGrantEnded: the acquire's request id names a grant of the key
	// that has ended (a *GrantEndedError carries its token). Nothing was
	// granted.
	ErrGrantEnded = errors.New("lockservice: the request's grant has ended")
	// ErrUnsupported: the request needs a cluster version the cluster has
	// not reached (a request id: version 3). Nothing was proposed.
	ErrUnsupported = errors.New("lockservice: not supported by the cluster version")
)

// GrantEndedError is an acquire whose request id names a grant of Key
// with Token that has ended; it matches ErrGrantEnded. Token 0: the
// request was settled without a grant (a withdraw by request id, cluster
// version 6), so this late attempt of it is not granted.
type GrantEndedError struct {
	Key   string
	Token uint64
}

func (e *GrantEndedError) Error() string {
	if e.Token == 0 {
		return fmt.Sprintf("lockservice: this request_id was settled (withdrawn) for %q before this attempt reached the leader; it is not granted", e.Key)
	}
	return fmt.Sprintf("lockservice: the grant of %q with token %d to this request_id has ended (released or expired); it is not granted again", e.Key, e.Token)
}

// Is makes errors.Is(err, ErrGrantEnded) hold.
func (e *GrantEndedError) Is(target error) bool { return target == ErrGrantEnded }

// NotLeaderError: this node is not the ready leader, so it certainly did
// not propose anything. Leader is the leader this node knows (0: none).
type NotLeaderError struct {
	Node   uint64
	Leader uint64
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("lockservice: node %d is not the leader", e.Node)
}

// DeniedError carries the policy's reason; it matches ErrDenied.
type DeniedError struct{ Reason string }

func (e *DeniedError) Error() string { return "lockservice: denied: " + e.Reason }

// Is makes errors.Is(err, ErrDenied) hold.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// PermissionError says who was refused what; it matches
// ErrPermissionDenied. Identity is the caller's own, so showing it back
// reveals nothing; the access list itself is never shown.
type PermissionError struct {
	Identity string
	Op       Op
	Key      string
}

func (e *PermissionError) Error() string {
	who := e.Identity
	if who == "" {
		who = "an unauthenticated caller"
	} else {
		who = fmt.Sprintf("identity %q", who)
	}
	return fmt.Sprintf("%s may not %s %q", who, e.Op, e.Key)
}

// Is makes errors.Is(err, ErrPermissionDenied) hold.
func (e *PermissionError) Is(target error) bool { return target == ErrPermissionDenied }
