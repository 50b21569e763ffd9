package natsapi

import (
	"context"
	"errors"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/transports/protocol"
)

// codeOfError maps the lock service's domain errors to the stable codes of
// docs/protocol.md. It is the only place where that mapping lives (etcd's
// api/v3rpc toGRPCErrorMap plays the same part). Order matters only where
// an error matches two entries.
var codeOfError = []struct {
	err  error
	code protocol.Code
}{
	{lockservice.ErrHeld, protocol.CodeHeld},
	{lockservice.ErrNotFound, protocol.CodeNotFound},
	{lockservice.ErrDenied, protocol.CodeDenied},
	{lockservice.ErrPermissionDenied, protocol.CodePermissionDenied},
	{lockservice.ErrResourceExhausted, protocol.CodeResourceExhausted},
	// Indeterminate before shutting down: an entry raft may have taken
	// when its node stopped is still indeterminate.
	{lockservice.ErrIndeterminate, protocol.CodeIndeterminate},
	{lockservice.ErrShuttingDown, protocol.CodeShuttingDown},
	{lockservice.ErrUnavailable, protocol.CodeUnavailable},
	{lockservice.ErrUnsupported, protocol.CodeUnsupported},
	{lockservice.ErrTimeout, protocol.CodeTimeout},
	{context.DeadlineExceeded, protocol.CodeTimeout},
	{context.Canceled, protocol.CodeTimeout},
}

// toProtocolError turns any error from the lock service, or from decoding
// a request, into the error a client receives.
func toProtocolError(err error) *protocol.Error {
	var (
		pe *protocol.Error
		nl *lockservice.NotLeaderError
		de *lockservice.DeniedError
		ge *lockservice.GrantEndedError
		dl *lockservice.DelayedError
		ce *core.Error
	)
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.As(err, &nl):
		e := protocol.Errorf(protocol.CodeNotLeader, "node %d is not the leader", nl.Node)
		e.Leader = nl.Leader
		return e
	case errors.As(err, &de):
		return protocol.Errorf(protocol.CodeDenied, "%s", de.Reason)
	case errors.As(err, &ge):
		e := protocol.Errorf(protocol.CodeGrantEnded, "%v", err)
		e.Token = ge.Token
		return e
	case errors.As(err, &dl):
		e := protocol.Errorf(protocol.CodeHeld, "%v", err)
		e.DelayMS = max(1, dl.Remaining.Milliseconds())
		return e
	}
	for _, m := range codeOfError {
		if errors.Is(err, m.err) {
			return protocol.Errorf(m.code, "%v", err)
		}
	}
	if errors.As(err, &ce) {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%s", ce.Detail)
	}
	return protocol.Errorf(protocol.CodeInternal, "%v", err)
}
