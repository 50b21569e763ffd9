package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
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
func watchStatus(ctx context.Context, cl *sdk.Client, interval, timeout time.Duration, stdout io.Writer) int {
	redraw := isTerminal(stdout)
	prev := map[uint64]sample{}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		view := refresh(rctx, cl, prev)
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
// LAG is the leader's commit index minus the member's applied index;
// the rates are per second since the previous refresh: applied entries,
// and tokens issued (grants).
func refresh(ctx context.Context, cl *sdk.Client, prev map[uint64]sample) string {
	var b strings.Builder
	now := time.Now()
	first, err := cl.Status(ctx)
	if err != nil {
		fmt.Fprintf(&b, "ticketd  %s  no node answered: %v\n", now.UTC().Format(time.RFC3339), err)
		return b.String()
	}
	ids := make([]uint64, 0, len(first.Members))
	for _, m := range first.Members {
		ids = append(ids, m.ID)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	views := make(map[uint64]*sdk.Status, len(ids))
	errs := make(map[uint64]error)
	for _, id := range ids {
		if id == first.ID {
			views[id] = first
			continue
		}
		st, err := cl.NodeStatus(ctx, id)
		if err != nil {
			errs[id] = err
			continue
		}
		views[id] = st
	}
	leader := first.Leader
	var leaderCommit uint64
	if lv := views[leader]; lv != nil {
		leaderCommit = lv.CommitIndex
	}
	fmt.Fprintf(&b, "ticketd  %s  leader %d  term %d  members %d  cluster_version %d\n",
		now.UTC().Format(time.RFC3339), leader, first.Term, len(ids), first.ClusterVersion)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ID\tROLE\tTERM\tCOMMIT\tAPPLIED\tLAG\tLOCKS\tLAST_TOKEN\tAPPLIED/s\tGRANTS/s\t")
	for _, id := range ids {
		st := views[id]
		if st == nil {
			fmt.Fprintf(tw, "%d\tunreachable\t-\t-\t-\t-\t-\t-\t-\t-\t\n", id)
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
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t\n", id, role(st.State), st.Term,
			st.CommitIndex, st.AppliedIndex, lag, st.Locks, st.LastToken, applyRate, grantRate)
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

// role shortens raft's state names: StateLeader -> leader.
func role(state string) string {
	return strings.ToLower(strings.TrimPrefix(state, "State"))
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
