package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/sdk"
)

// execKillMargin is what lock exec keeps between its SIGKILL and the
// lock's local deadline: time for a late timer and for the kernel to
// deliver the kill.
const execKillMargin = 250 * time.Millisecond

// defaultExecGrace is --grace unless the lease is shorter than 4 of it.
const defaultExecGrace = 5 * time.Second

// lostReleaseTimeout bounds the release after the lock was lost.
const lostReleaseTimeout = 2 * time.Second

// Exit statuses of lock exec that are its own, not the command's
// (as the shell uses them).
const (
	exitCannotRun = 126
	exitNotFound  = 127
)

// lockExec is `ticketd lock exec KEY [--lease] [--wait] [--grace] -- CMD ARGS...`.
//
// The timing that keeps the command from outliving the lock. Let D be
// the lock's local deadline (send time of the last confirmed renewal +
// lease). The keepalive renews every (lease - margin)/3 with margin =
// grace + execKillMargin, and when no renewal got through by D - margin
// (or one is refused) Lost fires; then:
//
//	SIGTERM to the command's process group  at  D - grace - execKillMargin
//	SIGKILL to the group                    at  D - execKillMargin
//	the group is dead by                       D - execKillMargin + (timer lateness + kill delivery) < D
//
// so nothing it started runs past D, as long as timers and kill delivery
// take under execKillMargin. When the command exits (lock lost or not),
// whatever it left running in its group is killed before the release. The command runs in its own process group
// (so that whatever it starts is stopped too); ticketd forwards SIGINT,
// SIGTERM and SIGHUP to that group. On Linux a guard process leads that group
// and kills it when lock exec dies, even by SIGKILL (execguard_linux.go).
// execOptions are lock exec's flags.
type execOptions struct {
	cf                 *clientFlags
	lease, wait, grace time.Duration
	owner              string
	// sessionTTL, when set, holds the keys in one session (sessionexec.go);
	// lockDelay is the lock-delay of the lock, or of the session's locks.
	sessionTTL, lockDelay time.Duration
	kind                  kindFlags
}

func lockExecCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec KEY [KEY...] [flags] -- COMMAND [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Take the lock KEY (waiting up to --wait), run COMMAND with TICKETD_KEY and
TICKETD_TOKEN in its environment while the lease is renewed, and release the
lock when it ends. If the lock is lost, the command's process group gets
SIGTERM, then SIGKILL --grace later, before the lease can end. lock exec
exits with the command's status (126: cannot run, 127: not found, 128+N:
killed by signal N).

With --session-ttl, the keys (one or more, at most 100) are held in one
session kept alive every third of its TTL instead of a lease each: they are
taken in sorted order (so two lock execs never wait on each other in a
cycle), each waiting up to --wait, and released together in one command
when the command ends. The command gets TICKETD_KEY_<i> and
TICKETD_TOKEN_<i> (i from 1, in sorted order) besides TICKETD_KEY and
TICKETD_TOKEN of the first key. Needs cluster version 4.`,
		Example: `  ticketd lock exec nightly/report --lease 30s -- ./report.sh --full
  ticketd lock exec db/migrate --wait 5m -- sh -c 'make migrate'
  ticketd lock exec db/a db/b --session-ttl 10s --wait 1m -- ./move.sh a b
  ticketd lock exec pool/gpu --limit 4 --wait 10m -- ./train.sh     # one of 4 at a time
  ticketd lock exec config/db --shared -- ./read-config.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			n := cmd.ArgsLenAtDash()
			if n < 1 || len(args) <= n {
				return fmt.Errorf("%q needs KEY [KEY...] -- COMMAND [ARGS...] (the command after \"--\")", cmd.CommandPath())
			}
			if n > 1 && !cmd.Flags().Changed("session-ttl") {
				return fmt.Errorf("%q takes several keys only with --session-ttl (they are held in one session)", cmd.CommandPath())
			}
			if n > maxExecKeys {
				return fmt.Errorf("%q takes at most %d keys", cmd.CommandPath(), maxExecKeys)
			}
			return nil
		},
	}
	o := &execOptions{cf: addClientFlags(cmd)}
	fs := cmd.Flags()
	fs.DurationVar(&o.lease, "lease", 10*time.Second, "lease, renewed while the command runs")
	fs.DurationVar(&o.wait, "wait", 30*time.Second, "wait this long in the key's queue (0: try once)")
	fs.DurationVar(&o.grace, "grace", defaultExecGrace, "between SIGTERM and SIGKILL when the lock is lost (default: 5s, or a quarter of --lease if less)")
	fs.StringVar(&o.owner, "owner", "", ownerFlagHelp)
	fs.DurationVar(&o.sessionTTL, "session-ttl", 0, "hold the keys in one session with this TTL instead of a lease each (not with --lease)")
	fs.DurationVar(&o.lockDelay, "lock-delay", 0, "if this process dies and its lease or session runs out, the keys stay unavailable this long more (at most 60s; cluster version 4)")
	o.kind.add(fs)
	cmd.RunE = bind(o, func(ctx context.Context, o *execOptions, args []string, stdout, stderr io.Writer) int {
		if err := o.kind.check(); err != nil {
			return fail(stderr, err)
		}
		if o.cf.fs.Changed("session-ttl") {
			n := o.cf.fs.ArgsLenAtDash() // Args checked it: 1..maxExecKeys keys
			return sessionExec(ctx, o, args[:n], args[n:], stdout, stderr)
		}
		return lockExec(ctx, o, args, stdout, stderr)
	})
	return cmd
}

func lockExec(ctx context.Context, o *execOptions, args []string, stdout, stderr io.Writer) int {
	cf := o.cf
	key, argv := args[0], args[1:]
	if !cf.fs.Changed("grace") {
		o.grace = min(defaultExecGrace, o.lease/4)
	}
	if !cf.fs.Changed("owner") {
		o.owner = defaultOwner()
	}
	margin := o.grace + execKillMargin
	if o.grace < 0 || margin > o.lease*3/4 {
		return usagef(stderr, "--lease %v is too short for --grace %v: it must be at least 4/3 of (grace + %v)", o.lease, o.grace, execKillMargin)
	}
	// Resolve the command before taking the lock: a command that cannot
	// run must not use up a token (nor make others wait).
	if _, err := exec.LookPath(argv[0]); err != nil {
		fmt.Fprintf(stderr, "error: lock exec: %v (no lock taken)\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	cl, err := cf.dial()
	if err != nil {
		return fail(stderr, err)
	}
	defer cl.Close()
	actx, cancel := context.WithTimeout(ctx, o.wait+cf.timeout)
	opts := append(o.kind.options(), sdk.WithLease(o.lease), sdk.WithWait(o.wait), sdk.WithOwner(o.owner),
		sdk.WithLockDelay(o.lockDelay), sdk.WithAutoRenew(sdk.WithSafetyMargin(margin)))
	l, err := cl.Acquire(actx, key, opts...)
	cancel()
	if err != nil {
		return fail(stderr, err)
	}
	status := runLocked(l, argv, stdout, stderr)
	// The command is gone: give the lock back (it may still exist even if
	// it was "lost" locally; the token makes this safe either way).
	// A lost lock is usually unreachable: do not hold the exit for long.
	rtimeout := cf.timeout
	if errors.Is(l.Err(), sdk.ErrLost) {
		rtimeout = min(rtimeout, lostReleaseTimeout)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), rtimeout)
	defer rcancel()
	if err := l.Release(rctx); err != nil && !errors.Is(err, sdk.ErrNotFound) {
		fmt.Fprintf(stderr, "ticketd lock exec: release: %v (the lock expires within its lease)\n", err)
	}
	return status
}

// runLocked runs argv while l is held and returns its exit status.
func runLocked(l *sdk.Lock, argv []string, stdout, stderr io.Writer) int {
	return runLockedEnv(l, argv, nil, stdout, stderr)
}

// runLockedEnv is runLocked with extra environment variables.
func runLockedEnv(l *sdk.Lock, argv, extra []string, stdout, stderr io.Writer) int {
	cmd := guardedCommand(argv)
	cmd.Env = append(append(environ(), "TICKETD_KEY="+l.Key, "TICKETD_TOKEN="+strconv.FormatUint(l.Token, 10)), extra...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// Registered before the start, so no signal falls between. SIGHUP (a
	// closed terminal) is forwarded too, so the command can end and the
	// lock be released, unless it was ignored (nohup).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if !signal.Ignored(syscall.SIGHUP) {
		signal.Notify(sigs, syscall.SIGHUP)
	}
	defer signal.Stop(sigs)
	if err := l.Err(); err != nil {
		// Lost between the grant and now (a slow first renewal): the
		// command must not start on a lock that may be gone.
		fmt.Fprintf(stderr, "ticketd lock exec: not starting the command: %v\n", err)
		return exitFailure
	}
	exited, err := startLockedThread(cmd)
	if err != nil {
		fmt.Fprintf(stderr, "ticketd lock exec: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	group := -cmd.Process.Pid
	var kill <-chan time.Time
	lost := l.Lost()
	for {
		select {
		case err := <-exited:
			// Nothing the command started in its group may outlive the
			// lock, which is released next.
			_ = syscall.Kill(group, syscall.SIGKILL)
			if lost == nil {
				fmt.Fprintf(stderr, "ticketd lock exec: the command ended %v before the lock's deadline %s\n",
					time.Until(l.Deadline()).Round(time.Millisecond), l.Deadline().UTC().Format(time.RFC3339Nano))
			}
			return exitStatus(cmd.ProcessState, err, stderr)
		case sig := <-sigs:
			_ = syscall.Kill(group, sig.(syscall.Signal))
		case <-lost:
			lost = nil
			// SIGKILL is timed from the deadline, not from now: a late
			// Lost (or a late timer) must not push it past the deadline.
			killIn := max(0, time.Until(l.Deadline().Add(-execKillMargin)))
			fmt.Fprintf(stderr, "ticketd lock exec: %v; the lock's deadline is %s (in %v): SIGTERM now, SIGKILL in %v\n",
				l.Err(), l.Deadline().UTC().Format(time.RFC3339Nano), time.Until(l.Deadline()).Round(time.Millisecond), killIn.Round(time.Millisecond))
			_ = syscall.Kill(group, syscall.SIGTERM)
			kill = time.After(killIn)
		case <-kill:
			kill = nil
			_ = syscall.Kill(group, syscall.SIGKILL)
		}
	}
}

// exitStatus is the command's exit status, 128+N if signal N ended it.
func exitStatus(ps *os.ProcessState, err error, stderr io.Writer) int {
	if ps == nil {
		fmt.Fprintf(stderr, "ticketd lock exec: %v\n", err)
		return exitFailure
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// ownerFlagHelp describes --owner of lock acquire and lock exec.
const ownerFlagHelp = "owner correlation id shown by get, ls and audit (default USER@HOST:PID of this process)"

// defaultOwner names this process in a lock it takes (lock acquire and
// lock exec): USER@HOST:PID, cut to core.MaxOwnerLen.
func defaultOwner() string {
	name := os.Getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	host, _ := os.Hostname()
	o := fmt.Sprintf("%s@%s:%d", name, host, os.Getpid())
	if len(o) > core.MaxOwnerLen {
		o = o[:core.MaxOwnerLen]
	}
	return o
}
