package control

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of the control API: what one source, or everybody together, can
// make a node hold. Tests shorten them through Config.
const (
	// FailureBurstDefault is how many failed attempts (a wrong control,
	// bootstrap or join credential) one source address may make in a row.
	FailureBurstDefault = 10
	// FailureRefillDefault is how often a source earns one more attempt
	// after that: guessing a 16-byte credential at one try a second is
	// hopeless.
	FailureRefillDefault = time.Second
	// maxTrackedSources bounds the addresses the failure limiter
	// remembers; when full, it forgets those that have earned back their
	// whole burst, then the oldest.
	maxTrackedSources = 4096
	// MaxConnsDefault bounds the control API's open connections.
	MaxConnsDefault = 64
	// HTTP server timeouts: a slow client cannot hold a connection.
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = TimeoutDefault + 5*time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 8 << 10
)

// failureLimiter is a token bucket per source address, spent by failed
// attempts only: an honest caller never meets it, a guesser is slowed to
// one try per refill. Called concurrently from the HTTP handlers.
type failureLimiter struct {
	burst  float64
	refill time.Duration
	now    func() time.Time

	mu      sync.Mutex // guards sources
	sources map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

func newFailureLimiter(burst int, refill time.Duration, now func() time.Time) *failureLimiter {
	if burst <= 0 {
		burst = FailureBurstDefault
	}
	if refill <= 0 {
		refill = FailureRefillDefault
	}
	if now == nil {
		now = time.Now
	}
	return &failureLimiter{burst: float64(burst), refill: refill, now: now, sources: make(map[string]*bucket)}
}

// level brings b up to now and returns its tokens. mu held.
func (l *failureLimiter) level(b *bucket, now time.Time) float64 {
	b.tokens = min(l.burst, b.tokens+float64(now.Sub(b.at))/float64(l.refill))
	b.at = now
	return b.tokens
}

// allowed reports whether source may make an attempt, and if not how long
// until it may.
func (l *failureLimiter) allowed(source string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.sources[source]
	if !ok {
		return true, 0
	}
	if t := l.level(b, l.now()); t < 1 {
		return false, time.Duration((1 - t) * float64(l.refill))
	}
	return true, 0
}

// failed spends one of source's attempts.
func (l *failureLimiter) failed(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.sources[source]
	if !ok {
		l.makeRoom(now)
		b = &bucket{tokens: l.burst, at: now}
		l.sources[source] = b
	}
	l.level(b, now)
	b.tokens = max(0, b.tokens-1)
}

// makeRoom keeps the map under maxTrackedSources. mu held.
func (l *failureLimiter) makeRoom(now time.Time) {
	if len(l.sources) < maxTrackedSources {
		return
	}
	var oldest string
	var at time.Time
	for s, b := range l.sources {
		if l.level(b, now) >= l.burst {
			delete(l.sources, s)
			continue
		}
		if oldest == "" || b.at.Before(at) {
			oldest, at = s, b.at
		}
	}
	if len(l.sources) >= maxTrackedSources {
		delete(l.sources, oldest)
	}
}

// sourceOf is the address a request came from, without its port.
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limitListener closes connections beyond max at once, rather than
// queueing them, so the connections in service are never stuck behind a
// flood.
type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
