package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

const defaultNATS = "nats://127.0.0.1:4222"

type clientFlags struct {
	fs      *pflag.FlagSet
	url     *string
	timeout *time.Duration
	auth    func() (natsclient.Auth, error)
}

// newClientFlags is the flag set every client command starts from: where
// NATS is, how long to try, and how to authenticate to it (the NATS
// client flags of natsclient.Flags).
func newClientFlags(name string, stderr io.Writer) clientFlags {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	return clientFlags{
		fs:      fs,
		url:     fs.String("nats", defaultNATS, "NATS URL of any node"),
		timeout: fs.Duration("timeout", 10*time.Second, "give up after this long"),
		auth:    natsclient.Flags(fs, os.Getenv),
	}
}

// sdkOptions are the SDK options the parsed flags ask for.
func (c clientFlags) sdkOptions() ([]sdk.Option, error) {
	a, err := c.auth()
	if err != nil {
		return nil, err
	}
	return []sdk.Option{sdk.WithAuth(a)}, nil
}

// parse parses args and returns exactly want positional arguments.
func (c clientFlags) parse(args []string, want int, stderr io.Writer) ([]string, int, bool) {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, 0, false
		}
		return nil, exitUsage, false
	}
	if c.fs.NArg() != want {
		fmt.Fprintf(stderr, "ticketd %s: want %d argument(s), got %d\n", c.fs.Name(), want, c.fs.NArg())
		return nil, exitUsage, false
	}
	return c.fs.Args(), 0, true
}

func (c clientFlags) connect(ctx context.Context) (*sdk.Client, context.Context, context.CancelFunc, error) {
	opts, err := c.sdkOptions()
	if err != nil {
		return nil, nil, nil, err
	}
	cl, err := sdk.Connect(*c.url, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, *c.timeout)
	return cl, ctx, func() { cancel(); _ = cl.Close() }, nil
}

// fail prints the stable code and message on stderr and picks the exit
// status.
func fail(stderr io.Writer, err error) int {
	code := sdk.CodeOf(err)
	if code == "" {
		code = "error"
	}
	fmt.Fprintf(stderr, "error: %s: %v\n", code, err)
	if sdk.IsIndeterminate(err) {
		return exitIndeterminate
	}
	if errors.Is(err, sdk.ErrResourceExhausted) {
		fmt.Fprintln(stderr, "hint: a cluster limit was reached (locks, your quota, waiters, or the leader's disk); nothing changed; retry later")
		return exitResourceExhausted
	}
	return exitFailure
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func lockAcquire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock acquire", stderr)
	lease := cf.fs.Duration("lease", sdk.DefaultLease, "lease length")
	owner := cf.fs.String("owner", "", "owner correlation id")
	wait := cf.fs.Duration("wait", 0, "wait this long in the key's queue (0: try once)")
	pos, code, ok := cf.parse(args, 1, stderr)
	if !ok {
		return code
	}
	if *wait > 0 && *cf.timeout < *wait+2*time.Second {
		*cf.timeout = *wait + 2*time.Second
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	l, err := cl.Acquire(ctx, pos[0], sdk.WithLease(*lease), sdk.WithOwner(*owner), sdk.WithWait(*wait))
	if err != nil {
		return fail(stderr, err)
	}
	printJSON(stdout, map[string]any{
		"key":      l.Key,
		"token":    l.Token,
		"owner":    l.Owner,
		"lease_ms": l.Lease.Milliseconds(),
		"index":    l.Index,
		"deadline": l.Deadline().UTC().Format(time.RFC3339Nano),
	})
	return 0
}

func lockRelease(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock release", stderr)
	token := cf.fs.Uint64("token", 0, "fencing token the lock is held with")
	pos, code, ok := cf.parse(args, 1, stderr)
	if !ok {
		return code
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	if err := cl.Release(ctx, pos[0], *token); err != nil {
		return fail(stderr, err)
	}
	printJSON(stdout, map[string]any{"key": pos[0], "released": true, "token": *token})
	return 0
}

func lockGet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock get", stderr)
	pos, code, ok := cf.parse(args, 1, stderr)
	if !ok {
		return code
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	h, err := cl.Get(ctx, pos[0])
	if err != nil {
		return fail(stderr, err)
	}
	out := map[string]any{"key": h.Key, "held": h.Held}
	if h.Held {
		out["token"] = h.Token
		out["owner"] = h.Owner
		out["lease_ms"] = h.Lease.Milliseconds()
		out["remaining_ms"] = h.Remaining.Milliseconds()
	}
	printJSON(stdout, out)
	return 0
}

func status(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("status", stderr)
	watch := cf.fs.Bool("watch", false, "refresh a live view of every member until interrupted")
	interval := cf.fs.Duration("interval", watchIntervalDefault, "refresh interval of --watch")
	if _, code, ok := cf.parse(args, 0, stderr); !ok {
		return code
	}
	if *watch {
		if *interval <= 0 {
			fmt.Fprintln(stderr, "ticketd status: --interval must be positive")
			return exitUsage
		}
		cl, err := sdk.Connect(*cf.url)
		if err != nil {
			return fail(stderr, err)
		}
		defer cl.Close()
		// --timeout bounds one refresh, not the whole watch.
		return watchStatus(ctx, cl, *interval, min(*cf.timeout, max(*interval, time.Second)), stdout)
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	st, err := cl.Status(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	// Per-peer match indexes are known only to the leader: ask it.
	if st.Leader != 0 && st.Leader != st.ID {
		subj := protocol.NodeStatusSubject(st.Leader)
		if m, err := cl.Conn().RequestWithContext(ctx, subj, []byte("{}")); err == nil {
			var ls protocol.StatusReply
			if protocol.ParseReply(m.Data, &ls) == nil {
				st = &ls
			}
		}
	}
	printJSON(stdout, statusWithPluginCheck(ctx, cl.Conn(), st))
	return 0
}

// statusWithPluginCheck asks every member for its plugins and reports the
// members whose modules differ from this node's: different modules can
// give different Grant verdicts on different leaders.
func statusWithPluginCheck(ctx context.Context, nc *nats.Conn, st *protocol.StatusReply) any {
	want := pluginSet(st.Plugins)
	type mismatch struct {
		ID      uint64                `json:"id"`
		Plugins []protocol.PluginInfo `json:"plugins"`
		Error   string                `json:"error,omitempty"`
	}
	var diff []mismatch
	for _, m := range st.Members {
		if m.ID == st.ID {
			continue
		}
		subj := protocol.NodeStatusSubject(m.ID)
		msg, err := nc.RequestWithContext(ctx, subj, []byte("{}"))
		if err != nil {
			diff = append(diff, mismatch{ID: m.ID, Error: err.Error()})
			continue
		}
		var ms protocol.StatusReply
		if err := protocol.ParseReply(msg.Data, &ms); err != nil {
			diff = append(diff, mismatch{ID: m.ID, Error: err.Error()})
			continue
		}
		if pluginSet(ms.Plugins) != want {
			diff = append(diff, mismatch{ID: m.ID, Plugins: ms.Plugins})
		}
	}
	if len(diff) == 0 {
		return st
	}
	return struct {
		*protocol.StatusReply
		PluginMismatch []mismatch `json:"plugin_mismatch"`
	}{st, diff}
}

func pluginSet(ps []protocol.PluginInfo) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p.Name+"="+p.SHA256)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
