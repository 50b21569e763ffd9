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
)

const adminUsage = `usage: ticketd admin <command> --control URL[,URL...] [flags]

The control API is separate from the client port: it listens on each node's
--control-listen and needs the cluster's control credential (--credential or
TICKETD_CONTROL_CREDENTIAL). Requests go to whichever listed node leads.

commands:
  bootstrap --bootstrap-credential X   consume the one-shot bootstrap credential (node 1)
  mint-join                            mint a one-time join credential for a new node
  members                              list members with NodeID, incarnation, address, role
  replace complete --old N --new M --incarnation I
                                       finish a prepared replacement (voter swap by joint consensus)
  replace abort --old N --new M --incarnation I
                                       cancel a prepared replacement; M is retired
  retire --node N --incarnation I      remove a member for good

A new node joins with: ticketd serve --join URLS --join-credential X ...
A replacement node joins with: ticketd serve --join URLS --replace OLD_ID --control-credential ...
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
	urls := fs.String("control", "http://127.0.0.1:7100", "comma-separated control URLs")
	cred := fs.String("credential", os.Getenv("TICKETD_CONTROL_CREDENTIAL"), "control credential")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	bootCred := fs.String("bootstrap-credential", os.Getenv("TICKETD_BOOTSTRAP_CREDENTIAL"), "bootstrap credential (bootstrap)")
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
	rep, err := control.Call(ctx, strings.Split(*urls, ","), path, *cred, body)
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
