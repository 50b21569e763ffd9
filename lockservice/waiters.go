package lockservice

import (
	"container/list"
	"context"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
)

// waiter is one acquire waiting for its key.
type waiter struct {
	// turn receives once when the waiter may propose its Grant; the
	// service has reserved the key on its behalf.
	turn chan struct{}
	// lost is closed when leadership is lost while the waiter is queued.
	lost chan struct{}
	// handedOff is set, with epoch, when the key was reserved for it.
	handedOff bool
	epoch     uint64 // the leadership epoch that reserved the key for it
	// refused is set instead, before turn is sent, when its turn came but
	// a limit refused its Grant (quota.go admitGrant).
	refused  error
	identity string // who its Grant counts against
	// limit and mode are its Grant's kind (kinds.go): the head is handed
	// the key only when it fits beside the key's holders.
	limit uint32
	mode  core.Mode
	elem  *list.Element
	// ref names the wait when its request carried a wait id (withdraw.go);
	// withdrawn is set by Withdraw, gone closed when it took the waiter
	// out of its queue, done when its acquire finished; token is the
	// grant a withdrawal overtook, released when its release applied.
	ref       waitRef
	withdrawn bool
	gone      chan struct{}
	done      chan struct{}
	token     uint64
	released  bool
}

// waitQueue is the FIFO of waiters for one key.
type waitQueue struct{ l list.List }

func (q *waitQueue) push(w *waiter) { w.elem = q.l.PushBack(w) }

func (q *waitQueue) remove(w *waiter) {
	if w.elem != nil {
		q.l.Remove(w.elem)
		w.elem = nil
	}
}

// front returns the head without removing it, or nil.
func (q *waitQueue) front() *waiter {
	if e := q.l.Front(); e != nil {
		return e.Value.(*waiter)
	}
	return nil
}

// pop removes and returns the head, or nil.
func (q *waitQueue) pop() *waiter {
	e := q.l.Front()
	if e == nil {
		return nil
	}
	w := q.l.Remove(e).(*waiter)
	w.elem = nil
	return w
}

func (q *waitQueue) len() int { return q.l.Len() }

// enqueue adds a waiter for identity's Grant of (limit, mode) at the back
// of key's queue (the caller checked admitWaiter). s.lead.mu held.
func (s *Service) enqueue(key, identity string, limit uint32, mode core.Mode) *waiter {
	w := &waiter{turn: make(chan struct{}, 1), lost: make(chan struct{}), gone: make(chan struct{}), identity: identity,
		limit: limit, mode: mode}
	q := s.lead.queues[key]
	if q == nil {
		q = &waitQueue{}
		s.lead.queues[key] = q
	}
	q.push(w)
	s.lead.waiters++
	s.lead.waitersBy[identity]++
	s.cfg.Metrics.Waiters.Set(float64(s.lead.waiters))
	return w
}

// unqueued counts out a waiter just taken out of its queue. s.lead.mu
// held.
func (s *Service) unqueued(w *waiter) {
	s.lead.waiters--
	if n := s.lead.waitersBy[w.identity] - 1; n > 0 {
		s.lead.waitersBy[w.identity] = n
	} else {
		delete(s.lead.waitersBy, w.identity)
	}
	s.cfg.Metrics.Waiters.Set(float64(s.lead.waiters))
}

// await blocks until w's turn, its wait runs out, ctx ends or leadership
// is lost.
func (s *Service) await(ctx context.Context, p AcquireParams, w *waiter, deadline time.Time) error {
	waitUntil := p.Received.Add(p.Wait)
	if deadline.Before(waitUntil) {
		waitUntil = deadline
	}
	timer := time.NewTimer(waitUntil.Sub(s.cfg.Now()))
	defer timer.Stop()
	var cause error
	select {
	case <-w.turn:
		return w.refused
	case <-w.lost:
		return s.notLeader()
	case <-w.gone:
		return fmt.Errorf("%w: the wait for %q was withdrawn", ErrTimeout, p.Key)
	case <-timer.C:
		cause = fmt.Errorf("%w: key %q still held after waiting %v", ErrTimeout, p.Key, p.Wait)
	case <-ctx.Done():
		cause = fmt.Errorf("%w: request abandoned while waiting: %w", ErrTimeout, ctx.Err())
	case <-s.ctx.Done():
		cause = ErrShuttingDown
	}
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if w.handedOff {
		// Our turn came as we gave up: hand the key to the next waiter.
		s.unreserveKind(p.Key, w.limit, w.mode, w.epoch, w.identity)
		return cause
	}
	if q := s.lead.queues[p.Key]; q != nil {
		if w.elem != nil {
			q.remove(w)
			s.unqueued(w)
		}
		if q.len() == 0 {
			delete(s.lead.queues, p.Key)
		} else {
			// A waiter behind us may fit now (a reader behind a writer
			// that gave up).
			s.handOff(p.Key)
		}
	}
	return cause
}

// unreserve drops key's reservation if epoch made it, and hands the key
// on. s.lead.mu held.
func (s *Service) unreserve(key string, epoch uint64) {
	if r, ok := s.lead.reserved[key]; ok && r.epoch == epoch {
		s.dropReservation(key)
		s.handOff(key)
	}
}

// handOff hands key to the head of its queue while the head fits
// (kinds.go fits): the key is reserved for it and it is woken. Several
// heads in a row may fit beside each other (semaphore slots, shared
// holds); nobody is served before a head that does not. A head whose
// Grant a limit refuses (admitGrant), or that names another limit than the
// key's holders, is woken with that error and the next one gets its
// chance. s.lead.mu held.
func (s *Service) handOff(key string) {
	q := s.lead.queues[key]
	if q == nil {
		return
	}
	for w := q.front(); w != nil; w = q.front() {
		fits, mismatch := s.fits(key, w.limit, w.mode)
		if !fits && mismatch == 0 {
			break
		}
		q.pop()
		s.unqueued(w)
		if mismatch != 0 {
			w.refused = limitMismatch(key, mismatch, w.limit)
			w.turn <- struct{}{}
			continue
		}
		if err := s.admitGrant(w.identity); err != nil {
			w.refused = err
			w.turn <- struct{}{}
			continue
		}
		w.handedOff = true
		w.epoch = s.lead.epoch
		s.reserveKind(key, w.limit, w.mode, s.lead.epoch, w.identity)
		w.turn <- struct{}{}
		if !multiKind(w.limit, w.mode) {
			break
		}
	}
	if q.len() == 0 {
		delete(s.lead.queues, key)
	}
}
