package server

import "container/list"

// waiter is one acquire waiting for its key.
type waiter struct {
	// turn receives once when the waiter may propose its Grant; the
	// server has marked the key pending on its behalf.
	turn chan struct{}
	// lost is closed when leadership is lost while the waiter is queued.
	lost     chan struct{}
	signaled bool
	epoch    uint64 // the leadership epoch that reserved the key for it
	elem     *list.Element
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
