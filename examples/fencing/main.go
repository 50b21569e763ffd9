// Command fencing is Kleppmann's fencing scenario with a ticketd lock
// and a PostgreSQL row: a worker takes the lock, reads a note, appends
// its line and writes the note back. With --pause-before-write it stops
// itself (SIGSTOP) between its last look at the lock and its write, as a
// long GC pause would; another worker takes the lock meanwhile. With the
// fence (the default) the writer verifies the grant's signed fence with
// the cluster's public keys and the late write is refused in the
// database; with --fence=false it overwrites the other worker's line. See
// README.md.
//
//	fencing setup --pg URL [--key K]      create the tables, empty the note
//	fencing work  --pg URL --id A [...]   one worker
//	fencing show  --pg URL [--key K]      print the note as JSON
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/sdk"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitRefused = 3 // the resource refused the write: a newer holder wrote, or the fence is not authentic
)

// requestTimeout bounds each database statement and lock request apart
// from the acquire's wait.
const requestTimeout = 10 * time.Second

// PostgreSQL's password is a secret: never in --pg (ps shows a command
// line to every user), but from --pg-password-file, the file
// TICKETD_PG_PASSWORD_FILE names, or TICKETD_PG_PASSWORD, as ticketd's
// own secrets (README, "Secrets"). pgx also reads libpq's PGPASSWORD and
// PGPASSFILE.
const (
	pgPasswordFileEnv = "TICKETD_PG_PASSWORD_FILE"
	pgPasswordEnv     = "TICKETD_PG_PASSWORD"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var code int
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "setup", "show":
		code = runNoteCommand(ctx, cmd, args)
	case "work":
		code = runWork(ctx, args)
	default:
		usage()
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fencing setup|work|show --pg URL [flags]; fencing COMMAND -h lists the flags")
	os.Exit(exitUsage)
}

// pgFlags are the database flags every command takes.
type pgFlags struct {
	url, passwordFile, key string
}

func addPGFlags(fs *flag.FlagSet) *pgFlags {
	p := &pgFlags{}
	fs.StringVar(&p.url, "pg", "", "PostgreSQL URL without a password, e.g. postgres://app@127.0.0.1:5432/app (required)")
	fs.StringVar(&p.passwordFile, "pg-password-file", "", "file holding the PostgreSQL password (or "+pgPasswordFileEnv+", "+pgPasswordEnv+")")
	fs.StringVar(&p.key, "key", "notes/1", "the lock key, and the note it protects")
	return p
}

// open connects to the database, the password never passing through a
// string that could be printed.
func (p *pgFlags) open() (*sql.DB, error) {
	if p.url == "" {
		return nil, errors.New("--pg is required")
	}
	u, err := url.Parse(p.url)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("--pg is a postgres:// URL")
	}
	if _, ok := u.User.Password(); ok {
		return nil, fmt.Errorf("--pg carries a password, which ps and logs would show: use --pg-password-file FILE, %s or %s", pgPasswordFileEnv, pgPasswordEnv)
	}
	cfg, err := pgx.ParseConfig(p.url)
	if err != nil {
		return nil, fmt.Errorf("--pg: %w", err)
	}
	pw, err := resolveSecret(p.passwordFile)
	if err != nil {
		return nil, err
	}
	if pw != "" {
		cfg.Password = pw
	}
	return stdlib.OpenDB(*cfg), nil
}

// resolveSecret reads the password from file, else from the file
// TICKETD_PG_PASSWORD_FILE names, else from TICKETD_PG_PASSWORD; "" when
// none is set. A file and TICKETD_PG_PASSWORD that differ are refused, as
// ticketd refuses its own.
func resolveSecret(file string) (string, error) {
	if file == "" {
		file = os.Getenv(pgPasswordFileEnv)
	}
	value := os.Getenv(pgPasswordEnv)
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("pg-password-file: %w", err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if value != "" && value != pw {
		return "", fmt.Errorf("the PostgreSQL password file and %s differ: set one", pgPasswordEnv)
	}
	return pw, nil
}

func runNoteCommand(ctx context.Context, cmd string, args []string) int {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	pg := addPGFlags(fs)
	_ = fs.Parse(args) // ExitOnError: exits 2 itself
	db, err := pg.open()
	if err != nil {
		return fail(exitUsage, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	notes := &Notes{db: db}
	if cmd == "setup" {
		if err := notes.Setup(ctx, pg.key); err != nil {
			return fail(exitFailed, err)
		}
		fmt.Printf("note %q is empty\n", pg.key)
		return exitOK
	}
	n, err := notes.Read(ctx, pg.key)
	if err != nil {
		return fail(exitFailed, err)
	}
	b, _ := json.Marshal(n)
	fmt.Println(string(b))
	return exitOK
}

// workConfig is one worker's settings.
type workConfig struct {
	id, nats            string
	trustedKeys         string // file of `ticketd fence pubkey --json`; "": ask the cluster
	lease, wait, work   time.Duration
	fenced, pauseBefore bool
}

func runWork(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("work", flag.ExitOnError)
	pg := addPGFlags(fs)
	var c workConfig
	fs.StringVar(&c.id, "id", "", "this worker's name, written into the note (required)")
	fs.StringVar(&c.nats, "nats", "nats://127.0.0.1:4222", "NATS URL(s) of the ticketd cluster, comma-separated")
	fs.DurationVar(&c.lease, "lease", time.Second, "the lock's lease; the worker keeps it alive while it runs")
	fs.DurationVar(&c.wait, "wait", 30*time.Second, "how long to wait in the key's queue")
	fs.DurationVar(&c.work, "work", 100*time.Millisecond, "how long the work between the read and the write takes")
	fs.BoolVar(&c.fenced, "fence", true, "write through the fence: the grant's signed fence, verified, its token recorded with the write (false: trust the lock alone)")
	fs.StringVar(&c.trustedKeys, "trusted-keys", "", "the resource's trusted cluster ID and fence keys: a file `ticketd fence pubkey --json` wrote (default: ask the cluster for its keys)")
	fs.BoolVar(&c.pauseBefore, "pause-before-write", false, "stop this process (SIGSTOP) just before the write; kill -CONT resumes it")
	_ = fs.Parse(args)
	if c.id == "" {
		return fail(exitUsage, errors.New("--id is required"))
	}
	if u, err := url.Parse(c.nats); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return fail(exitUsage, errors.New("--nats carries a password, which ps and logs would show"))
		}
	}
	db, err := pg.open()
	if err != nil {
		return fail(exitUsage, err)
	}
	defer db.Close()
	return work(ctx, c, pg.key, &Notes{db: db})
}

// work is one worker: take the lock, read the note, work, append a line,
// write the note back, release.
func work(ctx context.Context, c workConfig, key string, notes *Notes) int {
	cl, err := sdk.Connect(c.nats)
	if err != nil {
		return fail(exitFailed, err)
	}
	defer cl.Close()
	if c.fenced {
		// The resource's trust: the cluster and keys whose fences it
		// accepts. Configured before any lock is taken, as a resource's
		// configuration is.
		from := c.trustedKeys
		if from != "" {
			notes.verifier, err = loadVerifier(from)
		} else {
			from = "the cluster"
			notes.verifier, err = clusterVerifier(ctx, cl)
		}
		if err != nil {
			return fail(exitFailed, err)
		}
		say("%s's resource trusts the fences of cluster %s (keys from %s)", c.id, fence.FormatClusterID(notes.verifier.ClusterID()), from)
	}
	actx, cancel := context.WithTimeout(ctx, c.wait+requestTimeout)
	lock, err := cl.Acquire(actx, key, sdk.WithLease(c.lease), sdk.WithWait(c.wait), sdk.WithOwner(c.id), sdk.WithAutoRenew())
	cancel()
	if err != nil {
		return fail(exitFailed, err)
	}
	say("%s acquired %s token=%d", c.id, key, lock.Token)
	if c.fenced && lock.Fence == "" {
		return fail(exitFailed, errors.New("the grant carries no fence: the cluster has no fence key yet (`ticketd fence pubkey` prints it once made)"))
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		if err := lock.Release(rctx); err != nil {
			say("%s release token=%d: %v", c.id, lock.Token, err)
		} else {
			say("%s released token=%d", c.id, lock.Token)
		}
	}()

	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	note, err := notes.Read(rctx, key)
	cancel()
	if err != nil {
		return fail(exitFailed, err)
	}
	say("%s read %q", c.id, note.Body)
	select { // the work itself: nothing to wait for, it just takes time
	case <-time.After(c.work):
	case <-ctx.Done():
		return fail(exitFailed, ctx.Err())
	}
	body := note.Body + fmt.Sprintf("%s was here with token %d\n", c.id, lock.Token)

	// The last look at the lock: it is valid. Anything may happen between
	// here and the write.
	say("%s lock valid for another %v, writing", c.id, lock.Remaining().Round(time.Millisecond))
	if c.pauseBefore {
		pid := os.Getpid()
		say("%s paused (SIGSTOP) before its write; kill -CONT %d resumes it", c.id, pid)
		paused := time.Now()
		if err := pauseSelf(); err != nil {
			return fail(exitFailed, err)
		}
		say("%s resumed after %v (lease %v); writing as if it still held the lock", c.id, time.Since(paused).Round(time.Millisecond), c.lease)
	}

	wctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if c.fenced {
		// The writer gets the fence, not a number: the resource takes the
		// token from the fence once its signature verifies.
		_, err = notes.WriteFenced(wctx, key, lock.Fence, body, c.id)
	} else {
		err = notes.WriteUnfenced(wctx, key, lock.Token, body, c.id)
	}
	switch {
	case fence.CodeOf(err) != "":
		say("%s write refused: %v", c.id, err)
		return exitRefused
	case err != nil:
		return fail(exitFailed, err)
	}
	say("%s wrote token=%d fenced=%v", c.id, lock.Token, c.fenced)
	return exitOK
}

// say prints one line of the worker's story on stdout.
func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func fail(code int, err error) int {
	fmt.Fprintln(os.Stderr, "error:", err)
	return code
}
