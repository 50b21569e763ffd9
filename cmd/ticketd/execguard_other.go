//go:build !linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// execGuardArg is lock exec's guard argument (execguard_linux.go). Without
// a parent-death signal there is no guard: a `ticketd lock exec` killed
// with SIGKILL leaves the command running until it ends by itself.
const execGuardArg = "__lock-exec-guard"

// guardedCommand is argv itself, in its own process group.
func guardedCommand(argv []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// startLockedThread starts cmd and waits for it in the background.
func startLockedThread(cmd *exec.Cmd) (<-chan error, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done, nil
}

func execGuard([]string) int {
	fmt.Fprintln(os.Stderr, "ticketd: the lock exec guard runs on Linux only")
	return exitUsage
}
