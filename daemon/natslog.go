package daemon

import (
	"fmt"
	"log/slog"
	"sync"
)

// natsLogger hands the embedded NATS server's warnings and errors to the
// node's logger (its notices and traces are noise for an operator) and
// keeps the last fatal error, so a server that could not start (a port in
// use, a bad certificate) says why instead of only timing out.
type natsLogger struct {
	log *slog.Logger

	mu        sync.Mutex
	lastFatal string
}

func (l *natsLogger) Noticef(string, ...any) {}
func (l *natsLogger) Debugf(string, ...any)  {}
func (l *natsLogger) Tracef(string, ...any)  {}

func (l *natsLogger) Warnf(format string, v ...any) {
	l.log.Warn("embedded NATS: " + fmt.Sprintf(format, v...))
}

func (l *natsLogger) Errorf(format string, v ...any) {
	l.log.Error("embedded NATS: " + fmt.Sprintf(format, v...))
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
