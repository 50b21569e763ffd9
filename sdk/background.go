package sdk

import (
	"errors"
	"fmt"
	"sync"
)

// ErrClientClosed: the client was closed (Client.Close). A session or a
// kept-alive lock it ended fails with an error matching both this and
// ErrLost: nothing renews it any more, so it must be assumed gone, although
// the cluster keeps it until its TTL or lease runs out.
var ErrClientClosed = errors.New("ticketd: client closed")

// background is what a client runs for its callers without being asked
// each time: the keepalives of its sessions and of its kept-alive locks
// (WithAutoRenew, Lock.KeepAlive). Close ends them all, so a closed
// client leaves no goroutine renewing anything, whether or not it owns
// its connection.
type background struct {
	mu       sync.Mutex
	closed   bool
	sessions map[*Session]struct{}
	locks    map[*Lock]struct{}
}

func newBackground() *background {
	return &background{sessions: make(map[*Session]struct{}), locks: make(map[*Lock]struct{})}
}

func (b *background) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// addSession records s, or refuses once the client is closed.
func (b *background) addSession(s *Session) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClientClosed
	}
	b.sessions[s] = struct{}{}
	return nil
}

func (b *background) dropSession(s *Session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sessions, s)
}

// addLock records l, whose keepalive is starting, or refuses once the
// client is closed.
func (b *background) addLock(l *Lock) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClientClosed
	}
	b.locks[l] = struct{}{}
	return nil
}

func (b *background) dropLock(l *Lock) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.locks, l)
}

// close marks the client closed and ends every session and kept-alive
// lock it recorded (outside b.mu: ending one drops it from b).
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	sessions, locks := b.sessions, b.locks
	b.sessions, b.locks = make(map[*Session]struct{}), make(map[*Lock]struct{})
	b.mu.Unlock()
	for s := range sessions {
		s.end(fmt.Errorf("%w: %w: session %s is no longer kept alive; the cluster ends it within its TTL (%v)", ErrLost, ErrClientClosed, s.ID, s.TTL))
	}
	for l := range locks {
		l.end(fmt.Errorf("%w: %w: lock %q is no longer renewed; the cluster ends it within its lease", ErrLost, ErrClientClosed, l.Key))
	}
}
