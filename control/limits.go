package control

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ticketd/ticketd/internal/connlimit"
)

// Bounds of the control API: what one source, or everybody together, can
// make a node hold. Tests shorten them through Config.
const (
	// FailureBurstDefault is how many failed attempts (a wrong control,
	// bootstrap or join credential) one source address may make in a row.
	FailureBurstDefault = 10
	// FailureRefillDefault is how often a source earns one more attempt
	// after that.
	FailureRefillDefault = time.Second
	// FailureDelayDefault is how long a request from a source that has
	// spent its attempts waits before its credential is looked at. It is
	// the slow-down, and it applies to everyone at that address, the
	// admin too; but nobody is refused for it, so a guesser at the
	// admin's address cannot lock the admin out (it did when a throttled
	// source was refused outright). The wait is evictable (see
	// limitListener), so opening more connections buys a guesser no more
	// checks: about MaxConnsPerSourceDefault per delay from one address.
	FailureDelayDefault = time.Second
	// maxTrackedSources bounds the addresses the failure limiter
	// remembers; when full, it forgets those that have earned back their
	// whole burst, then the oldest.
	maxTrackedSources = 4096
	// MaxConnsDefault bounds the control API's open connections, and
	// MaxConnsPerSourceDefault those from one source address, counted
	// from accept, before TLS. A new connection beyond either evicts the
	// oldest one that is not serving a request (in its TLS handshake,
	// sending its request, idle between requests, or waiting out
	// FailureDelay), of its source or of all, so idle connections, from
	// one address or many, never keep the admin out. A request is served
	// only once its body is in and, on an admin path, its credential
	// accepted (serving): a body that trickles in, or a wrong credential,
	// never makes a connection unevictable.
	MaxConnsDefault          = 64
	MaxConnsPerSourceDefault = 8
	// HandshakeTimeoutDefault bounds a new connection's TLS handshake,
	// and the reading of each request's headers.
	HandshakeTimeoutDefault = 3 * time.Second
	// HTTP server timeouts: a slow client cannot hold a connection.
	readTimeout    = 10 * time.Second
	writeTimeout   = TimeoutDefault + 5*time.Second
	idleTimeout    = 60 * time.Second
	maxHeaderBytes = 8 << 10
)

// failureLimiter is a token bucket per source address, spent by failed
// attempts only: an honest caller never meets it; a source that has
// spent it gets FailureDelay before each check and too_many_attempts for
// each failure. Called concurrently from the HTTP handlers.
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

// failed spends one of source's attempts; false means it had none left.
func (l *failureLimiter) failed(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.sources[source]
	if !ok {
		l.makeRoom(now)
		b = &bucket{tokens: l.burst, at: now}
		l.sources[source] = b
	}
	if l.level(b, now) < 1 {
		return false
	}
	b.tokens--
	return true
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

// sourceOf is the source a request came from (sourceKey of its address).
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return sourceKey(r.RemoteAddr)
	}
	return sourceKey(host)
}

// ipv6SourceBits is how much of an IPv6 address names one source.
const ipv6SourceBits = 64

// sourceKey is the source that failed attempts and connections are
// counted against for the address host: an IPv4 address, or the /64 of
// an IPv6 one. One IPv6 host is usually given a whole /64 and may pick
// any address in it for each connection; counted per address, a guesser
// would get a fresh budget for every attempt.
func sourceKey(host string) string {
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	mask := net.CIDRMask(ipv6SourceBits, 8*net.IPv6len)
	return (&net.IPNet{IP: ip.Mask(mask), Mask: mask}).String()
}

// limitListener admits each accepted connection to a connlimit.Table
// before anything is read from it (before TLS): at most
// MaxConnsPerSource from one address and MaxConns in all, a new one
// evicting the oldest that is not serving a request. The handlers tell
// it when a connection serves a request (serving: not evictable), the
// HTTP server, through trackState, when it is idle again.
type limitListener struct {
	net.Listener
	conns *connlimit.Table
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitConn{Conn: c, conns: l.conns}
		if lc.entry, _ = l.conns.Admit(sourceOfAddr(c.RemoteAddr()), false, func() { _ = c.Close() }); lc.entry == nil {
			_ = c.Close() // every connection of its source serves a request
			continue
		}
		return lc, nil
	}
}

// limitConn is an accepted connection and its entry in the table.
type limitConn struct {
	net.Conn
	conns *connlimit.Table
	entry *connlimit.Entry
}

func (c *limitConn) Close() error {
	c.conns.Done(c.entry)
	return c.Conn.Close()
}

// limitConnOf finds the limitConn under a connection the HTTP server
// holds (a *tls.Conn over it, or itself).
func limitConnOf(c net.Conn) *limitConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, _ := c.(*limitConn)
	return lc
}

// trackState is the HTTP server's ConnState hook: an idle connection is
// evictable again. A connection whose request has begun is not held here
// (serving holds it): its client decides how long the request's headers
// and body take, and a request that trickles in would otherwise keep its
// connection unevictable for the whole ReadTimeout.
func trackState(c net.Conn, st http.ConnState) {
	lc := limitConnOf(c)
	if lc == nil {
		return
	}
	switch st {
	case http.StateIdle:
		lc.conns.Release(lc.entry)
	case http.StateClosed, http.StateHijacked:
		lc.conns.Done(lc.entry)
	}
}

// serving marks r's connection as serving a request, so no new connection
// evicts it: called once r's body has been read and, on an admin path,
// its credential accepted, so what follows takes the node's time, not
// the client's.
func serving(r *http.Request) {
	if lc, _ := r.Context().Value(connCtxKey{}).(*limitConn); lc != nil {
		lc.conns.Hold(lc.entry)
	}
}

type connCtxKey struct{}

// withConn is the HTTP server's ConnContext hook: a request's context
// carries its connection, for pace and serving.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if lc := limitConnOf(c); lc != nil {
		return context.WithValue(ctx, connCtxKey{}, lc)
	}
	return ctx
}

// pace makes a request from a source that has spent its failed attempts
// wait FailureDelay before its credential is checked, its connection
// evictable meanwhile. It reports false if the request ended first (the
// client left, or the connection was evicted).
func (p *Plane) pace(r *http.Request) bool {
	if ok, _ := p.failures.allowed(sourceOf(r)); ok {
		return true
	}
	lc, _ := r.Context().Value(connCtxKey{}).(*limitConn)
	wait := time.NewTimer(p.failureDelay)
	defer wait.Stop()
	select {
	case <-wait.C:
		// An evicted connection is closed, but the request's context
		// only learns of it once the body has been read.
		return lc == nil || !lc.conns.Gone(lc.entry)
	case <-r.Context().Done():
		return false
	}
}

// sourceOfAddr is the source of a connection (sourceKey of its remote
// address).
func sourceOfAddr(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return sourceKey(tcp.IP.String())
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return sourceKey(a.String())
	}
	return sourceKey(host)
}

// orDefault is v, or def when v is not positive.
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}
