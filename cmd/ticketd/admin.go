package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/control"
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
	bootCred                *secretFlag
	out                     string // mint-join: the credential's file
	oldID, newID, node, inc uint64
}

func adminCmd() *cobra.Command {
	g := group("admin", "Control plane: bootstrap, join credentials, members, replacement, retirement, fence keys",
		adminLeaf("bootstrap", "Consume the one-shot bootstrap credential of node 1",
			`Consume the one-shot bootstrap credential that node 1 was started with
(--bootstrap-credential-file, TICKETD_BOOTSTRAP_CREDENTIAL_FILE or
TICKETD_BOOTSTRAP_CREDENTIAL), making the control credential the cluster's
admin credential.`,
			`  ticketd admin bootstrap --control https://10.0.0.1:7100 --control-tls-ca ca.pem \
      --control-credential-file control.cred --bootstrap-credential-file bootstrap.cred`,
			func(fs *pflag.FlagSet, o *adminOptions) {
				o.bootCred = addSecretFlag(fs, "bootstrap-credential", "one-shot bootstrap credential node 1 was started with")
			}),
		adminLeaf("mint-join", "Mint a one-time join credential for a new node",
			`Mint a one-time credential that lets one new node join (ticketd serve --join
with --join-credential-file). With --out it is written to FILE (mode 0600;
an existing FILE is refused) and left out of the JSON reply; without, the
reply carries it: keep it out of shell history and logs.`,
			`  ticketd admin mint-join --control http://127.0.0.1:7100 --control-credential-file control.cred --out join.cred
  ticketd serve --join http://127.0.0.1:7100 --join-credential-file join.cred ...`,
			func(fs *pflag.FlagSet, o *adminOptions) {
				fs.StringVar(&o.out, "out", "", "write the credential to this file (mode 0600, refused if it exists) instead of the reply")
			}),
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
		group("fence", "Fence signing keys",
			adminLeaf("rotate", "Make a new fence signing key current",
				`Make a new fence signing key current: new grants' fences are signed with
it. The older keys stay valid (the cluster keeps the last 4), so first add
the new public key (in the reply, and in ticketd fence pubkey) to every
resource's trusted keys, and remove an old one once no fence it signed is
in use (docs/fencing.md, "Key rotation").`,
				`  ticketd admin fence rotate --control http://127.0.0.1:7100 --control-credential-file control.cred`,
				nil)),
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
		bootCred, err := o.bootCred.value()
		if err != nil {
			return usagef(stderr, "%v", err)
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
	case "fence rotate":
		path = "/v1/fence/rotate"
	default:
		return usagef(stderr, "unknown admin command %q", o.name)
	}
	if o.out != "" {
		if _, err := os.Lstat(o.out); err == nil {
			// Before minting a credential that would be lost.
			fmt.Fprintf(stderr, "error: %s exists: name a new file\n", o.out)
			return exitFailure
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := checkReachable(ctx, urls); err != nil {
		return fail(stderr, err)
	}
	rep, err := control.Call(ctx, urls, path, cred, body, callOpts...)
	if err != nil {
		return failControl(stderr, err)
	}
	var credFile string
	if o.out != "" && rep.Credential != "" {
		if err := writeFileAtomic(o.out, []byte(rep.Credential+"\n"), false); err != nil {
			fmt.Fprintf(stderr, "error: %v (the credential was minted but not saved: mint another; the lost one stays unused)\n", err)
			return exitFailure
		}
		rep.Credential, credFile = "", o.out
	}
	printJSON(stdout, struct {
		control.Reply
		CredentialFile string `json:"credential_file,omitempty"`
		// ClusterID in hex, as every command and status print it.
		ClusterID string `json:"cluster_id,omitempty"`
	}{rep, credFile, clusterIDText(rep.ClusterID)})
	return 0
}

// clusterIDText is how every command prints a cluster ID: 16 hex digits
// ("" for 0, a cluster created before cluster IDs).
func clusterIDText(id uint64) string {
	if id == 0 {
		return ""
	}
	return fmt.Sprintf("%016x", id)
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

// controlFlags are the flags of every command that calls the control
// API: where it is, the control credential (a secret: never a flag value,
// and never the environment as a flag default, which --help would print),
// and TLS.
type controlFlags struct {
	urls, ca, cert, key string
	cred                *secretFlag
}

func addControlFlags(fs *pflag.FlagSet) *controlFlags {
	c := &controlFlags{}
	c.addCredential(fs)
	fs.StringVar(&c.urls, "control", "http://127.0.0.1:7100", "comma-separated control URLs (https with --control-tls-ca off loopback)")
	fs.StringVar(&c.ca, "control-tls-ca", "", "CA (PEM) of the nodes' control certificates (https URLs)")
	fs.StringVar(&c.cert, "control-tls-cert", "", "client certificate (PEM) for a control API with mutual TLS")
	fs.StringVar(&c.key, "control-tls-key", "", "client key (PEM) of --control-tls-cert")
	return c
}

// addCredential registers the control credential's flags alone: snapshot
// status and restore verify a backup with the credential and call no API.
func (c *controlFlags) addCredential(fs *pflag.FlagSet) {
	c.cred = addSecretFlag(fs, "control-credential", "control credential")
	// The flag's name before it matched serve's, still accepted. Hidden,
	// not deprecated: cobra prints deprecation notes on stdout, which
	// carries the command's JSON.
	fs.StringVar(&c.cred.file, "credential-file", "", "same as --control-credential-file")
	_ = fs.MarkHidden("credential-file")
}

// credential is the control credential: --control-credential-file, else
// TICKETD_CONTROL_CREDENTIAL_FILE's file, else TICKETD_CONTROL_CREDENTIAL.
func (c *controlFlags) credential() (string, error) { return c.cred.value() }

// resolve reads the parsed flags: the URLs, the credential and the call
// options for TLS.
func (c *controlFlags) resolve() ([]string, string, []control.CallOption, error) {
	cred, err := c.credential()
	if err != nil {
		return nil, "", nil, err
	}
	urls := strings.Split(c.urls, ",")
	if c.ca == "" && c.cert == "" && c.key == "" {
		return urls, cred, nil, nil
	}
	cfg, err := control.ClientTLS(c.ca, c.cert, c.key)
	if err != nil {
		return nil, "", nil, err
	}
	return urls, cred, []control.CallOption{control.WithTLS(cfg)}, nil
}

// controlDialTimeout bounds the dial of each control URL by
// checkReachable; controlReachWait how long it keeps trying (a node just
// started opens its control listener within it).
const (
	controlDialTimeout = 2 * time.Second
	controlReachWait   = 5 * time.Second
)

// checkReachable fails within controlReachWait, naming each URL with its
// OS error, when no control URL accepts a TCP connection: control.Call
// retries nodes it cannot dial until its deadline (30 s), which for a
// mistyped or dead address only hides the cause.
func checkReachable(ctx context.Context, urls []string) error {
	ctx, cancel := context.WithTimeout(ctx, controlReachWait)
	defer cancel()
	var last []string // the failures of the last round not cut short
	for {
		failed, err := dialAny(ctx, urls)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = failed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no control API reachable: %s", strings.Join(last, "; "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// dialAny dials each URL's address until one accepts; failed is each
// URL with its dial error.
func dialAny(ctx context.Context, urls []string) (failed []string, err error) {
	d := net.Dialer{Timeout: controlDialTimeout}
	for _, raw := range urls {
		u, perr := url.Parse(strings.TrimSpace(raw))
		if perr != nil || u.Host == "" {
			return nil, nil // control.Call names a malformed URL
		}
		host := u.Host
		if u.Port() == "" {
			port := "80"
			if u.Scheme == "https" {
				port = "443"
			}
			host = net.JoinHostPort(u.Hostname(), port)
		}
		c, derr := d.DialContext(ctx, "tcp", host)
		if derr == nil {
			_ = c.Close()
			return nil, nil
		}
		failed, err = append(failed, fmt.Sprintf("%s: %v", raw, derr)), derr
	}
	return failed, err
}
