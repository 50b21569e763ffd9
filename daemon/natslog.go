package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ticketd/ticketd/internal/loglimit"
)

// natsLogBurst is how many embedded-NATS warnings and errors get into the
// log per second: the server reports every failed login, which anyone who
// reaches the client port can cause.
const natsLogBurst = 10

// natsRetryLogEvery is how often a failed attempt to reach another
// server (a route, gateway or leaf node connection) gets into the log:
// the server retries every second for each of its connections (~4 lines
// a second per node while one node is down, and a few at every cluster
// start, before the other servers listen). It is a WARN: the cluster
// works on, and the node that is down has its own log.
const natsRetryLogEvery = 30 * time.Second

// natsLogger hands the embedded NATS server's warnings and errors to the
// node's logger, at most natsLogBurst a second (its notices and traces are
// noise for an operator), and keeps the last fatal error, so a server that
// could not start (a port in use, a bad certificate) says why instead of
// only timing out.
type natsLogger struct {
	log   *slog.Logger
	limit loglimit.Limiter
	// retries limits connection retries separately (natsRetryLogEvery),
	// so they neither flood the log nor use up limit.
	retries loglimit.Limiter

	mu        sync.Mutex
	lastFatal string
}

func (l *natsLogger) Noticef(string, ...any) {}
func (l *natsLogger) Debugf(string, ...any)  {}
func (l *natsLogger) Tracef(string, ...any)  {}

func (l *natsLogger) Warnf(format string, v ...any) {
	l.emit(slog.LevelWarn, format, v)
}

func (l *natsLogger) Errorf(format string, v ...any) {
	switch {
	case isNATSRetry(format):
		l.emitLimited(&l.retries, slog.LevelWarn, format, v)
	case isNATSServerLink(format):
		l.emit(slog.LevelWarn, format, v)
	default:
		l.emit(slog.LevelError, format, v)
	}
}

// isNATSServerLink tells an error on a connection to another server (a
// route, gateway or leaf node: nats-server prefixes its reports with
// "<addr> - rid:N", "gid:N", "lid:N"), such as the write that fails when a
// node stops: the server reconnects by itself, and raft's own peer lines
// say whether the cluster suffers.
func isNATSServerLink(format string) bool {
	for _, kind := range []string{" - rid:", " - gid:", " - lid"} {
		if strings.Contains(format, kind) {
			return true
		}
	}
	return false
}

// isNATSRetry tells nats-server's reports of a failed connection attempt
// to another server, which it retries by itself, by their format.
func isNATSRetry(format string) bool {
	for _, p := range []string{
		"Error trying to connect to route",              // route.go
		"Error trying to connect as leafnode to remote", // leafnode.go
		"Error connecting to %s gateway",                // gateway.go
	} {
		if strings.HasPrefix(format, p) {
			return true
		}
	}
	return false
}

func (l *natsLogger) emit(level slog.Level, format string, v []any) {
	l.emitLimited(&l.limit, level, format, v)
}

func (l *natsLogger) emitLimited(limit *loglimit.Limiter, level slog.Level, format string, v []any) {
	ok, suppressed := limit.Allow(time.Now())
	if !ok {
		return
	}
	msg := "embedded NATS: " + fmt.Sprintf(format, v...)
	if suppressed > 0 {
		l.log.Log(context.Background(), level, msg, "suppressed", suppressed)
		return
	}
	l.log.Log(context.Background(), level, msg)
}

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.mu.Lock()
	l.lastFatal = msg
	l.mu.Unlock()
	l.log.Error("embedded NATS: " + msg)
}

// fatal is the last fatal error the server reported ("" if none).
func (l *natsLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastFatal
}
