// Package fencetest is the conformance test every fence.Store must pass:
// the "highest token seen per key" rule, equal tokens, independent keys,
// limits, cancellation, and concurrent callers. A Store implementation's
// test calls Run with a function that makes an empty store.
//
// # What it owns
//
// Run and its subtests. It uses only package fence, so a Store outside
// this module can run it too.
package fencetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/fence"
)

// Concurrency bounds of the concurrent subtest: workers × rounds
// Advances in all, on concurrencyKeys keys.
const (
	concurrencyWorkers = 8
	concurrencyRounds  = 40
	concurrencyKeys    = 3
)

// Run runs the conformance subtests; newStore returns an empty store for
// each one (it may register cleanups on the t it gets).
func Run(t *testing.T, newStore func(t *testing.T) fence.Store) {
	t.Run("HighestTokenRule", func(t *testing.T) { testHighestTokenRule(t, newStore(t)) })
	t.Run("KeysAreIndependent", func(t *testing.T) { testKeysAreIndependent(t, newStore(t)) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, newStore(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceledContext(t, newStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore(t)) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustAccept fails the test unless the store accepts token for key.
func mustAccept(t *testing.T, s fence.Store, key string, token uint64) {
	t.Helper()
	if err := s.Advance(ctxT(t), key, token); err != nil {
		t.Fatalf("Advance(%q, %d) = %v, want accepted", key, token, err)
	}
}

// mustRefuse fails the test unless the store refuses token for key as
// stale with current as the current token.
func mustRefuse(t *testing.T, s fence.Store, key string, token, current uint64) {
	t.Helper()
	err := s.Advance(ctxT(t), key, token)
	var fe *fence.Error
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &fe) {
		t.Fatalf("Advance(%q, %d) = %v, want fence_stale", key, token, err)
	}
	if fe.Key != key || fe.Token != token || fe.Current != current {
		t.Fatalf("Advance(%q, %d) refused with key %q token %d current %d, want current %d", key, token, fe.Key, fe.Token, fe.Current, current)
	}
}

func testHighestTokenRule(t *testing.T, s fence.Store) {
	const k = "orders/42"
	steps := []struct {
		token   uint64
		current uint64 // 0: accepted; else refused with this current token
	}{
		{token: 5},             // the first token for a key is accepted
		{token: 5},             // the same holder writes again
		{token: 4, current: 5}, // a former holder is refused
		{token: 1, current: 5}, // any lower token is
		{token: 9},             // a later holder skips tokens: fine
		{token: 5, current: 9}, // the holder of 5 lost the lock
		{token: 9},             // 9 still writes
		{token: 1 << 40},       // large tokens
		{token: 9, current: 1 << 40},
	}
	for _, st := range steps {
		if st.current == 0 {
			mustAccept(t, s, k, st.token)
		} else {
			mustRefuse(t, s, k, st.token, st.current)
		}
	}
}

func testKeysAreIndependent(t *testing.T, s fence.Store) {
	mustAccept(t, s, "a", 100)
	mustAccept(t, s, "b", 1) // b's tokens have nothing to do with a's
	mustAccept(t, s, "a/b", 2)
	mustRefuse(t, s, "a", 99, 100)
	mustRefuse(t, s, "a/b", 1, 2)
	mustAccept(t, s, "b", 1)
	// Keys that differ only in case, trailing space or Unicode form are
	// different keys.
	mustAccept(t, s, "A", 1)
	mustAccept(t, s, "a ", 1)
	mustAccept(t, s, "caf\u00e9", 7)
	mustAccept(t, s, "cafe\u0301", 1)
}

func testLimits(t *testing.T, s fence.Store) {
	longest := strings.Repeat("k", fence.MaxKeyLen)
	mustAccept(t, s, longest, 3)
	mustRefuse(t, s, longest, 2, 3)
	for _, tc := range []struct {
		name  string
		key   string
		token uint64
	}{
		{"empty key", "", 1},
		{"key one byte too long", longest + "k", 1},
		{"invalid UTF-8", "a\xffb", 1},
		{"NUL byte", "a\x00b", 1},
		{"token 0", "limits", 0},
	} {
		err := s.Advance(ctxT(t), tc.key, tc.token)
		if !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: Advance = %v, want fence_invalid_argument", tc.name, err)
		}
	}
	// The refused calls recorded nothing.
	mustAccept(t, s, "limits", 1)
}

func testCanceledContext(t *testing.T, s fence.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Advance(ctx, "canceled", 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("Advance with a canceled context = %v, want context.Canceled", err)
	}
	mustAccept(t, s, "canceled", 1) // 10 was not recorded
}

// testConcurrent runs workers that advance random tokens on a few keys at
// once. Whatever the interleaving: every refusal names a higher current
// token, the highest token tried on a key is accepted (nothing can be
// above it), and afterwards it is the key's current token.
func testConcurrent(t *testing.T, s fence.Store) {
	keys := make([]string, concurrencyKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("concurrent/%d", i)
	}
	type result struct {
		key      string
		token    uint64
		accepted bool
	}
	results := make(chan result, concurrencyWorkers*concurrencyRounds)
	errs := make(chan error, concurrencyWorkers)
	var wg sync.WaitGroup
	for w := range concurrencyWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range concurrencyRounds {
				key := keys[r.IntN(len(keys))]
				token := 1 + r.Uint64N(1000)
				err := s.Advance(context.Background(), key, token)
				var fe *fence.Error
				switch {
				case err == nil:
					results <- result{key, token, true}
				case errors.As(err, &fe) && fe.Code == fence.CodeStale:
					if fe.Current <= token {
						errs <- fmt.Errorf("Advance(%q, %d) refused with current %d, which is not higher", key, token, fe.Current)
						return
					}
					results <- result{key, token, false}
				default:
					errs <- fmt.Errorf("Advance(%q, %d) = %w", key, token, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	highest := map[string]uint64{}
	accepted := map[string]map[uint64]bool{}
	for r := range results {
		highest[r.key] = max(highest[r.key], r.token)
		if accepted[r.key] == nil {
			accepted[r.key] = map[uint64]bool{}
		}
		if r.accepted {
			accepted[r.key][r.token] = true
		}
	}
	for key, h := range highest {
		if !accepted[key][h] {
			t.Errorf("key %q: the highest token tried, %d, was refused", key, h)
		}
		mustAccept(t, s, key, h)
		if h > 1 {
			mustRefuse(t, s, key, h-1, h)
		}
	}
}
