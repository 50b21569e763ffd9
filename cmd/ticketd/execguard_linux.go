package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// execGuardArg, as the first argument, runs the binary as lock exec's
// guard: the process between `ticketd lock exec` and the command.
//
// Why a guard: the command must not outlive the lock, and a `ticketd lock
// exec` killed with SIGKILL can neither renew the lock nor stop the
// command. The guard leads the command's process group and is started
// with a parent-death signal (PR_SET_PDEATHSIG), so the kernel tells it
// when lock exec dies, however it died; it then kills the whole group
// (the command and whatever it started there) at once, long before the
// lock's lease can end. The command itself gets SIGKILL as its own
// parent-death signal, should the guard die first.
const execGuardArg = "__lock-exec-guard"

// guardDeathSignal is the guard's parent-death signal. It is caught, not
// fatal, and acted on only when the parent is really gone (a stray
// SIGHUP sent to the group changes nothing).
const guardDeathSignal = syscall.SIGHUP

// guardParentCheck is how often the guard also looks whether its parent
// is gone: the kernel clears a parent-death signal on executing a binary
// with file capabilities or set-id bits, and an inherited ignored SIGHUP
// (nohup) would swallow it.
const guardParentCheck = 100 * time.Millisecond

// guardCaught is the signals that would end a Go program (os/signal:
// SIGHUP, SIGINT, SIGTERM exit, SIGQUIT exits with a stack dump; other
// asynchronous signals such as SIGUSR1 are caught and dropped by the
// runtime) and that a user may send to the command's process group: the
// guard catches them (the command, in the group, gets them itself),
// unless they were ignored when it started, so that the command inherits
// the same dispositions it would have had without the guard.
func guardCaught() []os.Signal {
	return []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT}
}

// guardedCommand is the command lock exec starts for argv: the guard,
// which runs argv. /proc/self/exe is this very binary even if its file was
// replaced meanwhile.
func guardedCommand(argv []string) *exec.Cmd {
	args := append([]string{execGuardArg, strconv.Itoa(os.Getpid()), "--"}, argv...)
	self := "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		if exe, err := os.Executable(); err == nil {
			self = exe // no /proc: the path this binary was started from
		}
	}
	cmd := exec.Command(self, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: guardDeathSignal}
	return cmd
}

// startLockedThread starts cmd from a goroutine locked to its OS thread
// and waits for it there: the kernel sends the parent-death signal when
// the thread that forked the child exits, not the process, so that thread
// must live as long as the child.
func startLockedThread(cmd *exec.Cmd) (exited <-chan error, _ error) {
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, after the
		// child was reaped.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// execGuard is the guard's main: args are lock exec's pid, "--" and the
// command. It exits with the command's status (128+N if signal N ended
// it), 126 or 127 when the command cannot be started.
func execGuard(args []string) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintln(os.Stderr, "ticketd: the lock exec guard is started by `ticketd lock exec` only")
		return exitUsage
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketd: the lock exec guard is started by `ticketd lock exec` only")
		return exitUsage
	}
	// Signals sent to the group (lock exec forwards SIGINT, SIGTERM and
	// SIGHUP) are for the command, which gets them too: caught here only
	// so that they do not end the guard. (Caught, not ignored: an ignored
	// signal would stay ignored in the command.)
	sigs := make(chan os.Signal, 8)
	for _, sig := range guardCaught() {
		if !signal.Ignored(sig) {
			signal.Notify(sigs, sig)
		}
	}
	if os.Getppid() != parent {
		// lock exec died before the handler was in place.
		killOwnGroup(nil)
	}
	argv := args[2:]
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := startLockedThread(cmd)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ticketd lock exec: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	check := time.NewTicker(guardParentCheck)
	defer check.Stop()
	for {
		select {
		case err := <-exited:
			return exitStatus(cmd.ProcessState, err, os.Stderr)
		case <-sigs:
		case <-check.C:
		}
		if os.Getppid() != parent {
			killOwnGroup(cmd.Process)
		}
	}
}

// killOwnGroup kills the guard's process group, the guard included, when
// the guard leads it (as lock exec starts it); otherwise only the command,
// if started, and exits.
func killOwnGroup(command *os.Process) {
	if syscall.Getpgrp() == os.Getpid() {
		_ = syscall.Kill(0, syscall.SIGKILL)
		select {} // the SIGKILL is on its way
	}
	if command != nil {
		_ = command.Kill()
	}
	os.Exit(exitFailure)
}
