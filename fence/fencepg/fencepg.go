package fencepg

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/ticketd/ticketd/fence"
)

// Table is the table that holds the highest token per key.
const Table = "ticketd_fence"

// Schema creates Table. Keys are text (fence keys are valid UTF-8 without
// NUL, which text holds in a UTF8 database).
const Schema = `CREATE TABLE IF NOT EXISTS ticketd_fence (
	key   text   PRIMARY KEY,
	token bigint NOT NULL CHECK (token > 0)
)`

// advanceSQL inserts the key's first token, or raises its token when the
// new one is not lower. An equal token updates the row too: that takes
// the row lock, so the same holder's writes are serialized like everyone
// else's. RETURNING yields no row when the WHERE refused.
const advanceSQL = `INSERT INTO ticketd_fence AS f (key, token) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token
WHERE f.token <= EXCLUDED.token
RETURNING f.token`

const currentSQL = `SELECT token FROM ticketd_fence WHERE key = $1`

// Querier is what Advance and Current run on: a *sql.Tx (the use this
// package is for), a *sql.Conn or a *sql.DB.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Execer is what Migrate runs on.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Migrate creates Table if it does not exist.
func Migrate(ctx context.Context, db Execer) error {
	if _, err := db.ExecContext(ctx, Schema); err != nil {
		return fmt.Errorf("fencepg: create table %s: %w", Table, err)
	}
	return nil
}

// Advance records token as the highest for key if no higher token was
// recorded, and refuses it with a *fence.Error of fence.CodeStale (naming
// the current token) otherwise. Run it in the transaction of the write
// the token guards, before that write; on any error, roll back.
func Advance(ctx context.Context, q Querier, key string, token uint64) error {
	if err := fence.ValidateAdvance(key, token); err != nil {
		return err
	}
	if token > math.MaxInt64 {
		return &fence.Error{Code: fence.CodeInvalidArgument, Msg: fmt.Sprintf("token %d is above PostgreSQL's bigint range", token)}
	}
	var got int64
	err := q.QueryRowContext(ctx, advanceSQL, key, int64(token)).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("fencepg: advance %q to %d: %w", key, token, err)
	}
	// Refused: a higher token is recorded. A new statement sees it (under
	// READ COMMITTED; at stricter levels the upsert of a row changed since
	// the snapshot fails with a serialization error instead).
	cur, err := Current(ctx, q, key)
	if err != nil {
		return err
	}
	if cur <= token {
		return fmt.Errorf("fencepg: %q: token %d was refused, yet the recorded token reads %d (was %s changed other than by Advance?)", key, token, cur, Table)
	}
	return fence.Stale(key, token, cur)
}

// Current returns the highest token recorded for key, 0 if none.
func Current(ctx context.Context, q Querier, key string) (uint64, error) {
	var t int64
	switch err := q.QueryRowContext(ctx, currentSQL, key).Scan(&t); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("fencepg: read the token of %q: %w", key, err)
	}
	return uint64(t), nil
}

// Store is a fence.Store on a database: each Advance is one statement of
// its own. It makes the check atomic, not the check and the write: use it
// where something else serializes the writes of a key (fencehttp's
// per-key lock in a single resource process); otherwise call Advance in
// the write's transaction.
type Store struct {
	db *sql.DB
}

var _ fence.Store = (*Store)(nil)

// NewStore returns a Store on db, whose Table must exist (Migrate).
func NewStore(db *sql.DB) *Store { return &Store{db: db} }

// Advance implements fence.Store.
func (s *Store) Advance(ctx context.Context, key string, token uint64) error {
	return Advance(ctx, s.db, key, token)
}
