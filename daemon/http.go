package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ticketd/ticketd/internal/connlimit"
)

// Bounds of the metrics listener, which a scraper reaches over a network
// and so may anyone else: what it holds for them is bounded, and a scrape
// still gets through a crowd of idle connections (the oldest idle one is
// closed to make room, never one whose request is being answered).
const (
	// MaxMetricsConns bounds its open connections, MaxMetricsConnsPerSource
	// those from one address (a few scrapers and probes).
	MaxMetricsConns          = 64
	MaxMetricsConnsPerSource = 16
	// metricsIdleTimeout closes a keep-alive connection idle that long
	// (longer than a scrape interval, so a scraper keeps its connection).
	// There is no ReadTimeout: it would also cancel a request's context
	// once passed, cutting a 30 s CPU profile short, and a client that
	// sends its request slowly holds nothing the table does not bound.
	metricsIdleTimeout = 2 * time.Minute
)

// startHTTP serves /metrics, /healthz, /readyz (and /debug/pprof when
// enabled, never the command line) on the metrics listener.
func (d *Daemon) startHTTP() error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{}))
	if d.cfg.Pprof {
		// Loopback only (Config.Validate). No /debug/pprof/cmdline: the
		// command line may hold what must not leave the process (a
		// secret given by mistake), so it is answered 404 here rather
		// than by pprof.Index's lookup.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.Handle("/debug/pprof/cmdline", http.NotFoundHandler())
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.node.Err(); err != nil {
			http.Error(w, "raft loop stopped: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	ln, err := net.Listen("tcp", d.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("daemon: metrics listen: %w", err)
	}
	conns := connlimit.New(connlimit.Limits{Total: MaxMetricsConns, PerSource: MaxMetricsConnsPerSource})
	d.http = &http.Server{
		Handler:           servingHeld(mux),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       metricsIdleTimeout,
		ConnContext:       withMetricsConn,
		ConnState:         trackMetricsConn,
	}
	go func() { _ = d.http.Serve(&metricsListener{Listener: ln, conns: conns}) }()
	return nil
}

// metricsListener admits each accepted connection to a connlimit.Table;
// it is evictable except while a handler answers it (servingHeld).
type metricsListener struct {
	net.Listener
	conns *connlimit.Table
}

func (l *metricsListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		mc := &metricsConn{Conn: c, conns: l.conns}
		if mc.entry, _ = l.conns.Admit(metricsSource(c.RemoteAddr()), false, func() { _ = c.Close() }); mc.entry == nil {
			_ = c.Close() // every connection of its source is being answered
			continue
		}
		return mc, nil
	}
}

// metricsSource is the address a connection counts against: its IP (an
// IPv6 /64: one host may hold a whole one).
func metricsSource(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if v4 := tcp.IP.To4(); v4 != nil {
		return v4.String()
	}
	return tcp.IP.Mask(net.CIDRMask(64, 128)).String()
}

type metricsConn struct {
	net.Conn
	conns *connlimit.Table
	entry *connlimit.Entry
}

func (c *metricsConn) Close() error {
	c.conns.Done(c.entry)
	return c.Conn.Close()
}

type metricsConnKey struct{}

// withMetricsConn is the server's ConnContext hook: a request's context
// carries its connection, for servingHeld.
func withMetricsConn(ctx context.Context, c net.Conn) context.Context {
	if mc, ok := c.(*metricsConn); ok {
		return context.WithValue(ctx, metricsConnKey{}, mc)
	}
	return ctx
}

// trackMetricsConn is the server's ConnState hook: a closed connection
// leaves the table.
func trackMetricsConn(c net.Conn, st http.ConnState) {
	if mc, ok := c.(*metricsConn); ok && (st == http.StateClosed || st == http.StateHijacked) {
		mc.conns.Done(mc.entry)
	}
}

// servingHeld keeps a connection from eviction while h answers it (a
// scrape, a profile), not while its client sends the request or idles.
func servingHeld(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mc, ok := r.Context().Value(metricsConnKey{}).(*metricsConn); ok {
			mc.conns.Hold(mc.entry)
			defer mc.conns.Release(mc.entry)
		}
		h.ServeHTTP(w, r)
	})
}
