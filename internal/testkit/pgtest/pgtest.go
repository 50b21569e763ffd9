// Package pgtest starts a throwaway PostgreSQL server for the tests of
// fence/fencepg and examples/fencing: initdb into a temporary directory,
// postgres on a free 127.0.0.1 port, one fresh schema per test.
//
// # What it owns
//
// Finding the PostgreSQL binaries (PATH, then /usr/lib/postgresql/*/bin),
// running them as an unprivileged user when the tests run as root
// (postgres refuses to run as root), waiting until the server answers,
// and stopping it. A test binary starts one server in TestMain and calls
// Skip in each test when there is none. NewDB hands a test a schema of
// its own as a *sql.DB, NewSchema as a connection URL too, for a process
// the test starts.
//
// # What it does not own
//
// Installing PostgreSQL: .ci/run installs Debian's postgresql package
// when initdb is missing.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/ticketd/ticketd/internal/testkit"
)

// Timeouts of the server's life. Each is far above what the step takes
// (initdb about 1-2 s, start well under 1 s) so a loaded machine does not
// fail the tests; a broken install fails them once the timeout passes.
const (
	initdbTimeout   = 60 * time.Second
	startTimeout    = 30 * time.Second
	stopTimeout     = 10 * time.Second
	pollInterval    = 20 * time.Millisecond
	startAttempts   = 3 // a port taken between the pick and the bind: pick again
	installHint     = "install PostgreSQL (Debian: apt-get install postgresql; .ci/run does it) to run them"
	unprivilegedEnv = "PGTEST_USER"
)

// ErrNotFound: no PostgreSQL binaries on this machine.
var ErrNotFound = errors.New("pgtest: PostgreSQL not found (initdb and postgres in PATH or /usr/lib/postgresql/*/bin)")

// Server is a running PostgreSQL server that belongs to the test binary.
type Server struct {
	dir  string // the data directory (removed at Stop)
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when postgres exited
	log  *lockedBuffer // postgres's output, for failures
	dbs  atomic.Int64  // databases created, for their names
}

// Start runs initdb and postgres. It returns ErrNotFound when PostgreSQL
// is not installed.
func Start(ctx context.Context) (*Server, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: hand %s to uid %d: %w", dir, cred.Uid, err)
		}
	}
	ictx, cancel := context.WithTimeout(ctx, initdbTimeout)
	defer cancel()
	initdb := exec.CommandContext(ictx, filepath.Join(bin, "initdb"),
		"-D", dir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")
	setup(initdb, dir, cred)
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: %s: %w\n%s", initdb, err, out)
	}
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, bin, dir, cred)
		if err == nil {
			return s, nil
		}
		if attempt == startAttempts || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// start runs postgres on a fresh free port and waits until it answers.
func start(ctx context.Context, bin, dir string, cred *syscall.Credential) (*Server, error) {
	addr, err := testkit.PickFreeAddr()
	if err != nil {
		return nil, fmt.Errorf("pgtest: free port: %w", err)
	}
	_, p, _ := strings.Cut(addr, ":")
	port, _ := strconv.Atoi(p)
	s := &Server{dir: dir, port: port, done: make(chan struct{}), log: &lockedBuffer{}}
	// No unix socket (its default directory may not exist or be writable),
	// and no durability: the data dies with the test.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", dir, "-p", p,
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=60", "-c", "shared_buffers=16MB")
	setup(s.cmd, dir, cred)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: start %s: %w", s.cmd, err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()

	db, err := sql.Open("pgx", s.dsn(""))
	if err != nil {
		s.kill()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer db.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.PingContext(pctx)
		cancel()
		switch {
		case err == nil:
			return s, nil
		case ctx.Err() != nil || time.Now().After(deadline):
			s.kill()
			return nil, fmt.Errorf("pgtest: postgres on %s did not answer within %v: %w\n%s", addr, startTimeout, err, s.log)
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("pgtest: postgres on %s exited: %v\n%s", addr, s.cmd.ProcessState, s.log)
		case <-time.After(pollInterval):
		}
	}
}

// setup makes cmd run in dir, with a fixed locale, as cred's user (nil:
// as this process's), and dies with the test binary.
func setup(cmd *exec.Cmd, dir string, cred *syscall.Credential) {
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	cmd.SysProcAttr = sysProcAttr(cred)
}

// credential is nil when this process is not root; as root, it is the
// user postgres (or $PGTEST_USER, or nobody) that the server runs as.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	names := []string{"postgres", "nobody"}
	if n := os.Getenv(unprivilegedEnv); n != "" {
		names = []string{n}
	}
	for _, n := range names {
		u, err := user.Lookup(n)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("pgtest: running as root, and none of the users %v exists to run PostgreSQL as (it refuses root); set %s to an unprivileged user or run the tests as one", names, unprivilegedEnv)
}

// findBinaries returns the directory holding initdb and postgres of one
// installation: initdb's in PATH (through symlinks), else the newest
// /usr/lib/postgresql/*/bin.
func findBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	installed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(installed, func(a, b string) int { return versionOf(b) - versionOf(a) })
	dirs = append(dirs, installed...)
	for _, d := range dirs {
		if executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", ErrNotFound
}

func versionOf(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return n
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// dsn is the server's database "postgres" with search_path set to
// schema (none when "").
func (s *Server) dsn(schema string) string {
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if schema != "" {
		dsn += "&search_path=" + schema
	}
	return dsn
}

// NewDB returns a handle on an empty schema of its own for t (its
// connections' search_path), closed at t's cleanup. A schema costs
// milliseconds, a database a checkpoint.
func (s *Server) NewDB(t testing.TB) *sql.DB {
	t.Helper()
	db, _ := s.NewSchema(t)
	return db
}

// NewSchema is NewDB that also returns the handle's connection URL
// (user postgres, no password: the server trusts every local connection),
// for a process the test starts.
func (s *Server) NewSchema(t testing.TB) (*sql.DB, string) {
	t.Helper()
	name := fmt.Sprintf("t%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := sql.Open("pgx", s.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", name, err)
	}
	db, err := sql.Open("pgx", s.dsn(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, s.dsn(name)
}

// Stop shuts the server down (fast shutdown, then a kill) and removes its
// data directory.
func (s *Server) Stop() {
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		s.kill()
	}
	os.RemoveAll(s.dir)
}

func (s *Server) kill() {
	s.cmd.Process.Kill()
	<-s.done
}

// SkipReason is what a test says when it skips because Start failed with
// err.
func SkipReason(err error) string {
	if errors.Is(err, ErrNotFound) {
		return "PostgreSQL tests skipped: " + err.Error() + "; " + installHint
	}
	return ""
}

// lockedBuffer collects postgres's output from its writer goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
