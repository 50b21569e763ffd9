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

	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/daemon"
)

// parseFlags parses args into fs and wants exactly one positional
// argument, the file. ok is false when the command is done: --help
// (code 0) or a usage error.
func parseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer) (file string, code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return "", 0, false
		}
		return "", exitUsage, false
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "ticketd %s: want one FILE argument, got %d\n", fs.Name(), fs.NArg())
		return "", exitUsage, false
	}
	return fs.Arg(0), 0, true
}

// snapshotSave asks the leader for a backup through the control API and
// writes it to FILE: first to FILE.part, synced, then renamed, so FILE is
// either the old file or a complete, verified backup.
func snapshotSave(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("snapshot save", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cc := addControlFlags(fs)
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	path, code, ok := parseFlags(fs, args, stderr)
	if !ok {
		return code
	}
	urls, cred, callOpts, err := cc.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "ticketd snapshot save: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	b, file, err := control.SaveBackup(ctx, urls, cred, callOpts...)
	if err != nil {
		code := "error"
		var ce *control.Error
		if errors.As(err, &ce) {
			code = ce.Code
		}
		fmt.Fprintf(stderr, "error: %s: %v\n", code, err)
		return exitFailure
	}
	if err := writeFileAtomic(path, file); err != nil {
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

// writeFileAtomic writes b to path through a synced temporary file and a
// rename, and syncs the directory, so a crash leaves the old file or the
// new one. The file is readable by its owner only: it holds lock owners
// and credential hashes.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// snapshotStatus verifies a backup file and prints what it holds.
func snapshotStatus(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("snapshot status", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	path, code, ok := parseFlags(fs, args, stderr)
	if !ok {
		return code
	}
	b, err := control.ReadBackup(path)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	printJSON(stdout, b.Info)
	return 0
}

const restoreUsage = `Seed the data directory of the first member of a NEW cluster from a backup.

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
blocks its key until that lease ends. --drop-locks restores none.

Flags:
`

// snapshotRestore seeds a data directory from a backup file.
func snapshotRestore(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("snapshot restore", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: ticketd snapshot restore FILE --data DIR [flags]\n\n"+restoreUsage)
		fs.PrintDefaults()
	}
	data := fs.String("data", "", "data directory of the new member (must not hold a node)")
	peer := fs.String("peer-address", "", "control-plane backup: the new member's --peer-listen address")
	id := fs.Uint64("id", 1, "static: this member's raft id")
	initial := fs.String("initial-cluster", "", "static: every member, id=host:port,... as the new cluster's --initial-cluster")
	bump := fs.Uint64("bump-tokens", control.BumpTokensDefault,
		"add this to the token counter: more than the tokens the old cluster may have issued after the backup (default 2^40)")
	token := fs.String("initial-cluster-token", daemon.Defaults().InitialClusterToken,
		"static: mixed with the backup's checksum and the member ids into the new cluster's ID (the same on every member)")
	drop := fs.Bool("drop-locks", false, "restore no locks, only the token counter (and control state)")
	path, code, ok := parseFlags(fs, args, stderr)
	if !ok {
		return code
	}
	if *data == "" {
		fmt.Fprintln(stderr, "ticketd snapshot restore: --data is required")
		return exitUsage
	}
	o := control.RestoreOptions{
		DataDir: *data, StoreDir: filepath.Join(*data, daemon.StoreDir), PeerAddress: *peer, ID: *id,
		BumpTokens: *bump, DropLocks: *drop,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if *initial != "" {
		cfg := daemon.Config{ID: *id, InitialCluster: *initial}
		members, err := cfg.Members()
		if err != nil {
			fmt.Fprintf(stderr, "ticketd snapshot restore: %v\n", err)
			return exitUsage
		}
		for _, m := range members {
			o.Voters = append(o.Voters, m.ID)
		}
	}
	b, err := control.ReadBackup(path)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	// A restored cluster is a new cluster with its own ID, so it and the
	// old one refuse each other's peers.
	if len(o.Voters) > 0 {
		sum := sha256.Sum256(b.Data)
		o.ClusterID = control.RestoredClusterID(*token, hex.EncodeToString(sum[:]), o.Voters)
	} else if o.ClusterID, err = control.RandomClusterID(); err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	res, err := control.Restore(b, o)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitFailure
	}
	if *bump == 0 {
		fmt.Fprintln(stderr, "warning: --bump-tokens 0: tokens continue right after the backup's; safe only if the old cluster granted nothing after it")
	}
	if res.Locks > 0 {
		fmt.Fprintf(stderr, "note: %d locks restored with their full lease; some may be stale (see --drop-locks)\n", res.Locks)
	}
	printJSON(stdout, struct {
		control.Restored
		Data   string             `json:"data"`
		Backup control.BackupInfo `json:"backup"`
	}{res, *data, b.Info})
	return 0
}
