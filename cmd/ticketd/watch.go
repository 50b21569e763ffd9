package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// watchIntervalDefault is how often `status --watch` refreshes.
const watchIntervalDefault = time.Second

// sample is one member's status at one refresh, kept to turn counters
// into rates at the next.
type sample struct {
	at        time.Time
	applied   uint64
	lastToken uint64
}

// watchStatus refreshes a compact view of every member until ctx ends
// (SIGINT or SIGTERM), then returns 0. Each refresh asks any node for the
// membership and every member, on its own status subject, for its view;
// a member that does not answer is shown as unreachable. On a terminal the
// screen is redrawn; otherwise each refresh is appended, so the output can
// be piped or logged.
func watchStatus(ctx context.Context, cl *sdk.Client, ask func(context.Context) (*sdk.Status, error), interval, timeout time.Duration, stdout io.Writer) int {
	redraw := isTerminal(stdout)
	prev := map[uint64]sample{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		view := refresh(rctx, cl, ask, prev)
		cancel()
		if ctx.Err() != nil {
			return 0
		}
		if redraw {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
		}
		fmt.Fprint(stdout, view)
		if !redraw {
			fmt.Fprintln(stdout)
		}
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

// refresh renders one view and updates prev with this refresh's samples.
func refresh(ctx context.Context, cl *sdk.Client, ask func(context.Context) (*sdk.Status, error), prev map[uint64]sample) string {
	now := time.Now()
	first, err := ask(ctx)
	if err != nil {
		return fmt.Sprintf("ticketd  %s  no node answered: %v\n", now.UTC().Format(time.RFC3339), err)
	}
	views, errs := askMembers(ctx, memberAsker(cl, first), memberIDs(first), first)
	return renderView(now, first, views, errs, prev)
}

// renderView is one refresh: a header from first (the node that answered
// the cluster-wide status subject) and a row per member from its own
// answer, or "unreachable" without one. LAG is the leader's commit index
// minus the member's applied index; the rates are per second since the
// previous refresh (prev, which it updates): applied entries, and tokens
// issued (grants). VERSION is the member's binary, FORMAT the highest
// cluster version it reads, ALARMS its active alarms.
func renderView(now time.Time, first *sdk.Status, views map[uint64]*sdk.Status, errs map[uint64]error, prev map[uint64]sample) string {
	var b strings.Builder
	ids := memberIDs(first)
	leader := first.Leader
	var leaderCommit uint64
	if lv := views[leader]; lv != nil {
		leaderCommit = lv.CommitIndex
	}
	fmt.Fprintf(&b, "ticketd  %s  leader %d  term %d  members %d  cluster_version %d\n",
		now.UTC().Format(time.RFC3339), leader, first.Term, len(ids), first.ClusterVersion)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ID\tROLE\tTERM\tCOMMIT\tAPPLIED\tLAG\tLOCKS\tLAST_TOKEN\tAPPLIED/s\tGRANTS/s\tFORMAT\tALARMS\tVERSION\t")
	for _, id := range ids {
		st := views[id]
		if st == nil {
			fmt.Fprintf(tw, "%d\tunreachable\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", id)
			continue
		}
		lag := "-"
		if leaderCommit > 0 {
			lag = fmt.Sprint(int64(leaderCommit) - int64(st.AppliedIndex))
		}
		applyRate, grantRate := "-", "-"
		if p, ok := prev[id]; ok {
			if secs := now.Sub(p.at).Seconds(); secs > 0 && st.AppliedIndex >= p.applied && st.LastToken >= p.lastToken {
				applyRate = fmt.Sprintf("%.1f", float64(st.AppliedIndex-p.applied)/secs)
				grantRate = fmt.Sprintf("%.1f", float64(st.LastToken-p.lastToken)/secs)
			}
		}
		prev[id] = sample{at: now, applied: st.AppliedIndex, lastToken: st.LastToken}
		alarms := "-"
		if len(st.Alarms) > 0 {
			alarms = strings.Join(st.Alarms, ",")
		}
		version := "-"
		if st.Version != "" {
			// One column: a revision after a space would split it.
			version = strings.ReplaceAll(st.Version, " ", "@")
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t\n", id, roleOf(st, first), st.Term,
			st.CommitIndex, st.AppliedIndex, lag, st.Locks, st.LastToken, applyRate, grantRate, max(1, st.MaxClusterVersion), alarms, version)
	}
	_ = tw.Flush()
	for _, id := range ids {
		if err, ok := errs[id]; ok {
			delete(prev, id)
			fmt.Fprintf(&b, "node %d: %v\n", id, err)
		}
	}
	return b.String()
}

// isTerminal reports whether w is a character device (a terminal), where
// the view may redraw the screen.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
