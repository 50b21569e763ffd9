package fencepg_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ticketd/ticketd/fence/fencepg"
	"github.com/ticketd/ticketd/internal/testkit/pgtest"
)

// server is the PostgreSQL server of this test binary (nil: none, and
// skipReason says why), started once in TestMain: starting it costs
// about a second, a database per test a few milliseconds.
var (
	server     *pgtest.Server
	skipReason string
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	start := time.Now()
	s, err := pgtest.Start(ctx)
	cancel()
	switch {
	case err == nil:
		server = s
		fmt.Fprintf(os.Stderr, "fencepg: PostgreSQL started in %v\n", time.Since(start).Round(time.Millisecond))
	case pgtest.SkipReason(err) != "":
		skipReason = pgtest.SkipReason(err)
	default:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if server != nil {
		server.Stop()
	}
	os.Exit(code)
}

// newDB returns an empty database with the fence table, or skips the
// test when PostgreSQL is not installed.
func newDB(t *testing.T) *sql.DB {
	t.Helper()
	if server == nil {
		t.Skip(skipReason)
	}
	db := server.NewDB(t)
	if err := fencepg.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}
