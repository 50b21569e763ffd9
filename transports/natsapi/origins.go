package natsapi

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Where the leader's requests come from.
//
// The leader keeps a small uniform sample (reservoir sampling) of the
// reply subjects of the lock requests it serves, and a count of them,
// until the daemon takes them (TakeOrigins). A reply subject is the
// requester's inbox, whose subscription lives on the NATS server the
// requester is connected to: the daemon looks the sample up in its
// embedded server's route subscriptions to learn which server each
// request crossed a route from (leader placement, daemon/placement.go).
// Nothing here decides anything or holds more than OriginSamples strings.

// OriginSamples is how many reply subjects the sample holds at most.
const OriginSamples = 64

// originSampler is the sample and count since the last take. The count
// is atomic and the lock is taken only for a request that goes into the
// sample, so the leader's requests do not queue on it.
type originSampler struct {
	count   atomic.Uint64
	mu      sync.Mutex
	samples []string
}

// note counts one request and keeps its reply subject with the
// reservoir's probability (approximately, when requests race a take).
func (o *originSampler) note(reply string) {
	n := o.count.Add(1)
	if n > OriginSamples && rand.Uint64N(n) >= OriginSamples {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.samples) < OriginSamples {
		o.samples = append(o.samples, reply)
		return
	}
	o.samples[rand.IntN(OriginSamples)] = reply
}

// take returns the count and sample and starts both over.
func (o *originSampler) take() (uint64, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.samples
	o.samples = nil
	return o.count.Swap(0), s
}

// TakeOrigins returns how many lock requests this node served as leader
// since the last call, and a uniform sample of at most OriginSamples of
// their reply subjects; both start over.
func (s *Service) TakeOrigins() (requests uint64, replies []string) {
	return s.origins.take()
}
