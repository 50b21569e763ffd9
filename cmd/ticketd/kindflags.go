package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// kindFlags are the lock kind flags of lock acquire and lock exec
// (docs/protocol.md, "Semaphores and read/write locks"; cluster version 5).
type kindFlags struct {
	limit  int
	shared bool
}

func (k *kindFlags) add(fs *pflag.FlagSet) {
	fs.IntVar(&k.limit, "limit", 1, fmt.Sprintf("hold one of N slots of a counting semaphore (1..%d; 1: a mutex); every holder of the key names the same N (cluster version 5)", protocol.MaxLimit))
	fs.BoolVar(&k.shared, "shared", false, "a shared (reader's) hold of a read/write lock: beside other shared holders, never beside an exclusive one (cluster version 5)")
}

// check refuses a --limit outside the flag's 1..MaxLimit before anything
// is sent: the wire reads limit 0 as a mutex, so --limit 0 (a typo, or a
// guess at "no limit") would otherwise take the key exclusively.
func (k *kindFlags) check() error {
	if k.limit < 1 || k.limit > protocol.MaxLimit {
		return protocol.Errorf(protocol.CodeInvalidArgument, "--limit: limit %d is outside [1, %d] (1: a mutex)", k.limit, protocol.MaxLimit)
	}
	return nil
}

// options are the SDK options of the flags (the SDK validates them).
func (k *kindFlags) options() []sdk.AcquireOption {
	var opts []sdk.AcquireOption
	if k.limit != 1 {
		opts = append(opts, sdk.WithLimit(k.limit))
	}
	if k.shared {
		opts = append(opts, sdk.WithShared())
	}
	return opts
}

// kindFields adds a lock's kind to its JSON line: "limit" for a semaphore
// slot, "mode" for a shared hold; nothing for a mutex.
func kindFields(out map[string]any, limit int, shared bool) {
	if limit > 1 {
		out["limit"] = limit
	}
	if shared {
		out["mode"] = protocol.ModeShared
	}
}

// holdersFields adds a get's kind and every holder of a semaphore or a
// shared key.
func holdersFields(out map[string]any, h sdk.Holder) {
	kindFields(out, h.Limit, h.Shared)
	if len(h.Holders) == 0 {
		return
	}
	holders := make([]map[string]any, len(h.Holders))
	for i, x := range h.Holders {
		holders[i] = map[string]any{"token": x.Token, "owner": x.Owner, "lease_ms": x.Lease.Milliseconds(), "remaining_ms": x.Remaining.Milliseconds()}
		if x.Session != "" {
			holders[i]["session"] = x.Session
		}
	}
	out["holders"] = holders
	if h.HoldersMore {
		out["holders_more"] = true
	}
}
