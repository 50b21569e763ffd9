package natsapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/lockservice"
	"github.com/ticketd/ticketd/raftstore"
	"github.com/ticketd/ticketd/transports/protocol"
)

func TestToProtocolError(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("lockservice: detail: %w", err) }
	tests := []struct {
		name string
		err  error
		want protocol.Code
	}{
		{"held", wrap(lockservice.ErrHeld), protocol.CodeHeld},
		{"not found", wrap(lockservice.ErrNotFound), protocol.CodeNotFound},
		{"denied", &lockservice.DeniedError{Reason: "owner must start with svc-"}, protocol.CodeDenied},
		{"timeout", wrap(lockservice.ErrTimeout), protocol.CodeTimeout},
		{"permission denied", &lockservice.PermissionError{Identity: "A/bob", Op: lockservice.OpRelease, Key: "orders/42"}, protocol.CodePermissionDenied},
		{"quota", &lockservice.LimitError{Resource: lockservice.ResourceLocks, Limit: 10}, protocol.CodeResourceExhausted},
		{"identity quota", &lockservice.LimitError{Resource: lockservice.ResourceIdentityLocks, Limit: 2, Identity: "A"}, protocol.CodeResourceExhausted},
		{"waiters", &lockservice.LimitError{Resource: lockservice.ResourceKeyWaiters, Limit: 2}, protocol.CodeResourceExhausted},
		{"storage", &lockservice.LimitError{Resource: lockservice.ResourceStorage, Detail: "1 MiB free"}, protocol.CodeResourceExhausted},
		{"indeterminate", fmt.Errorf("%w: %w", lockservice.ErrIndeterminate, raftstore.ErrIndeterminate), protocol.CodeIndeterminate},
		{"indeterminate while stopping", fmt.Errorf("%w: %w", lockservice.ErrIndeterminate, lockservice.ErrShuttingDown), protocol.CodeIndeterminate},
		{"shutting down", wrap(lockservice.ErrShuttingDown), protocol.CodeShuttingDown},
		{"not leader", &lockservice.NotLeaderError{Node: 2, Leader: 3}, protocol.CodeNotLeader},
		{"context deadline", fmt.Errorf("raftstore: read index: %w", context.DeadlineExceeded), protocol.CodeTimeout},
		{"invalid", &core.Error{Code: core.CodeInvalidArgument, Detail: "lease_ms 5 below the minimum"}, protocol.CodeInvalidArgument},
		{"protocol error passes through", protocol.Errorf(protocol.CodeTooLarge, "big"), protocol.CodeTooLarge},
		{"grant ended", &lockservice.GrantEndedError{Key: "k", Token: 9}, protocol.CodeGrantEnded},
		{"unsupported", fmt.Errorf("%w: request_id needs cluster version 3", lockservice.ErrUnsupported), protocol.CodeUnsupported},
		{"anything else", errors.New("disk on fire"), protocol.CodeInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := toProtocolError(tc.err)
			if got.Code != tc.want || got.Message == "" {
				t.Fatalf("toProtocolError(%v) = %+v, want code %s and a message", tc.err, got, tc.want)
			}
		})
	}
	nl := toProtocolError(&lockservice.NotLeaderError{Node: 2, Leader: 3})
	if nl.Leader != 3 {
		t.Fatalf("not_leader lost the leader hint: %+v", nl)
	}
	if ge := toProtocolError(fmt.Errorf("acquire: %w", &lockservice.GrantEndedError{Key: "k", Token: 9})); ge.Token != 9 {
		t.Fatalf("grant_ended lost the token: %+v", ge)
	}
	if d := toProtocolError(&lockservice.DeniedError{Reason: "owner must start with svc-"}); d.Message != "owner must start with svc-" {
		t.Fatalf("denied message %q, want the policy's reason", d.Message)
	}
}
