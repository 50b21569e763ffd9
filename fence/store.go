package fence

import (
	"context"
	"sync"
)

// Store keeps, per lock key, the highest token a resource has accepted.
// The rule every Store follows (and fencetest.Run checks):
//
//   - Advance(key, token) accepts token if no higher token was accepted
//     for key, and records it as the highest. An equal token is accepted:
//     the same holder may write many times.
//   - A lower token is refused with an *Error of CodeStale (errors.Is
//     ErrStale) whose Current is the highest token; nothing changes.
//   - Calls are atomic: concurrent Advances behave as if made one at a
//     time, so the highest token can only rise.
//   - A key or token outside ValidateAdvance's limits is refused with
//     ErrInvalidArgument; an ended ctx ends the call with ctx's error.
//
// Advance alone makes the check atomic, not the check and the write it
// guards: a resource must make sure no write of a token lands after a
// higher token's Advance. fencepg.Advance does it by running inside the
// transaction of the write; fencehttp holds a per-key lock from Advance
// until the handler returns.
type Store interface {
	Advance(ctx context.Context, key string, token uint64) error
}

// DefaultMemoryStoreMaxKeys is a MemoryStore's key limit when
// NewMemoryStore is given 0: about 150 MB if every key is 512 bytes long,
// 20 MB with 32-byte keys.
const DefaultMemoryStoreMaxKeys = 1 << 18

// MemoryStore is a Store in process memory, for a resource whose own
// state is in memory too (a resource whose state survives a restart must
// keep its highest tokens with that state: after a restart an empty
// MemoryStore would accept any token again). It never forgets a key, so
// it refuses a new key with ErrStoreFull once it holds its maximum.
type MemoryStore struct {
	maxKeys int

	mu     sync.Mutex        // guards tokens
	tokens map[string]uint64 // the highest accepted token per key
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore holding at most maxKeys keys
// (DefaultMemoryStoreMaxKeys when maxKeys <= 0).
func NewMemoryStore(maxKeys int) *MemoryStore {
	if maxKeys <= 0 {
		maxKeys = DefaultMemoryStoreMaxKeys
	}
	return &MemoryStore{maxKeys: maxKeys, tokens: make(map[string]uint64)}
}

// Advance implements Store.
func (s *MemoryStore) Advance(ctx context.Context, key string, token uint64) error {
	if err := ValidateAdvance(key, token); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.tokens[key]
	switch {
	case ok && token < cur:
		return Stale(key, token, cur)
	case !ok && len(s.tokens) >= s.maxKeys:
		return errorf(CodeStoreFull, "the store holds its maximum of %d keys and refuses key %q", s.maxKeys, key)
	}
	s.tokens[key] = token
	return nil
}

// Current returns the highest token accepted for key, and false if none
// was.
func (s *MemoryStore) Current(key string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[key]
	return t, ok
}

// Len is the number of keys the store holds.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tokens)
}
