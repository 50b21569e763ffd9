package daemon

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	d.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.http.Serve(ln) }()
	return nil
}
