package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/sdk"
)

// The commands a protected resource's operator uses (issue 23,
// docs/fencing.md): the cluster's fence public keys, and whether a token
// is still its key's current one.

// pubkeyOptions are fence pubkey's flags.
type pubkeyOptions struct {
	cf     *clientFlags
	group  uint32
	asJSON bool
}

func fencePubkeyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pubkey",
		Short: "Print the public keys that verify this cluster's fences",
		Long: `Print the cluster's fence public keys, one per line, oldest first (the last
signs new fences), in the form fence.ParsePublicKey and a resource's
configuration read ("tfk1.…"); --json prints {"cluster_id","keys","current"}
instead. A resource trusts the cluster ID (ticketd status) and these keys.
Read through the leader: a rotation acknowledged before is included.
In a partitioned deployment each group has its own ID and keys (--group).`,
		Example: `  ticketd fence pubkey > trusted-keys.txt
  ticketd fence pubkey --json
  ticketd fence pubkey --partitioned --group 3`,
		Args: exactArgs(),
	}
	o := &pubkeyOptions{cf: addClientFlags(cmd)}
	cmd.Flags().Uint32Var(&o.group, "group", 0, "in a partitioned deployment (--partitioned), the group whose keys to print")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, `print {"cluster_id","keys","current"} instead of one key a line`)
	cmd.RunE = bind(o, fencePubkey)
	return cmd
}

func fencePubkey(ctx context.Context, o *pubkeyOptions, _ []string, stdout, stderr io.Writer) int {
	if o.cf.fs.Changed("group") && !o.cf.partitioned {
		return usagef(stderr, "--group needs --partitioned")
	}
	cl, ctx, done, err := o.cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	var keys sdk.FenceKeys
	if o.cf.partitioned {
		keys, err = cl.GroupFenceKeys(ctx, o.group)
	} else {
		keys, err = cl.FenceKeys(ctx)
	}
	if err != nil {
		return fail(stderr, err)
	}
	if len(keys.Keys) == 0 {
		fmt.Fprintln(stderr, "error: unavailable: the cluster has no fence key yet (it makes one once every member runs cluster version 3 or later; see ticketd status); retry later")
		return exitFailure
	}
	if o.asJSON {
		texts := make([]string, len(keys.Keys))
		for i, k := range keys.Keys {
			texts[i] = k.String()
		}
		printJSON(stdout, map[string]any{"cluster_id": fence.FormatClusterID(keys.ClusterID), "keys": texts, "current": keys.Current.String()})
		return 0
	}
	for _, k := range keys.Keys {
		fmt.Fprintln(stdout, k.String())
	}
	return 0
}

func lockCheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check KEY TOKEN",
		Short: "Tell whether TOKEN is KEY's current token (exit 0) or not (exit 1)",
		Long: `Ask the leader whether KEY is held with TOKEN right now (a linearizable
read) and print {"key","current","token"}, token being the one KEY is held
with now (0: free). Exit status 0 when TOKEN is current, 1 when it is not
(or on an error, which goes to stderr instead). A token once not current
never is again.`,
		Example: `  ticketd lock check orders/42 17 && echo "17 still holds orders/42"`,
		Args:    exactArgs("KEY", "TOKEN"),
	}
	cmd.RunE = bind(addClientFlags(cmd), lockCheck)
	return cmd
}

// lockCheck is `ticketd lock check KEY TOKEN`.
func lockCheck(ctx context.Context, cf *clientFlags, pos []string, stdout, stderr io.Writer) int {
	token, err := strconv.ParseUint(pos[1], 10, 64)
	if err != nil || token == 0 {
		return usagef(stderr, "TOKEN must be a positive integer, got %q", pos[1])
	}
	cl, ctx, done, err := cf.connect(ctx)
	if err != nil {
		return fail(stderr, err)
	}
	defer done()
	c, err := cl.Check(ctx, pos[0], token)
	if err != nil {
		return fail(stderr, err)
	}
	printJSON(stdout, map[string]any{"key": c.Key, "current": c.Current, "token": c.Token})
	if !c.Current {
		return exitFailure
	}
	return 0
}
