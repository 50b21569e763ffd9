package natsapi

import (
	"context"
	"time"
)

// workerIdle is how long a request goroutine waits for the next request
// before it exits.
const workerIdle = time.Second

// workers run each request on its own goroutine, as `go f()` would, but
// reuse goroutines that finished one: a fresh goroutine starts with a
// small stack and grows it (runtime.newstack/copystack were ~4% of the
// leader's CPU under load), a reused one already has it. Nothing waits in
// a queue: a request that finds no idle goroutine gets a new one at once,
// so a waiting acquire never holds up another request (the in-flight
// bound stays dispatch's semaphores).
type workers struct {
	ctx  context.Context
	work chan func() // unbuffered: a send succeeds only to an idle worker
}

func newWorkers(ctx context.Context) *workers {
	return &workers{ctx: ctx, work: make(chan func())}
}

// spawn runs f on an idle worker, or on a new one.
func (w *workers) spawn(f func()) {
	select {
	case w.work <- f:
	default:
		go w.run(f)
	}
}

// run runs f, then whatever work it is handed while it is idle for less
// than workerIdle, and exits when idle longer or the service stops.
func (w *workers) run(f func()) {
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		f()
		t.Reset(workerIdle)
		select {
		case f = <-w.work:
		case <-t.C:
			return
		case <-w.ctx.Done():
			return
		}
	}
}
