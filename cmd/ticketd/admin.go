package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/internal/natsclient"
)

// adminLong is the description of `ticketd admin`.
const adminLong = `The control plane: bootstrap a cluster, mint join credentials, list members,
replace and retire members.

The control API is separate from the client port: it listens on each node's
--control-listen and needs the cluster's control credential (from
--control-credential-file, TICKETD_CONTROL_CREDENTIAL_FILE or
TICKETD_CONTROL_CREDENTIAL; never on the command line, where ps shows it).
Use https URLs with --control-tls-ca off loopback. Requests go to whichever
listed node leads.

A new node joins with: TICKETD_JOIN_CREDENTIAL_FILE=FILE ticketd serve --join URLS ...
A replacement node joins with: ticketd serve --join URLS --replace OLD_ID (and the control credential)`

// adminOptions are the flags of the admin commands; each command binds
// only the ones it uses.
type adminOptions struct {
	name                    string // "members", "replace complete", ...
	cc                      *controlFlags
	timeout                 time.Duration
	bootCred, bootCredFile  string
	oldID, newID, node, inc uint64
}

func adminCmd() *cobra.Command {
	g := group("admin", "Control plane: bootstrap, join credentials, members, replacement, retirement",
		adminLeaf("bootstrap", "Consume the one-shot bootstrap credential of node 1",
			`Consume the one-shot bootstrap credential that node 1 was started with
(--bootstrap-credential-file, TICKETD_BOOTSTRAP_CREDENTIAL_FILE or
TICKETD_BOOTSTRAP_CREDENTIAL), making the control credential the cluster's
admin credential.`,
			`  ticketd admin bootstrap --control https://10.0.0.1:7100 --control-tls-ca ca.pem \
      --control-credential-file control.cred --bootstrap-credential-file bootstrap.cred`,
			func(fs *pflag.FlagSet, o *adminOptions) {
				fs.StringVar(&o.bootCred, "bootstrap-credential", "", "bootstrap credential")
				fs.StringVar(&o.bootCredFile, "bootstrap-credential-file", "", "file holding the bootstrap credential (or TICKETD_BOOTSTRAP_CREDENTIAL)")
				_ = fs.MarkDeprecated("bootstrap-credential", "it shows in ps; use TICKETD_BOOTSTRAP_CREDENTIAL or --bootstrap-credential-file")
			}),
		adminLeaf("mint-join", "Mint a one-time join credential for a new node",
			`Mint a one-time credential that lets one new node join (ticketd serve --join).
It is printed in the JSON reply: keep it out of shell history and logs.`,
			`  ticketd admin mint-join --control http://127.0.0.1:7100 --control-credential-file control.cred`,
			nil),
		adminLeaf("members", "List members with NodeID, incarnation, address and role",
			`List the cluster's members as the leader sees them: NodeID, incarnation,
peer address and role (voter, learner).`,
			`  ticketd admin members --control http://127.0.0.1:7100 --control-credential-file control.cred`,
			nil),
		group("replace", "Finish or cancel a prepared member replacement",
			adminLeaf("complete", "Finish a prepared replacement (voter swap by joint consensus)",
				`Finish the replacement of voter --old by the node --new (incarnation
--incarnation) that joined with serve --replace: one joint-consensus change
swaps them.`,
				`  ticketd admin replace complete --old 2 --new 4 --incarnation 1 --control http://127.0.0.1:7100`,
				replaceFlags),
			adminLeaf("abort", "Cancel a prepared replacement; the new node is retired",
				`Cancel the replacement of voter --old by node --new (incarnation
--incarnation); --new is retired and --old stays.`,
				`  ticketd admin replace abort --old 2 --new 4 --incarnation 1 --control http://127.0.0.1:7100`,
				replaceFlags),
		),
		adminLeaf("retire", "Remove a member for good",
			`Remove member --node (incarnation --incarnation) from the cluster for good:
its identity is refused from then on.`,
			`  ticketd admin retire --node 3 --incarnation 1 --control http://127.0.0.1:7100`,
			func(fs *pflag.FlagSet, o *adminOptions) {
				fs.Uint64Var(&o.node, "node", 0, "NodeID of the member to retire (required)")
				fs.Uint64Var(&o.inc, "incarnation", 0, "incarnation of --node (required)")
				requireFlags(fs, "node", "incarnation")
			}),
	)
	g.Long = adminLong
	return g
}

func replaceFlags(fs *pflag.FlagSet, o *adminOptions) {
	fs.Uint64Var(&o.oldID, "old", 0, "NodeID being replaced (required)")
	fs.Uint64Var(&o.newID, "new", 0, "NodeID of the replacement (required)")
	fs.Uint64Var(&o.inc, "incarnation", 0, "incarnation of --new (required)")
	requireFlags(fs, "old", "new", "incarnation")
}

// requireFlags marks flags of fs required (cobra refuses the command,
// naming them, when one is missing).
func requireFlags(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		_ = cobra.MarkFlagRequired(fs, n)
	}
}

// adminLeaf is one admin command: the control flags, --timeout and its
// own flags (addFlags).
func adminLeaf(name, short, long, example string, addFlags func(*pflag.FlagSet, *adminOptions)) *cobra.Command {
	cmd := &cobra.Command{Use: name, Short: short, Long: long, Example: example, Args: exactArgs()}
	o := &adminOptions{cc: addControlFlags(cmd.Flags())}
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	if addFlags != nil {
		addFlags(cmd.Flags(), o)
	}
	cmd.RunE = func(c *cobra.Command, args []string) error {
		o.name = strings.TrimPrefix(c.CommandPath(), "ticketd admin ")
		return bind(o, admin)(c, args)
	}
	return cmd
}

func admin(ctx context.Context, o *adminOptions, _ []string, stdout, stderr io.Writer) int {
	urls, cred, callOpts, err := o.cc.resolve()
	if err != nil {
		return usagef(stderr, "%v", err)
	}
	var path string
	var body control.Request
	switch o.name {
	case "bootstrap":
		bootCred, err := secret(o.bootCred, o.bootCredFile, "TICKETD_BOOTSTRAP_CREDENTIAL")
		if err != nil {
			return usagef(stderr, "bootstrap-credential-file: %v", err)
		}
		path, body = "/v1/bootstrap", control.Request{Credential: bootCred}
	case "mint-join":
		path = "/v1/join-credentials"
	case "members":
		path = "/v1/members"
	case "replace complete":
		path, body = "/v1/replacements/complete", control.Request{OldNodeID: o.oldID, NodeID: o.newID, Incarnation: o.inc}
	case "replace abort":
		path, body = "/v1/replacements/abort", control.Request{OldNodeID: o.oldID, NodeID: o.newID, Incarnation: o.inc}
	case "retire":
		path, body = "/v1/retire", control.Request{NodeID: o.node, Incarnation: o.inc}
	default:
		return usagef(stderr, "unknown admin command %q", o.name)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	rep, err := control.Call(ctx, urls, path, cred, body, callOpts...)
	if err != nil {
		return failControl(stderr, err)
	}
	printJSON(stdout, rep)
	return 0
}

// failControl prints a control API error with its stable code once
// (a *control.Error's text starts with it).
func failControl(stderr io.Writer, err error) int {
	var ce *control.Error
	if errors.As(err, &ce) && !strings.HasPrefix(err.Error(), ce.Code) {
		fmt.Fprintf(stderr, "error: %s: %v\n", ce.Code, err)
	} else {
		fmt.Fprintf(stderr, "error: %v\n", err)
	}
	return exitFailure
}

// secret is a secret from its flag (deprecated), else its file, else the
// environment variable env.
func secret(flagValue, file, env string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if file != "" {
		return natsclient.ReadSecretFile(file)
	}
	return os.Getenv(env), nil
}

// controlFlags are the flags of every command that calls the control
// API: where it is, the credential (never the environment as a flag
// default: --help would print it), and TLS.
type controlFlags struct {
	urls, cred, credFile, ca, cert, key *string
}

func addControlFlags(fs *pflag.FlagSet) *controlFlags {
	c := &controlFlags{
		urls: fs.String("control", "http://127.0.0.1:7100", "comma-separated control URLs"),
		ca:   fs.String("control-tls-ca", "", "CA (PEM) of the nodes' control certificates (https URLs)"),
		cert: fs.String("control-tls-cert", "", "client certificate (PEM) for a control API with mutual TLS"),
		key:  fs.String("control-tls-key", "", "client key (PEM) of --control-tls-cert"),
	}
	c.addCredential(fs)
	return c
}

// addCredential registers the control credential's flags alone: snapshot
// status and restore verify a backup with the credential and call no API.
func (c *controlFlags) addCredential(fs *pflag.FlagSet) {
	c.cred = fs.String("credential", "", "control credential")
	c.credFile = fs.String("credential-file", "", "file holding the control credential (or TICKETD_CONTROL_CREDENTIAL)")
	_ = fs.MarkDeprecated("credential", "it shows in ps; use TICKETD_CONTROL_CREDENTIAL or --credential-file")
}

// credential is the control credential: flag, else file, else
// TICKETD_CONTROL_CREDENTIAL.
func (c *controlFlags) credential() (string, error) {
	cred, err := secret(*c.cred, *c.credFile, "TICKETD_CONTROL_CREDENTIAL")
	if err != nil {
		return "", fmt.Errorf("credential-file: %w", err)
	}
	return cred, nil
}

// resolve reads the parsed flags: the URLs, the credential and the call
// options for TLS.
func (c *controlFlags) resolve() ([]string, string, []control.CallOption, error) {
	cred, err := c.credential()
	if err != nil {
		return nil, "", nil, err
	}
	if *c.ca == "" && *c.cert == "" && *c.key == "" {
		return strings.Split(*c.urls, ","), cred, nil, nil
	}
	cfg, err := control.ClientTLS(*c.ca, *c.cert, *c.key)
	if err != nil {
		return nil, "", nil, err
	}
	return strings.Split(*c.urls, ","), cred, []control.CallOption{control.WithTLS(cfg)}, nil
}
