package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ticketd/ticketd/internal/loglimit"
)

// natsLogBurst is how many embedded-NATS warnings and errors get into the
// log per second: the server reports every failed login, which anyone who
// reaches the client port can cause.
const natsLogBurst = 10

// natsLogger hands the embedded NATS server's warnings and errors to the
// node's logger, at most natsLogBurst a second (its notices and traces are
// noise for an operator), and keeps the last fatal error, so a server that
// could not start (a port in use, a bad certificate) says why instead of
// only timing out.
type natsLogger struct {
	log   *slog.Logger
	limit loglimit.Limiter

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
	l.emit(slog.LevelError, format, v)
}

func (l *natsLogger) emit(level slog.Level, format string, v []any) {
	ok, suppressed := l.limit.Allow(time.Now())
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
