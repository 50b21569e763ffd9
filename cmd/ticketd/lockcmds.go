package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// renewOptions are lock renew's flags.
type renewOptions struct {
	cf    *clientFlags
	lease time.Duration
}

func lockRenewCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "renew KEY TOKEN",
		Short: "Lengthen a held lock's lease",
		Long: `Renew the lock KEY held with fencing token TOKEN: its lease starts again now
(--lease: a new lease length; a renewal never shortens it). Refused if the
lock is no longer held with TOKEN.`,
		Example: `  ticketd lock renew orders/42 17
  ticketd lock renew orders/42 17 --lease 1m`,
		Args: exactArgs("KEY", "TOKEN"),
	}
	o := &renewOptions{cf: addClientFlags(cmd)}
	cmd.Flags().DurationVar(&o.lease, "lease", 0, "new lease, counted from now (0: keep the lock's lease; a renewal never shortens it)")
	cmd.RunE = bind(o, lockRenew)
	return cmd
}

// lockRenew is `ticketd lock renew KEY TOKEN [--lease D]`.
func lockRenew(ctx context.Context, o *renewOptions, pos []string, stdout, stderr io.Writer) int {
	token, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil || token == 0 {
		return usagef(stderr, "TOKEN must be a positive integer, got %q", pos[1])
	}
	cl, ctx, done, err := o.cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	rn, err := cl.Renew(ctx, pos[0], token, o.lease)
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

// lsOptions are lock ls's flags.
type lsOptions struct {
	cf    *clientFlags
	limit int
	group uint32
}

func lockLsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ls PREFIX",
		Short: "List the held locks under a prefix",
		Long: `Print every held lock whose key starts with PREFIX, one JSON object a line,
reading every page (--limit locks a page). An empty PREFIX ("") lists all.
Every holder of a semaphore or of a key held shared has its own line, with
the key's "limit" and "mode".`,
		Example: `  ticketd lock ls orders/
  ticketd lock ls "" --limit 1000`,
		Args: exactArgs("PREFIX"),
	}
	o := &lsOptions{cf: addClientFlags(cmd)}
	cmd.Flags().IntVar(&o.limit, "limit", protocol.DefaultListLimit, fmt.Sprintf("locks per page (1..%d); ls reads every page", protocol.MaxListLimit))
	cmd.Flags().Uint32Var(&o.group, "group", 0, "in a partitioned deployment, list this group's locks only (default with --partitioned: every group's)")
	cmd.RunE = bind(o, lockLs)
	return cmd
}

// lockLs is `ticketd lock ls PREFIX [--limit N]`: every held lock under
// PREFIX, one JSON object a line, read page by page.
func lockLs(ctx context.Context, o *lsOptions, pos []string, stdout, stderr io.Writer) int {
	if o.limit < 1 || o.limit > protocol.MaxListLimit {
		return usagef(stderr, "--limit %d is outside [1, %d]", o.limit, protocol.MaxListLimit)
	}
	cl, ctx, done, err := o.cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	all := cl.ListAll(ctx, pos[0], o.limit)
	if o.cf.fs.Changed("group") {
		all = cl.ListGroupAll(ctx, o.group, pos[0], o.limit)
	}
	for h, err := range all {
		if err != nil {
			return fail(stderr, err)
		}
		out := map[string]any{
			"key":          h.Key,
			"token":        h.Token,
			"owner":        h.Owner,
			"lease_ms":     h.Lease.Milliseconds(),
			"remaining_ms": h.Remaining.Milliseconds(),
		}
		if h.Group != nil {
			out["group"] = *h.Group
		}
		kindFields(out, h.Limit, h.Shared)
		printJSON(stdout, out)
	}
	return 0
}

func lockWatchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "watch KEY",
		Short: "Print a key's grant, release, expire and renew events until interrupted",
		Long: `Print one JSON line per event on KEY (grant, release, expire, renew) published
after now, until interrupted (exit 0). Events are a best-effort feed: use
lock get for the current holder.`,
		Example: `  ticketd lock watch orders/42`,
		Args:    exactArgs("KEY"),
	}
	cmd.RunE = bind(addClientFlags(cmd), lockWatch)
	return cmd
}

// lockWatch is `ticketd lock watch KEY`: one JSON line per event until
// interrupted (exit 0).
func lockWatch(ctx context.Context, cf *clientFlags, pos []string, stdout, stderr io.Writer) int {
	cl, err := cf.dial(sdk.WithRequestTimeout(cf.timeout))
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
