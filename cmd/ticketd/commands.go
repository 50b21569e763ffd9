package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is one node of the CLI's command tree: a leaf runs, a group
// dispatches to its subcommands. Every node answers --help (and "ticketd
// help PATH...") on stdout with exit status 0.
type command struct {
	name    string
	args    string // the positional arguments, for the listing
	summary string
	// run is a leaf's body; args are the words after the command's name.
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	subs []*command
	// usage, if set, replaces the generated listing of a group.
	usage string
}

// commands is the whole CLI.
func commands() *command {
	return &command{name: "ticketd", subs: []*command{
		{name: "serve", summary: "run a node", run: serve},
		{name: "lock", summary: "take, give back and inspect locks", subs: []*command{
			{name: "acquire", args: "KEY", summary: "take a lock (--lease, --owner, --wait)", run: lockAcquire},
			{name: "release", args: "KEY", summary: "give a lock back (--token)", run: lockRelease},
			{name: "get", args: "KEY", summary: "show the current holder", run: lockGet},
			{name: "renew", args: "KEY TOKEN", summary: "lengthen a held lock's lease (--lease)", run: lockRenew},
			{name: "ls", args: "PREFIX", summary: "list the held locks under a prefix, every page (--limit per page)", run: lockLs},
			{name: "watch", args: "KEY", summary: "print a key's grant/release/expire/renew events until interrupted", run: lockWatch},
			{name: "exec", args: "KEY -- CMD...", summary: "run a command while holding the lock (--lease, --wait, --grace)", run: lockExec},
		}},
		{name: "status", summary: "show the cluster as a node sees it (--watch: a live view of every member)", run: status},
		{name: "snapshot", summary: "back up a cluster and restore it into a new one", subs: []*command{
			{name: "save", args: "FILE", summary: "write a backup taken by the leader (--control, control credential)", run: snapshotSave},
			{name: "status", args: "FILE", summary: "verify a backup file and show what it holds", run: snapshotStatus},
			{name: "restore", args: "FILE", summary: "seed a new cluster's first member (--data, --bump-tokens, --drop-locks)", run: snapshotRestore},
		}},
		{name: "bench", summary: "drive acquire+release cycles and print figures", run: bench},
		{name: "admin", summary: "control plane: bootstrap, join credentials, replacement", run: admin, usage: adminUsage},
	}}
}

func (c *command) sub(name string) *command {
	for _, s := range c.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

// listing is a group's usage text.
func (c *command) listing(path string) string {
	if c.usage != "" {
		return c.usage
	}
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s <command> [flags]\n\ncommands:\n", path)
	for _, s := range c.subs {
		left := s.name
		if s.args != "" {
			left += " " + s.args
		}
		fmt.Fprintf(&b, "  %-22s%s\n", left, s.summary)
	}
	fmt.Fprintf(&b, "\nrun '%s <command> --help' for its flags and commands.\n", path)
	return b.String()
}

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "help" }

// dispatch runs the command args name under c (whose full name is path).
func (c *command) dispatch(ctx context.Context, path string, args []string, stdout, stderr io.Writer) int {
	if c.run != nil {
		if slices.ContainsFunc(args, func(a string) bool { return a == "-h" || a == "--help" }) {
			stderr = stdout // help goes to stdout; pflag prints it to the error stream
		}
		return c.run(ctx, args, stdout, stderr)
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, c.listing(path))
		return exitUsage
	}
	if isHelp(args[0]) {
		return c.help(ctx, path, args[1:], stdout, stderr)
	}
	s := c.sub(args[0])
	if s == nil {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", path, args[0], c.listing(path))
		return exitUsage
	}
	return s.dispatch(ctx, path+" "+s.name, args[1:], stdout, stderr)
}

// help answers "help [PATH...]": the listing of a group, or a leaf's flags.
func (c *command) help(ctx context.Context, path string, names []string, stdout, stderr io.Writer) int {
	for len(names) > 0 && c.run == nil {
		s := c.sub(names[0])
		if s == nil {
			fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", path, names[0], c.listing(path))
			return exitUsage
		}
		c, path, names = s, path+" "+s.name, names[1:]
	}
	if c.run != nil {
		return c.dispatch(ctx, path, []string{"--help"}, stdout, stderr)
	}
	fmt.Fprint(stdout, c.listing(path))
	return 0
}
