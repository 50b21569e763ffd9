package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == execGuardArg {
		os.Exit(execGuard(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes (the table is exitCodesHelp, in the root --help).
const (
	exitFailure       = 1
	exitUsage         = 2
	exitIndeterminate = 3
	// exitResourceExhausted: a limit refused the request (resource_exhausted).
	exitResourceExhausted = 4
	// exitRemoved: serve's member was removed from the cluster (retired,
	// or replaced); restarting it cannot help.
	exitRemoved = 5
)
