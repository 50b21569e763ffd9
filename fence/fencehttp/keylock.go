package fencehttp

import (
	"context"
	"sync"
)

// keyLocks serializes the requests of one lock key. An entry lives while
// at least one request of its key holds or waits for it, so the map is
// bounded by the requests in flight.
type keyLocks struct {
	mu sync.Mutex          // guards m and every entry's refs
	m  map[string]*keyLock // by lock key
}

type keyLock struct {
	held chan struct{} // capacity 1: full while a request holds the key
	refs int           // requests holding or waiting
}

func newKeyLocks() *keyLocks { return &keyLocks{m: make(map[string]*keyLock)} }

// lock waits until key is free or ctx ends; on success the caller must
// call the returned unlock once.
func (k *keyLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	l := k.m[key]
	if l == nil {
		l = &keyLock{held: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	select {
	case l.held <- struct{}{}:
		return func() { <-l.held; k.unref(key, l) }, nil
	case <-ctx.Done():
		k.unref(key, l)
		return nil, ctx.Err()
	}
}

func (k *keyLocks) unref(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.m, key)
	}
}

// refs is how many requests hold or wait for key (for tests).
func (k *keyLocks) refs(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l := k.m[key]; l != nil {
		return l.refs
	}
	return 0
}

// len is the number of keys with requests in flight (for tests).
func (k *keyLocks) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
