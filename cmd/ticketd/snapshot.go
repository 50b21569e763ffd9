package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/daemon"
)

// saveOptions are snapshot save's flags.
type saveOptions struct {
	cc      *controlFlags
	timeout time.Duration
	force   bool
}

func snapshotSaveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "save FILE",
		Short: "Write a backup taken by the leader to FILE",
		Long: `Ask the leader, through the control API (--control, with the control
credential), for a consistent backup of the cluster and write it to FILE,
readable by its owner only (mode 0600): it holds lock owners and
credential hashes. An existing FILE is refused unless --force. FILE is
written to FILE.part, synced and moved into place, so it is either absent,
the old file or a complete backup.`,
		Example: `  ticketd snapshot save backup.tkb --control http://127.0.0.1:7100 --control-credential-file control.cred
  TICKETD_CONTROL_CREDENTIAL_FILE=control.cred ticketd snapshot save backup.tkb`,
		Args: exactArgs("FILE"),
	}
	o := &saveOptions{cc: addControlFlags(cmd.Flags())}
	cmd.Flags().DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace FILE if it exists")
	cmd.RunE = bind(o, snapshotSave)
	return cmd
}

// snapshotSave asks the leader for a backup through the control API and
// writes it to FILE: first to FILE.part, synced, then renamed, so FILE is
// either the old file or a complete, verified backup.
func snapshotSave(ctx context.Context, o *saveOptions, args []string, stdout, stderr io.Writer) int {
	path := args[0]
	urls, cred, callOpts, err := o.cc.resolve()
	if err != nil {
		return usagef(stderr, "%v", err)
	}
	if _, err := os.Lstat(path); err == nil && !o.force {
		// Before asking the leader for anything.
		fmt.Fprintf(stderr, "error: %s exists: name a new file, or --force to replace it\n", path)
		return exitFailure
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := checkReachable(ctx, urls); err != nil {
		return fail(stderr, err)
	}
	b, file, err := control.SaveBackup(ctx, urls, cred, callOpts...)
	if err != nil {
		return failControl(stderr, err)
	}
	if err := writeFileAtomic(path, file, o.force); err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	printJSON(stdout, struct {
		File  string `json:"file"`
		Bytes int    `json:"bytes"`
		control.BackupInfo
	}{path, len(file), b.Info})
	return 0
}

// verifyFlags say how status and restore authenticate a backup: with
// the control credential it was taken with, or not at all.
type verifyFlags struct {
	cred     controlFlags
	insecure bool
}

func addVerifyFlags(fs *pflag.FlagSet) *verifyFlags {
	v := &verifyFlags{}
	v.cred.addCredential(fs)
	fs.BoolVar(&v.insecure, "insecure-skip-verify", false,
		"accept a backup that cannot be authenticated: one from before authenticated backups, or without the credential")
	return v
}

// verify is the control.Verify the flags ask for; without a credential
// and without --insecure-skip-verify it is a usage error.
func (v *verifyFlags) verify() (control.Verify, error) {
	cred, err := v.cred.credential()
	if err != nil {
		return control.Verify{}, err
	}
	if cred == "" && !v.insecure {
		return control.Verify{}, errors.New("a backup is verified with the control credential it was taken with: " +
			"give --control-credential-file FILE, TICKETD_CONTROL_CREDENTIAL_FILE or TICKETD_CONTROL_CREDENTIAL (--insecure-skip-verify reads it unverified)")
	}
	return control.Verify{Key: control.NewBackupKey(cred), Insecure: v.insecure}, nil
}

// readBackup reads path as the flags say; a refusal is printed with its
// stable code, and a file read unverified with a warning.
func (v *verifyFlags) readBackup(path string, stderr io.Writer) (control.Backup, int) {
	vf, err := v.verify()
	if err != nil {
		return control.Backup{}, usagef(stderr, "%v", err)
	}
	b, err := control.ReadBackup(path, vf)
	if err != nil {
		fmt.Fprintf(stderr, "error: %s: %v\n", control.BackupErrorCode(err), err)
		return control.Backup{}, exitFailure
	}
	if !b.Authenticated {
		fmt.Fprintf(stderr, "warning: %s was not authenticated (version %d, --insecure-skip-verify): nothing shows it was not altered\n", path, b.Version)
	}
	return b, 0
}

func snapshotStatusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status FILE",
		Short: "Verify a backup file and show what it holds",
		Long: `Verify the backup FILE (format, and its MAC under the control credential
it was taken with) and print what it holds: the index and term it was
taken at, locks, last token, members, whether it carries control-plane
state, and whether it was authenticated.`,
		Example: `  ticketd snapshot status backup.tkb --control-credential-file control.cred`,
		Args:    exactArgs("FILE"),
	}
	cmd.RunE = bind(addVerifyFlags(cmd.Flags()), snapshotStatus)
	return cmd
}

// snapshotStatus verifies a backup file and prints what it holds.
func snapshotStatus(_ context.Context, v *verifyFlags, args []string, stdout, stderr io.Writer) int {
	b, code := v.readBackup(args[0], stderr)
	if code != 0 {
		return code
	}
	printJSON(stdout, struct {
		control.BackupInfo
		Version       int    `json:"version"`
		Authenticated bool   `json:"authenticated"`
		KeyID         string `json:"key_id,omitempty"`
	}{b.Info, b.Version, b.Authenticated, b.KeyID})
	return 0
}

const restoreLong = `Seed the data directory of the first member of a NEW cluster from a backup.

A control-plane backup (bootstrapped) gives the new member a fresh NodeID
and incarnation above every one the old cluster issued, as the only voter;
every old member is retired, unused join credentials are revoked. Start it
with the --peer-listen given here as --peer-address, then add members with
'ticketd admin mint-join' and 'ticketd serve --join'. Use a new peer
secret: machines of the old cluster must not reach the new one.

With --initial-cluster the restore is static instead: run it once per
member with its own --id and the same file, then start every member with
the same --initial-cluster.

Locks in the backup come back with their tokens and their full lease,
timed again from the new leader's election: a lock may be stale (its
holder may have released it, or lost it, after the backup) and then
blocks its key until that lease ends. --drop-locks restores none.`

// restoreOptions are snapshot restore's flags.
type restoreOptions struct {
	v              *verifyFlags
	data, peer     string
	id, bump       uint64
	initial, token string
	drop           bool
}

func snapshotRestoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restore FILE --data DIR",
		Short: "Seed a new cluster's first member from a backup",
		Long:  restoreLong,
		Example: `  ticketd snapshot restore backup.tkb --data /var/lib/ticketd --peer-address 10.0.0.1:7001 --control-credential-file control.cred
  TICKETD_CONTROL_CREDENTIAL=... ticketd snapshot restore backup.tkb --data data1 --id 1 --initial-cluster 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003`,
		Args: exactArgs("FILE"),
	}
	o := &restoreOptions{v: addVerifyFlags(cmd.Flags())}
	fs := cmd.Flags()
	fs.StringVar(&o.data, "data", "", "data directory of the new member (must not hold a node; required)")
	fs.StringVar(&o.peer, "peer-address", "", "control-plane backup: the new member's --peer-listen address")
	fs.Uint64Var(&o.id, "id", 1, "static: this member's raft id")
	fs.StringVar(&o.initial, "initial-cluster", "", "static: every member, id=host:port,... as the new cluster's --initial-cluster")
	fs.Uint64Var(&o.bump, "bump-tokens", control.BumpTokensDefault,
		"add this to the token counter: more than the tokens the old cluster may have issued after the backup (default 2^40; the result may not pass 2^63-1)")
	fs.StringVar(&o.token, "initial-cluster-token", daemon.Defaults().InitialClusterToken,
		"static: mixed with the backup's checksum and the member ids into the new cluster's ID (the same on every member)")
	fs.BoolVar(&o.drop, "drop-locks", false, "restore no locks, only the token counter (and control state)")
	_ = cmd.MarkFlagRequired("data")
	cmd.RunE = bind(o, snapshotRestore)
	return cmd
}

// snapshotRestore seeds a data directory from a backup file.
func snapshotRestore(_ context.Context, ro *restoreOptions, args []string, stdout, stderr io.Writer) int {
	path := args[0]
	if ro.bump > control.MaxRestoredToken {
		return usagef(stderr, "--bump-tokens %d is above %d: the restored cluster would have fewer than 2^63 tokens left", ro.bump, control.MaxRestoredToken)
	}
	o := control.RestoreOptions{
		DataDir: ro.data, StoreDir: filepath.Join(ro.data, daemon.StoreDir), PeerAddress: ro.peer, ID: ro.id,
		BumpTokens: ro.bump, DropLocks: ro.drop,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if ro.initial != "" {
		cfg := daemon.Config{ID: ro.id, InitialCluster: ro.initial}
		members, err := cfg.Members()
		if err != nil {
			return usagef(stderr, "%v", err)
		}
		for _, m := range members {
			o.Voters = append(o.Voters, m.ID)
		}
	}
	b, code := ro.v.readBackup(path, stderr)
	if code != 0 {
		return code
	}
	// A restored cluster is a new cluster with its own ID, so it and the
	// old one refuse each other's peers.
	var err error
	if len(o.Voters) > 0 {
		sum := sha256.Sum256(b.Data)
		o.ClusterID = control.RestoredClusterID(ro.token, hex.EncodeToString(sum[:]), o.Voters)
	} else if o.ClusterID, err = control.RandomClusterID(); err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	res, err := control.Restore(b, o)
	if err != nil {
		fmt.Fprintf(stderr, "error: %s: %v\n", control.BackupErrorCode(err), err)
		return exitFailure
	}
	if ro.bump == 0 {
		fmt.Fprintln(stderr, "warning: --bump-tokens 0: tokens continue right after the backup's; safe only if the old cluster granted nothing after it")
	}
	if res.Locks > 0 {
		fmt.Fprintf(stderr, "note: %d locks restored with their full lease; some may be stale (see --drop-locks)\n", res.Locks)
	}
	printJSON(stdout, struct {
		control.Restored
		Data   string             `json:"data"`
		Backup control.BackupInfo `json:"backup"`
	}{res, ro.data, b.Info})
	return 0
}
