package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// lockRenew is `ticketd lock renew KEY TOKEN [--lease D]`.
func lockRenew(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock renew", stderr)
	lease := cf.fs.Duration("lease", 0, "new lease, counted from now (0: keep the lock's lease; a renewal never shortens it)")
	pos, code, ok := cf.parse(args, 2, stderr)
	if !ok {
		return code
	}
	token, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil || token == 0 {
		fmt.Fprintf(stderr, "ticketd lock renew: TOKEN must be a positive integer, got %q\n", pos[1])
		return exitUsage
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	rn, err := cl.Renew(ctx, pos[0], token, *lease)
	if err != nil {
		return fail(stderr, err)
	}
	printJSON(stdout, map[string]any{
		"key":      rn.Key,
		"token":    rn.Token,
		"lease_ms": rn.Lease.Milliseconds(),
		"index":    rn.Index,
		"deadline": rn.Deadline.UTC().Format(time.RFC3339Nano),
	})
	return 0
}

// lockLs is `ticketd lock ls PREFIX [--limit N]`: every held lock under
// PREFIX, one JSON object a line, read page by page.
func lockLs(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock ls", stderr)
	limit := cf.fs.Int("limit", protocol.DefaultListLimit, fmt.Sprintf("locks per page (1..%d); ls reads every page", protocol.MaxListLimit))
	pos, code, ok := cf.parse(args, 1, stderr)
	if !ok {
		return code
	}
	if *limit < 1 || *limit > protocol.MaxListLimit {
		fmt.Fprintf(stderr, "ticketd lock ls: --limit must be within [1, %d]\n", protocol.MaxListLimit)
		return exitUsage
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	for h, err := range cl.ListAll(ctx, pos[0], *limit) {
		if err != nil {
			return fail(stderr, err)
		}
		printJSON(stdout, map[string]any{
			"key":          h.Key,
			"token":        h.Token,
			"owner":        h.Owner,
			"lease_ms":     h.Lease.Milliseconds(),
			"remaining_ms": h.Remaining.Milliseconds(),
		})
	}
	return 0
}

// lockWatch is `ticketd lock watch KEY`: one JSON line per event until
// interrupted (exit 0).
func lockWatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock watch", stderr)
	pos, code, ok := cf.parse(args, 1, stderr)
	if !ok {
		return code
	}
	opts, err := cf.sdkOptions()
	if err != nil {
		return fail(stderr, err)
	}
	cl, err := sdk.Connect(*cf.url, append(opts, sdk.WithRequestTimeout(*cf.timeout))...)
	if err != nil {
		return fail(stderr, err)
	}
	defer cl.Close()
	// --timeout bounds the subscription, not the watch.
	events, err := cl.Watch(ctx, pos[0])
	if err != nil {
		return fail(stderr, err)
	}
	fmt.Fprintf(stderr, "watching %q on %s (events published after now; Ctrl-C to stop)\n", pos[0], protocol.WatchSubject(pos[0]))
	for ev := range events {
		printJSON(stdout, ev)
	}
	return 0
}
