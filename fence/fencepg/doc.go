// Package fencepg keeps ticketd's "highest token seen per key" in
// PostgreSQL, in the same transaction as the write the token guards, so
// the check and the write commit together or not at all.
//
// # Use
//
// Create the table once (Migrate, or the Schema statement in your own
// migrations). Then, in every transaction that writes what a lock
// protects, call Advance before the write, with the key and token of a
// verified fence:
//
//	tx, err := db.BeginTx(ctx, nil) // READ COMMITTED, PostgreSQL's default
//	defer tx.Rollback()
//	if err := fencepg.Advance(ctx, tx, f.Key, f.Token); err != nil {
//		return err // fence.ErrStale: a newer holder wrote; write nothing
//	}
//	// ... the write ...
//	return tx.Commit()
//
// Advance is one INSERT ... ON CONFLICT DO UPDATE ... WHERE token <= new.
// It locks the key's row until the transaction ends, so writers of one
// key run one at a time from Advance to commit: a writer with a lower
// token that comes while a higher one is in flight waits, then is refused
// (PostgreSQL re-checks the WHERE against the committed row). READ
// COMMITTED is enough. Under REPEATABLE READ or SERIALIZABLE, a writer
// that meets a row changed since its snapshot gets a serialization
// failure (SQLSTATE 40001) instead: retry the transaction, as with any
// write at those levels. If the transaction rolls back, so does the
// advance. A transaction that advances several keys must do it in one
// order (sorted), or two of them can deadlock.
//
// Equal tokens are accepted (the same holder writing again); lower ones
// are refused with a *fence.Error of fence.CodeStale naming the current
// token.
//
// # What it owns
//
// The table ticketd_fence(key text primary key, token bigint), Advance,
// Current, Migrate, and Store (a fence.Store on a *sql.DB, each Advance in
// its own statement, for fencehttp).
//
// # What it does not own
//
// A database driver: it works on database/sql (any PostgreSQL driver;
// its tests use pgx's). Tokens above the bigint range (2^63-1) are
// refused with fence.ErrInvalidArgument; ticketd issues one token per
// grant, so a cluster never gets there.
package fencepg
