package main

import (
	"context"
	"io"
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

// run is main without the process: tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return commands().dispatch(ctx, "ticketd", args, stdout, stderr)
}

// Exit codes.
const (
	exitFailure       = 1
	exitUsage         = 2
	exitIndeterminate = 3
	// exitResourceExhausted: a limit refused the request (resource_exhausted).
	exitResourceExhausted = 4
)
