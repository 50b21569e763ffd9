package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/fence/fencepg"
)

// notesSchema is the protected resource: one note per lock key. token and
// writer say who wrote the body last, for people reading the table; the
// fence's own record of the highest token is fencepg's table.
const notesSchema = `CREATE TABLE IF NOT EXISTS notes (
	key    text   PRIMARY KEY,
	body   text   NOT NULL,
	writer text   NOT NULL,
	token  bigint NOT NULL
)`

// Note is one row of notes.
type Note struct {
	Key    string `json:"key"`
	Body   string `json:"body"`
	Writer string `json:"writer"`
	Token  uint64 `json:"token"`
	// Fence is the highest token the fence accepted for Key (0: none).
	Fence uint64 `json:"fence"`
}

// Notes is the resource's side: the writes it accepts and the rules it
// applies to them.
type Notes struct {
	db *sql.DB
	// verifier decides which fences are authentic (the cluster's public
	// keys and ID); nil refuses every fenced write.
	verifier *fence.Verifier
}

// Setup creates the tables if needed and empties key's note. The fence's
// record of key stays: tokens only rise, so a new run's are higher.
func (n *Notes) Setup(ctx context.Context, key string) error {
	if _, err := n.db.ExecContext(ctx, notesSchema); err != nil {
		return fmt.Errorf("create table notes: %w", err)
	}
	if err := fencepg.Migrate(ctx, n.db); err != nil {
		return err
	}
	_, err := n.db.ExecContext(ctx, `INSERT INTO notes VALUES ($1, '', '', 0)
		ON CONFLICT (key) DO UPDATE SET body = '', writer = '', token = 0`, key)
	if err != nil {
		return fmt.Errorf("empty the note %q: %w", key, err)
	}
	return nil
}

// Read returns key's note.
func (n *Notes) Read(ctx context.Context, key string) (Note, error) {
	nt := Note{Key: key}
	var token int64
	err := n.db.QueryRowContext(ctx, `SELECT body, writer, token FROM notes WHERE key = $1`, key).Scan(&nt.Body, &nt.Writer, &token)
	if errors.Is(err, sql.ErrNoRows) {
		return Note{}, fmt.Errorf("no note %q: run setup first", key)
	} else if err != nil {
		return Note{}, fmt.Errorf("read the note %q: %w", key, err)
	}
	nt.Token = uint64(token)
	if nt.Fence, err = fencepg.Current(ctx, n.db, key); err != nil {
		return Note{}, err
	}
	return nt, nil
}

// WriteFenced replaces key's body for the holder of fence fc, if fc is an
// authentic fence of the trusted cluster for key and its token is not
// lower than the highest token accepted for key: fencepg.Advance and the
// write commit in one transaction, or neither does. It returns the token
// written. A forged, foreign or other key's fence is refused with its
// fence code (fence_forged, fence_unknown_key, fence_wrong_cluster,
// fence_wrong_key, fence_malformed) before the database is touched; a
// lower token with fence.ErrStale, naming the token that was accepted.
func (n *Notes) WriteFenced(ctx context.Context, key, fc, body, writer string) (uint64, error) {
	if fc == "" {
		return 0, &fence.Error{Code: fence.CodeMissing, Msg: "a fenced write needs the lock holder's fence"}
	}
	if n.verifier == nil {
		return 0, errors.New("no trusted fence keys configured")
	}
	f, err := n.verifier.Verify(fc)
	if err != nil {
		return 0, err
	}
	if f.Key != key {
		return 0, &fence.Error{Code: fence.CodeWrongKey, Msg: fmt.Sprintf("the fence is for key %q, the note is %q", f.Key, key)}
	}
	tx, err := n.db.BeginTx(ctx, nil) // READ COMMITTED: enough for Advance
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() // a no-op once committed
	if err := fencepg.Advance(ctx, tx, f.Key, f.Token); err != nil {
		return 0, err
	}
	if err := update(ctx, tx, key, f.Token, body, writer); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return f.Token, nil
}

// WriteUnfenced replaces key's body whatever the token: what a resource
// does that trusts the lock alone.
func (n *Notes) WriteUnfenced(ctx context.Context, key string, token uint64, body, writer string) error {
	return update(ctx, n.db, key, token, body, writer)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func update(ctx context.Context, db execer, key string, token uint64, body, writer string) error {
	res, err := db.ExecContext(ctx, `UPDATE notes SET body = $2, writer = $3, token = $4 WHERE key = $1`, key, body, writer, int64(token))
	if err != nil {
		return fmt.Errorf("write the note %q: %w", key, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("no note %q: run setup first", key)
	}
	return nil
}
