package fencepg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/fence/fencepg"
	"github.com/ticketd/ticketd/fence/fencetest"
	"github.com/ticketd/ticketd/internal/testkit"
)

func TestStoreConformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fence.Store { return fencepg.NewStore(newDB(t)) })
}

func TestMigrateTwice(t *testing.T) {
	db := newDB(t) // migrated once
	if err := fencepg.Migrate(context.Background(), db); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
}

func TestTokenRange(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	if err := fencepg.Advance(ctx, db, "k", math.MaxInt64); err != nil {
		t.Fatalf("the largest bigint token: %v", err)
	}
	if cur, err := fencepg.Current(ctx, db, "k"); err != nil || cur != math.MaxInt64 {
		t.Fatalf("Current = %d, %v", cur, err)
	}
	if err := fencepg.Advance(ctx, db, "k", math.MaxInt64+1); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("a token above bigint: %v, want fence_invalid_argument", err)
	}
	if cur, err := fencepg.Current(ctx, db, "never"); err != nil || cur != 0 {
		t.Fatalf("Current of a key never advanced = %d, %v; want 0", cur, err)
	}
}

// TestRollbackUndoesAdvance: a transaction that advances and then fails
// leaves the recorded token as it was.
func TestRollbackUndoesAdvance(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	if err := fencepg.Advance(ctx, db, "k", 3); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencepg.Advance(ctx, tx, "k", 8); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := fencepg.Advance(ctx, db, "k", 4); err != nil {
		t.Fatalf("after the rollback of 8, token 4: %v", err)
	}
}

// waitForLockWaiters polls until n backends wait on a lock: the second
// transaction is queued behind the first's row lock.
func waitForLockWaiters(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d transactions waiting on a row lock", n), func() bool {
		var got int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		return got >= n
	})
}

// TestInFlightTransactions: a writer that arrives while another holds the
// key's row waits for it to end, then is judged against what committed.
func TestInFlightTransactions(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second uint64
		commitFirst   bool
		wantStale     bool // the second is refused, with current = first
	}{
		{"lower after a committed higher is refused", 5, 4, true, true},
		{"higher after a committed lower is accepted", 4, 5, true, false},
		{"equal after a committed equal is accepted", 5, 5, true, false},
		{"lower after a rolled-back higher is accepted", 5, 4, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := fencepg.Advance(ctx, db, "k", 1); err != nil {
				t.Fatal(err)
			}
			tx1, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback()
			if err := fencepg.Advance(ctx, tx1, "k", tc.first); err != nil {
				t.Fatal(err)
			}
			second := make(chan error, 1)
			go func() {
				tx2, err := db.BeginTx(ctx, nil)
				if err != nil {
					second <- err
					return
				}
				defer tx2.Rollback()
				if err := fencepg.Advance(ctx, tx2, "k", tc.second); err != nil {
					second <- err
					return
				}
				second <- tx2.Commit()
			}()
			waitForLockWaiters(t, db, 1)
			select {
			case err := <-second:
				t.Fatalf("the second writer finished (%v) while the first held the key", err)
			default:
			}
			if tc.commitFirst {
				err = tx1.Commit()
			} else {
				err = tx1.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-second
			var fe *fence.Error
			switch {
			case tc.wantStale && (!errors.As(err, &fe) || fe.Code != fence.CodeStale || fe.Current != tc.first):
				t.Fatalf("second writer: %v, want fence_stale with current %d", err, tc.first)
			case !tc.wantStale && err != nil:
				t.Fatalf("second writer: %v, want accepted", err)
			}
		})
	}
}

// TestConcurrentWritersReadCommitted: workers write a data row under
// random tokens, each in a READ COMMITTED transaction that advances the
// fence first. If Advance serializes the writers of a key, every writer
// finds the row last written with a token no higher than its own, and at
// the end the row holds the highest accepted token.
func TestConcurrentWritersReadCommitted(t *testing.T) {
	const (
		workers = 6
		rounds  = 25
		keys    = 2
	)
	db := newDB(t)
	db.SetMaxOpenConns(workers + 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE data (key text PRIMARY KEY, token bigint NOT NULL, writes int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		if _, err := db.ExecContext(ctx, `INSERT INTO data VALUES ($1, 0, 0)`, fmt.Sprint("k", k)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(key string, token uint64) (bool, error) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return false, err
		}
		defer tx.Rollback()
		if err := fencepg.Advance(ctx, tx, key, token); errors.Is(err, fence.ErrStale) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		var last uint64
		if err := tx.QueryRowContext(ctx, `SELECT token FROM data WHERE key = $1`, key).Scan(&last); err != nil {
			return false, err
		}
		if last > token {
			return false, fmt.Errorf("key %s: writing with token %d over data written with token %d: the fence let a stale writer through", key, token, last)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE data SET token = $2, writes = writes + 1 WHERE key = $1`, key, int64(token)); err != nil {
			return false, err
		}
		return true, tx.Commit()
	}
	var (
		mu       sync.Mutex
		highest  = map[string]uint64{}
		accepted = map[string]int{}
		wg       sync.WaitGroup
	)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				key := fmt.Sprint("k", r.IntN(keys))
				token := 1 + r.Uint64N(50)
				ok, err := write(key, token)
				if err != nil {
					errs <- err
					return
				}
				if ok {
					mu.Lock()
					highest[key] = max(highest[key], token)
					accepted[key]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for key, h := range highest {
		var token uint64
		var writes int
		if err := db.QueryRowContext(ctx, `SELECT token, writes FROM data WHERE key = $1`, key).Scan(&token, &writes); err != nil {
			t.Fatal(err)
		}
		cur, err := fencepg.Current(ctx, db, key)
		if err != nil {
			t.Fatal(err)
		}
		if token != h || cur != h || writes != accepted[key] {
			t.Errorf("key %s: data token %d, fence %d, %d writes; want token and fence %d, %d writes", key, token, cur, writes, h, accepted[key])
		}
	}
}
