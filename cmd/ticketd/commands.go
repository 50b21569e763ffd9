package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// The command tree is built with cobra (on the pflag flags every command
// already used), as etcdctl and kubectl are: each command has a one-line
// description, a Usage line with its positional arguments, its own flags
// and examples, generated into --help; a mistake (unknown command or flag,
// bad value, wrong number of arguments) is answered with "Error: ..." and
// the command's usage on stderr, exit status 2.

// exitCodesHelp is the exit status table of the root --help (and of the
// README's "Command line" section).
const exitCodesHelp = `Exit status:
  0    success
  1    failure; stderr says "error: CODE: message" with the stable error code
  2    usage: unknown command or flag, bad value, wrong arguments, refused
       configuration (serve)
  3    indeterminate: the request may or may not have taken effect (a lock
       may exist that expires within its lease)
  4    resource_exhausted: a cluster limit refused the request (locks, your
       quota, waiters, the leader's disk); nothing changed, retry later
  5    serve: this member was removed from the cluster (retired, or replaced
       by another node); do not restart it: start a new node in its place
  lock exec exits with its command's status: 126 when the command cannot
  run, 127 when it is not found, 128+N when signal N ended it.`

// usageTemplate is cobra's default with one change: a group (a runnable
// command with subcommands, runnable only to refuse unknown subcommands)
// shows "PATH [command]", not a use line of its own, unless it is also a
// command of its own (alsoRunsAnnotation: bench, whose subcommand is
// bench hold).
const usageTemplate = `Usage:{{if and .Runnable (or (not .HasAvailableSubCommands) (index .Annotations "ticketd/also-runs"))}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}

Available Commands:{{range .Commands}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Global Flags:
{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableSubCommands}}

Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
`

// noUsageAnnotation marks a command whose body's usage errors are not
// followed by its usage (serve's is long, and its refusals come from the
// whole configuration, not only argv): a hint to --help follows instead.
const noUsageAnnotation = "ticketd/no-usage"

// alsoRunsAnnotation marks a command with subcommands that is also a
// command of its own (usageTemplate shows both lines).
const alsoRunsAnnotation = "ticketd/also-runs"

// body is a leaf command's work: args are its positional arguments (the
// flags are bound before it runs); it prints its results and returns the
// exit status. A usage error is printed with usagef.
type body func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// exitError carries a body's non-zero exit status out of cobra.
type exitError struct {
	code int
}

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// runBody adapts b to cobra; a usage error of b is followed by the
// command's usage.
func runBody(b body) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		stderr := cmd.ErrOrStderr()
		code := b(cmd.Context(), args, cmd.OutOrStdout(), stderr)
		if code == 0 {
			return nil
		}
		if code == exitUsage {
			if cmd.Annotations[noUsageAnnotation] != "" {
				fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
			} else {
				fmt.Fprint(stderr, cmd.UsageString())
			}
		}
		return &exitError{code}
	}
}

// bind runs f with the command's options o (bound to its flags).
func bind[O any](o O, f func(ctx context.Context, o O, args []string, stdout, stderr io.Writer) int) func(*cobra.Command, []string) error {
	return runBody(func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return f(ctx, o, args, stdout, stderr)
	})
}

// usagef prints a usage error the way cobra prints its own and returns
// exitUsage (runBody adds the usage).
func usagef(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "Error: "+format+"\n", args...)
	return exitUsage
}

// exactArgs wants one positional argument per name (the names are those
// of the Use line, for the message).
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			return nil
		}
		switch {
		case len(names) == 0:
			return fmt.Errorf("%q takes no arguments, got %q", cmd.CommandPath(), args)
		case len(args) < len(names):
			return fmt.Errorf("%q needs %s (missing %s)", cmd.CommandPath(), strings.Join(names, " "), strings.Join(names[len(args):], " "))
		default:
			return fmt.Errorf("%q needs %s, got %d arguments: %q", cmd.CommandPath(), strings.Join(names, " "), len(args), args)
		}
	}
}

// group is a command that only holds subcommands. It runs only to refuse
// a missing or unknown subcommand (cobra would otherwise print its help and
// exit 0).
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("%q needs a command", cmd.CommandPath())
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return errors.New(msg)
		},
	}
	g.AddCommand(subs...)
	return g
}

// rootCmd is the whole CLI.
func rootCmd() *cobra.Command {
	root := group("ticketd", "A distributed lock service: run a node, take locks, operate the cluster")
	root.Long = `ticketd runs a node of a ticketd cluster (serve) and talks to a running
cluster: locks with fencing tokens, status, benchmarks, backups and the
control plane.

Client commands (lock, status, bench) reach any node through NATS (--nats,
default ` + defaultNATS + `), print JSON on stdout and errors on stderr.
Secrets are never flag values: each comes from a --*-file flag or a
TICKETD_* variable (see the README's secrets table).

` + exitCodesHelp
	root.Version = versionText()
	root.SilenceErrors, root.SilenceUsage = true, true
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetVersionTemplate("{{.Version}}")
	root.SetUsageTemplate(usageTemplate)
	root.SetFlagErrorFunc(flagError)
	root.SetHelpCommand(helpCmd())
	root.AddCommand(
		serveCmd(),
		group("lock", "Take, give back and inspect locks",
			lockAcquireCmd(), lockReleaseCmd(), lockGetCmd(), lockRenewCmd(), lockLsCmd(), lockWatchCmd(), lockExecCmd(), lockCheckCmd()),
		statusCmd(),
		group("fence", "What a protected resource verifies fences with", fencePubkeyCmd()),
		group("snapshot", "Back up a cluster and restore it into a new one",
			snapshotSaveCmd(), snapshotStatusCmd(), snapshotRestoreCmd()),
		benchCmd(),
		adminCmd(),
		versionCmd(),
	)
	return root
}

// refusal is a command line refused for a reason the usage would not
// explain (a secret given as a value): run prints it with a hint to --help
// instead of the usage.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// flagError is cobra's flag error, or, for a flag that would put a secret
// on the command line, the refusal that says where the secret goes.
func flagError(_ *cobra.Command, err error) error {
	if name, ok := strings.CutPrefix(err.Error(), "unknown flag: --"); ok {
		if msg := refusedSecretFlag(name); msg != "" {
			return &refusal{msg}
		}
	}
	return err
}

// helpCmd is "ticketd help [PATH...]": the help of that command on stdout,
// exit 0; an unknown PATH is a usage error.
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND...]",
		Short: "Show the help of any command",
		Example: `  ticketd help lock renew
  ticketd help admin replace complete`,
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return fmt.Errorf("unknown help topic %q", strings.Join(args, " "))
			}
			return target.Help()
		},
	}
}

// run is main without the process: tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := rootCmd()
	// A nil args would make cobra read os.Args.
	root.SetArgs(append([]string{}, args...))
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var re *refusal
	if errors.As(err, &re) {
		fmt.Fprintf(stderr, "Error: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	}
	// Anything else cobra returns is a mistake on the command line: an
	// unknown command or flag, a bad value, the wrong arguments.
	fmt.Fprintf(stderr, "Error: %v\n", err)
	fmt.Fprint(stderr, cmd.UsageString())
	return exitUsage
}
