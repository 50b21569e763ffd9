package natsapi

import (
	"context"
	"sync"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// Fair shares at the edge (issue 21; lockservice fair.go has the rules).
//
// Every request is admitted twice before it runs: against its identity's
// share of the requests in progress (lockservice BeginRequest:
// resource_exhausted beyond it; a release too, as each costs the leader a
// raft entry, but not a follower's release of a grant it could not
// deliver, which is the cluster's own), and against the node's
// budget (Config.MaxInflight, acquires and the rest apart: unavailable,
// "node overloaded", beyond it). An acquire that starts waiting in its
// key's queue is parked: it gives both back at once (lockservice's
// AcquireParams.Parked), so waits, which the waiter limits bound, never
// use up what try requests, releases, renewals and reads need.
//
// A parked wait ends when its key comes free, its wait runs out, or its
// requester is gone: every ParkSweepDefault the sweep asks
// Config.ReplyInterest whether anyone still listens on each parked wait's
// reply subject and ends the waits nobody listens for (their goroutine and
// queue place go at once; the reply goes nowhere). Without a ReplyInterest
// (an external NATS server, whose interest this node cannot see) a wait
// of a vanished requester lasts until its wait_ms; its grant, if it comes,
// is still released at once when NATS answers "no responders"
// (delivery.go), and the Go SDK withdraws the waits it abandons.

// ReplyInterest reports, for each reply subject, whether its requester may
// still be listening: false only when it certainly is not. It is called
// from one goroutine at a time, with at most MaxParkSweep subjects.
type ReplyInterest func(replies []string) []bool

// Sweep of parked waits.
const (
	// ParkSweepDefault is how often parked waits are checked for
	// requesters that left.
	ParkSweepDefault = time.Second
	// MaxParkSweep bounds the waits one sweep checks (the node's waiter
	// limit bounds them anyway; beyond it, the next sweeps take others).
	MaxParkSweep = 10000
)

// parkedWaits are the acquires waiting in a key's queue on this node.
type parkedWaits struct {
	mu   sync.Mutex // guards next and by
	next uint64
	by   map[uint64]parkedWait
}

type parkedWait struct {
	reply string
	end   context.CancelFunc // ends the wait (its acquire's context)
}

// add records a parked wait; remove forgets it.
func (p *parkedWaits) add(reply string, end context.CancelFunc) (remove func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = make(map[uint64]parkedWait)
	}
	p.next++
	id := p.next
	p.by[id] = parkedWait{reply: reply, end: end}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.by, id)
	}
}

// len is the number of parked waits.
func (p *parkedWaits) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.by)
}

// sweep ends the parked waits whose requester interest says is gone, at
// most MaxParkSweep checked, and returns how many it ended.
func (p *parkedWaits) sweep(interest ReplyInterest) int {
	p.mu.Lock()
	waits := make([]parkedWait, 0, min(len(p.by), MaxParkSweep))
	replies := make([]string, 0, cap(waits))
	for _, w := range p.by {
		if len(waits) == MaxParkSweep {
			break
		}
		waits = append(waits, w)
		replies = append(replies, w.reply)
	}
	p.mu.Unlock()
	if len(waits) == 0 {
		return 0
	}
	alive := interest(replies)
	ended := 0
	for i, w := range waits {
		if i < len(alive) && !alive[i] {
			w.end()
			ended++
		}
	}
	return ended
}

// runParkSweep sweeps the parked waits until the service stops.
func (s *Service) runParkSweep(interest ReplyInterest, every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if n := s.parked.sweep(interest); n > 0 {
			s.log.Debug("ended waits whose requesters left", "waits", n)
		}
	}
}

// admit takes req's place in its identity's share and in the node's
// budget, or answers it with the refusal. req.leaveAdmission gives both
// back; it is safe to call more than once (an acquire leaves when it
// parks, and again when it ends). The places are kept on req rather than
// in a closure and a sync.Once (issue 26 item 4: per-request allocations).
func (s *Service) admit(req *request) (ok bool) {
	var identityDone func()
	if !req.nodeAuthority {
		done, err := s.cfg.Locks.BeginRequest(req.identity)
		if err != nil {
			_ = req.fail(toProtocolError(err))
			return false
		}
		identityDone = done
	}
	sem := s.sem
	if req.op == "acquire" {
		sem = s.acqSem
	}
	select {
	case sem <- struct{}{}:
	default:
		if identityDone != nil {
			identityDone()
		}
		_ = req.fail(protocol.Errorf(protocol.CodeUnavailable, "node overloaded: %d %s requests in flight", cap(sem), req.op))
		return false
	}
	req.admitSem, req.identityDone = sem, identityDone
	return true
}

// leaveAdmission gives back the places admit took for req, once however
// often it is called; nothing when admit did not admit req.
func (req *request) leaveAdmission() {
	if req.admitSem == nil || req.left.Swap(true) {
		return
	}
	<-req.admitSem
	if req.identityDone != nil {
		req.identityDone()
	}
}
