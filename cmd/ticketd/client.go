package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/internal/natsclient"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

const defaultNATS = "nats://127.0.0.1:4222"

// clientFlags are the flags every client command starts from: where
// NATS is, how long to try, and how to authenticate to it (the NATS
// client flags of natsclient.Flags).
type clientFlags struct {
	fs          *pflag.FlagSet
	url         string
	timeout     time.Duration
	partitioned bool
	auth        func() (natsclient.Auth, error)
}

// addClientFlags adds the client flags to cmd.
func addClientFlags(cmd *cobra.Command) *clientFlags {
	fs := cmd.Flags()
	cf := &clientFlags{fs: fs}
	fs.StringVar(&cf.url, "nats", defaultNATS, "NATS URL(s) of any node, comma-separated (no password in it: --nats-user and "+natsclient.PasswordEnv+")")
	fs.DurationVar(&cf.timeout, "timeout", 10*time.Second, "give up after this long")
	fs.BoolVar(&cf.partitioned, "partitioned", false, "the nodes are groups of a partitioned deployment (docs/scaling.md): send each key's requests on its hashed subject, list across every group")
	cf.auth = natsclient.Flags(fs, os.Getenv)
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if natsclient.HasSecret(cf.url) {
			return natsURLPasswordRefusal("nats")
		}
		return nil
	}
	return cf
}

// sdkOptions are the SDK options the parsed flags ask for.
func (c *clientFlags) sdkOptions() ([]sdk.Option, error) {
	a, err := c.auth()
	if err != nil {
		return nil, err
	}
	opts := []sdk.Option{sdk.WithAuth(a)}
	if c.partitioned {
		opts = append(opts, sdk.WithPartitioned())
	}
	return opts, nil
}

// dial connects to NATS as the flags say, with extra SDK options.
func (c *clientFlags) dial(extra ...sdk.Option) (*sdk.Client, error) {
	opts, err := c.sdkOptions()
	if err != nil {
		return nil, err
	}
	return connectSDK(c.url, append(opts, extra...)...)
}

// connectSDK is sdk.Connect whose error, when no server could be reached,
// keeps the OS error of the dial (connection refused, timeout) beside the
// URL.
func connectSDK(url string, opts ...sdk.Option) (*sdk.Client, error) {
	var d natsclient.DialRecorder
	cl, err := sdk.Connect(url, append(opts, sdk.WithNATSOptions(d.Option()))...)
	if err != nil {
		return nil, d.Explain(err)
	}
	return cl, nil
}

// connect dials and bounds the command by --timeout.
func (c *clientFlags) connect(ctx context.Context) (*sdk.Client, context.Context, context.CancelFunc, error) {
	cl, err := c.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return cl, ctx, func() { cancel(); _ = cl.Close() }, nil
}

// fail prints the stable code and message on stderr and picks the exit
// status.
func fail(stderr io.Writer, err error) int {
	if code := sdk.CodeOf(err); code != "" {
		fmt.Fprintf(stderr, "error: %s: %v\n", code, err)
	} else if errors.Is(err, nats.ErrNoServers) {
		// Nothing was sent: the stable code a script retries on.
		fmt.Fprintf(stderr, "error: %s: %v\n", protocol.CodeUnavailable, err)
		fmt.Fprintln(stderr, "hint: no NATS server answered at --nats (default nats://127.0.0.1:4222): is a node running there? `ticketd serve` starts one; nothing was sent")
	} else {
		fmt.Fprintf(stderr, "error: %v\n", err)
	}
	if sdk.IsIndeterminate(err) {
		return exitIndeterminate
	}
	if errors.Is(err, sdk.ErrWrongGroup) {
		fmt.Fprintln(stderr, "hint: the group that answered does not serve this key: the NATS mapping's partition count must equal the nodes' --groups (docs/scaling.md); nothing changed")
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

// acquireOptions are lock acquire's flags.
type acquireOptions struct {
	cf          *clientFlags
	lease, wait time.Duration
	owner       string
	requestID   string
	kind        kindFlags
}

func lockAcquireCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acquire KEY",
		Short: "Take a lock and print its fencing token",
		Long: `Take the lock KEY for --lease and print it as JSON: its fencing token (pass
it to whatever the lock protects, and to renew and release), owner, lease
and deadline. Without --wait the acquire is tried once and fails with
"held" if another owner has the key; with --wait it queues for the key.

Every acquire carries a request_id (random unless --request-id sets one),
so one whose reply was lost is retried safely until --timeout: the cluster
answers a repeat with the grant it already made. Running the command again
with the same --request-id (after exit status 3, say) prints that same
grant ("repeated": true) while it is held, and fails with grant_ended (and
its token) once it ended (docs/protocol.md §5.1). The id names one run's
attempt, not the job: make it unique to the run (random, kept for that
run's re-runs). Two clients that send the same id from the same identity
(every anonymous client is one) both get the one grant, and both hold
the lock.`,
		Example: `  ticketd lock acquire orders/42 --lease 30s
  ticketd lock acquire orders/42 --lease 30s --wait 10s --owner billing-1
  ticketd lock acquire orders/42 --lease 30s --request-id "$RUN_ID"   # RUN_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'), kept for re-runs
  ticketd lock acquire pool/gpu --limit 4 --lease 1m     # one of 4 slots
  ticketd lock acquire config/db --shared --wait 10s     # a reader of a read/write lock`,
		Args: exactArgs("KEY"),
	}
	o := &acquireOptions{cf: addClientFlags(cmd)}
	fs := cmd.Flags()
	fs.DurationVar(&o.lease, "lease", sdk.DefaultLease, "lease length")
	fs.StringVar(&o.owner, "owner", "", ownerFlagHelp)
	fs.DurationVar(&o.wait, "wait", 0, "wait this long in the key's queue (0: try once)")
	fs.StringVar(&o.requestID, "request-id", "", "the acquire's request_id (at most 64 bytes of printable ASCII, unique to this run, never shared with a competing client): a run with the same id gets the grant it already produced; default: random")
	o.kind.add(fs)
	cmd.RunE = bind(o, lockAcquire)
	return cmd
}

func lockAcquire(ctx context.Context, o *acquireOptions, pos []string, stdout, stderr io.Writer) int {
	cf := o.cf
	if o.wait > 0 && cf.timeout < o.wait+2*time.Second {
		cf.timeout = o.wait + 2*time.Second
	}
	if !cf.fs.Changed("owner") {
		o.owner = defaultOwner()
	}
	if err := o.kind.check(); err != nil {
		return fail(stderr, err)
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	opts := []sdk.AcquireOption{sdk.WithLease(o.lease), sdk.WithOwner(o.owner), sdk.WithWait(o.wait)}
	if o.requestID != "" {
		opts = append(opts, sdk.WithRequestID(o.requestID))
	}
	opts = append(opts, o.kind.options()...)
	l, err := cl.Acquire(ctx, pos[0], opts...)
	if err != nil {
		var e *sdk.Error
		if errors.As(err, &e) && e.Code == protocol.CodeGrantEnded {
			fmt.Fprintf(stderr, "hint: the grant this --request-id produced (token %d) has ended (released or expired); acquire again with a new --request-id\n", e.Token)
		}
		return fail(stderr, err)
	}
	out := map[string]any{
		"key":      l.Key,
		"token":    l.Token,
		"owner":    l.Owner,
		"lease_ms": l.Lease.Milliseconds(),
		"index":    l.Index,
		"deadline": l.Deadline().UTC().Format(time.RFC3339Nano),
	}
	if l.Group != nil {
		out["group"] = *l.Group // the token is this group's
	}
	if l.Fence != "" {
		out["fence"] = l.Fence
	}
	if l.RequestID != "" {
		out["request_id"] = l.RequestID
	}
	if l.Repeated {
		out["repeated"] = true
	}
	kindFields(out, l.Limit, l.Shared)
	printJSON(stdout, out)
	return 0
}

// releaseOptions are lock release's flags.
type releaseOptions struct {
	cf    *clientFlags
	token uint64
}

func lockReleaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release KEY --token N",
		Short: "Give a lock back",
		Long: `Release the lock KEY held with fencing token --token. A release with another
token (the lock was lost and granted again) is refused and changes nothing.`,
		Example: `  ticketd lock release orders/42 --token 17`,
		Args:    exactArgs("KEY"),
	}
	o := &releaseOptions{cf: addClientFlags(cmd)}
	cmd.Flags().Uint64Var(&o.token, "token", 0, "fencing token the lock is held with (required)")
	_ = cmd.MarkFlagRequired("token")
	cmd.RunE = bind(o, lockRelease)
	return cmd
}

func lockRelease(ctx context.Context, o *releaseOptions, pos []string, stdout, stderr io.Writer) int {
	cl, ctx, done, err := o.cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	if err := cl.Release(ctx, pos[0], o.token); err != nil {
		return fail(stderr, err)
	}
	printJSON(stdout, map[string]any{"key": pos[0], "released": true, "token": o.token})
	return 0
}

func lockGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show a lock's current holder",
		Long: `Print whether KEY is held and, if it is, its token, owner, lease and the time left (a linearizable read through the leader).
A semaphore (limit N) or a key held shared also shows its limit, its mode and
every holder ("holders", in token order).`,
		Example: `  ticketd lock get orders/42`,
		Args:    exactArgs("KEY"),
	}
	cmd.RunE = bind(addClientFlags(cmd), lockGet)
	return cmd
}

func lockGet(ctx context.Context, cf *clientFlags, pos []string, stdout, stderr io.Writer) int {
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
	holdersFields(out, h)
	printJSON(stdout, out)
	return 0
}

// statusOptions are status's flags.
type statusOptions struct {
	cf       *clientFlags
	watch    bool
	interval time.Duration
	group    uint32
}

func statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster as a node sees it (--watch: a live view of every member)",
		Long: `Print the status of the cluster as JSON: members, leader, term, indexes,
locks, last token, cluster version, alarms and plugins (asked of the leader
when it can be reached), with every member whose plugins differ. --watch
refreshes a compact table of every member until interrupted.`,
		Example: `  ticketd status
  ticketd status --watch --interval 2s`,
		Args: exactArgs(),
	}
	o := &statusOptions{cf: addClientFlags(cmd)}
	cmd.Flags().BoolVar(&o.watch, "watch", false, "refresh a live view of every member until interrupted")
	cmd.Flags().DurationVar(&o.interval, "interval", watchIntervalDefault, "refresh interval of --watch")
	cmd.Flags().Uint32Var(&o.group, "group", 0, "in a partitioned deployment, show this group (default: the group of whichever node answers)")
	cmd.RunE = bind(o, status)
	return cmd
}

func status(ctx context.Context, o *statusOptions, _ []string, stdout, stderr io.Writer) int {
	cf := o.cf
	if o.watch {
		if o.interval <= 0 {
			return usagef(stderr, "--interval must be positive, got %v", o.interval)
		}
		cl, err := cf.dial()
		if err != nil {
			return fail(stderr, err)
		}
		defer cl.Close()
		// --timeout bounds one refresh, not the whole watch.
		return watchStatus(ctx, cl, o.askStatus(cl), o.interval, min(cf.timeout, max(o.interval, time.Second)), stdout)
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	st, err := o.askStatus(cl)(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	ask := memberAsker(cl, st)
	// Per-peer match indexes are known only to the leader: ask it.
	if st.Leader != 0 && st.Leader != st.ID {
		if ls, err := ask(ctx, st.Leader); err == nil {
			st = ls
		}
	}
	printJSON(stdout, statusReport(ctx, ask, st))
	return 0
}

// askStatus asks any node, or with --group a node of that group.
func (o *statusOptions) askStatus(cl *sdk.Client) func(context.Context) (*sdk.Status, error) {
	if o.cf.fs.Changed("group") {
		return func(ctx context.Context) (*sdk.Status, error) { return cl.GroupStatus(ctx, o.group) }
	}
	return cl.Status
}

// memberAsker asks a member of st's cluster for its own status: in a
// partitioned deployment on its group's subject (raft ids repeat across
// groups).
func memberAsker(cl *sdk.Client, st *sdk.Status) askMember {
	if st.Group == nil {
		return cl.NodeStatus
	}
	g := *st.Group
	return func(ctx context.Context, id uint64) (*protocol.StatusReply, error) {
		return cl.GroupNodeStatus(ctx, g, id)
	}
}
