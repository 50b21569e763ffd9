package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: ticketd <command> [flags]

commands:
  serve                 run a node
  lock acquire KEY      take a lock (--lease, --owner, --wait)
  lock release KEY      give a lock back (--token)
  lock get KEY          show the current holder
  status                show the cluster as a node sees it
  bench                 drive acquire+release cycles and print figures
  admin                 control plane: bootstrap, join credentials, replacement

run 'ticketd <command> --help' for its flags.
`

// run is main without the process: tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "lock":
		if len(args) < 2 {
			fmt.Fprint(stderr, usage)
			return exitUsage
		}
		switch args[1] {
		case "acquire":
			return lockAcquire(ctx, args[2:], stdout, stderr)
		case "release":
			return lockRelease(ctx, args[2:], stdout, stderr)
		case "get":
			return lockGet(ctx, args[2:], stdout, stderr)
		}
	case "status":
		return status(ctx, args[1:], stdout, stderr)
	case "bench":
		return bench(ctx, args[1:], stdout, stderr)
	case "admin":
		return admin(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "ticketd: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// Exit codes.
const (
	exitFailure       = 1
	exitUsage         = 2
	exitIndeterminate = 3
	// exitResourceExhausted: a limit refused the request (resource_exhausted).
	exitResourceExhausted = 4
)
