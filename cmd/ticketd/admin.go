package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/internal/natsclient"
)

const adminUsage = `usage: ticketd admin <command> --control URL[,URL...] [flags]

The control API is separate from the client port: it listens on each node's
--control-listen and needs the cluster's control credential
(TICKETD_CONTROL_CREDENTIAL or --credential-file; never on the command line,
where ps shows it). Use https URLs with --control-tls-ca off loopback.
Requests go to whichever listed node leads.

commands:
  bootstrap                            consume the one-shot bootstrap credential (node 1;
                                       TICKETD_BOOTSTRAP_CREDENTIAL or --bootstrap-credential-file)
  mint-join                            mint a one-time join credential for a new node
  members                              list members with NodeID, incarnation, address, role
  replace complete --old N --new M --incarnation I
                                       finish a prepared replacement (voter swap by joint consensus)
  replace abort --old N --new M --incarnation I
                                       cancel a prepared replacement; M is retired
  retire --node N --incarnation I      remove a member for good

A new node joins with: TICKETD_JOIN_CREDENTIAL=... ticketd serve --join URLS ...
A replacement node joins with: ticketd serve --join URLS --replace OLD_ID (and the control credential)
`

func admin(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, adminUsage)
		return exitUsage
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, adminUsage)
		return 0
	}
	name := args[0]
	args = args[1:]
	if name == "replace" {
		if len(args) == 0 || (args[0] != "complete" && args[0] != "abort") {
			fmt.Fprint(stderr, adminUsage)
			return exitUsage
		}
		name += " " + args[0]
		args = args[1:]
	}
	fs := pflag.NewFlagSet("admin "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cc := addControlFlags(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	bootCred := fs.String("bootstrap-credential", "", "bootstrap credential (bootstrap)")
	bootCredFile := fs.String("bootstrap-credential-file", "", "file holding the bootstrap credential (or TICKETD_BOOTSTRAP_CREDENTIAL)")
	_ = fs.MarkDeprecated("bootstrap-credential", "it shows in ps; use TICKETD_BOOTSTRAP_CREDENTIAL or --bootstrap-credential-file")
	oldID := fs.Uint64("old", 0, "NodeID being replaced (replace)")
	newID := fs.Uint64("new", 0, "NodeID of the replacement (replace)")
	node := fs.Uint64("node", 0, "NodeID (retire)")
	inc := fs.Uint64("incarnation", 0, "incarnation of --new or --node")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	urls, cred, callOpts, err := cc.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "ticketd admin: %v\n", err)
		return exitUsage
	}
	if *bootCred, err = secret(*bootCred, *bootCredFile, "TICKETD_BOOTSTRAP_CREDENTIAL"); err != nil {
		fmt.Fprintf(stderr, "ticketd admin: bootstrap-credential-file: %v\n", err)
		return exitUsage
	}
	var path string
	var body control.Request
	switch name {
	case "bootstrap":
		path, body = "/v1/bootstrap", control.Request{Credential: *bootCred}
	case "mint-join":
		path = "/v1/join-credentials"
	case "members":
		path = "/v1/members"
	case "replace complete":
		path, body = "/v1/replacements/complete", control.Request{OldNodeID: *oldID, NodeID: *newID, Incarnation: *inc}
	case "replace abort":
		path, body = "/v1/replacements/abort", control.Request{OldNodeID: *oldID, NodeID: *newID, Incarnation: *inc}
	case "retire":
		path, body = "/v1/retire", control.Request{NodeID: *node, Incarnation: *inc}
	default:
		fmt.Fprintf(stderr, "ticketd admin: unknown command %q\n\n%s", name, adminUsage)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	rep, err := control.Call(ctx, urls, path, cred, body, callOpts...)
	if err != nil {
		code := "error"
		if ce, ok := err.(*control.Error); ok {
			code = ce.Code
		}
		fmt.Fprintf(stderr, "error: %s: %v\n", code, err)
		return exitFailure
	}
	printJSON(stdout, rep)
	return 0
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
		urls:     fs.String("control", "http://127.0.0.1:7100", "comma-separated control URLs"),
		cred:     fs.String("credential", "", "control credential"),
		credFile: fs.String("credential-file", "", "file holding the control credential (or TICKETD_CONTROL_CREDENTIAL)"),
		ca:       fs.String("control-tls-ca", "", "CA (PEM) of the nodes' control certificates (https URLs)"),
		cert:     fs.String("control-tls-cert", "", "client certificate (PEM) for a control API with mutual TLS"),
		key:      fs.String("control-tls-key", "", "client key (PEM) of --control-tls-cert"),
	}
	_ = fs.MarkDeprecated("credential", "it shows in ps; use TICKETD_CONTROL_CREDENTIAL or --credential-file")
	return c
}

// resolve reads the parsed flags: the URLs, the credential (flag, else
// file, else TICKETD_CONTROL_CREDENTIAL) and the call options for TLS.
func (c *controlFlags) resolve() ([]string, string, []control.CallOption, error) {
	cred, err := secret(*c.cred, *c.credFile, "TICKETD_CONTROL_CREDENTIAL")
	if err != nil {
		return nil, "", nil, fmt.Errorf("credential-file: %w", err)
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
