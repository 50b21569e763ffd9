package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

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
func lockExec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cf := newClientFlags("lock exec", stderr)
	lease := cf.fs.Duration("lease", 10*time.Second, "lease, renewed while the command runs")
	wait := cf.fs.Duration("wait", 30*time.Second, "wait this long in the key's queue (0: try once)")
	grace := cf.fs.Duration("grace", defaultExecGrace, "between SIGTERM and SIGKILL when the lock is lost (default: 5s, or a quarter of --lease if less)")
	owner := cf.fs.String("owner", defaultExecOwner(), "owner correlation id")
	if err := cf.fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if cf.fs.ArgsLenAtDash() != 1 || cf.fs.NArg() < 2 {
		fmt.Fprintln(stderr, "usage: ticketd lock exec KEY [flags] -- CMD [ARGS...]")
		return exitUsage
	}
	key, argv := cf.fs.Arg(0), cf.fs.Args()[1:]
	if !cf.fs.Changed("grace") {
		*grace = min(defaultExecGrace, *lease/4)
	}
	margin := *grace + execKillMargin
	if *grace < 0 || margin > *lease*3/4 {
		fmt.Fprintf(stderr, "ticketd lock exec: --lease %v is too short for --grace %v: it must be at least 4/3 of (grace + %v)\n", *lease, *grace, execKillMargin)
		return exitUsage
	}
	opts, err := cf.sdkOptions()
	if err != nil {
		return fail(stderr, err)
	}
	cl, err := sdk.Connect(*cf.url, opts...)
	if err != nil {
		return fail(stderr, err)
	}
	defer cl.Close()
	actx, cancel := context.WithTimeout(ctx, *wait+*cf.timeout)
	l, err := cl.Acquire(actx, key, sdk.WithLease(*lease), sdk.WithWait(*wait), sdk.WithOwner(*owner),
		sdk.WithAutoRenew(sdk.WithSafetyMargin(margin)))
	cancel()
	if err != nil {
		return fail(stderr, err)
	}
	status := runLocked(l, argv, stdout, stderr)
	// The command is gone: give the lock back (it may still exist even if
	// it was "lost" locally; the token makes this safe either way).
	// A lost lock is usually unreachable: do not hold the exit for long.
	rtimeout := *cf.timeout
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
	cmd := guardedCommand(argv)
	cmd.Env = append(environ(), "TICKETD_KEY="+l.Key, "TICKETD_TOKEN="+strconv.FormatUint(l.Token, 10))
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

// defaultExecOwner names this process in the lock (get, ls, audit).
func defaultExecOwner() string {
	host, _ := os.Hostname()
	o := fmt.Sprintf("exec@%s:%d", host, os.Getpid())
	if len(o) > core.MaxOwnerLen {
		o = o[:core.MaxOwnerLen]
	}
	return o
}
