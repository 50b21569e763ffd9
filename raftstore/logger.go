package raftstore

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ticketd/ticketd/internal/loglimit"
	"go.etcd.io/raft/v3"
)

// raftLogger adapts slog to raft.Logger. Raft narrates its own workings
// (pre-votes, vote counts, configuration switches) at Info and Warning;
// an operator needs none of that, so everything below Error goes to Debug.
// The node loop logs the events an operator does need (leader elected or
// lost, membership changed, snapshot taken or restored) at Info itself,
// one line each (ready.go). The one raft warning kept is the missed tick:
// it says the node loop blocked, which nothing else reports.
type raftLogger struct{ l *slog.Logger }

var _ raft.Logger = raftLogger{}

func (r raftLogger) Debug(v ...any)                 { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Info(v ...any)                  { r.l.Debug(fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any)  { r.l.Debug(fmt.Sprintf(format, v...)) }
func (r raftLogger) Warning(v ...any)               { r.warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.warn(fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any)                 { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) { r.l.Error(fmt.Sprintf(format, v...)) }
func (r raftLogger) Fatal(v ...any) {
	r.l.Error(fmt.Sprint(v...))
	os.Exit(1)
}
func (r raftLogger) Fatalf(format string, v ...any) {
	r.l.Error(fmt.Sprintf(format, v...))
	os.Exit(1)
}
func (r raftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (r raftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }

func (r raftLogger) warn(msg string) {
	if strings.Contains(msg, "tick missed") {
		r.l.Warn(msg)
		return
	}
	r.l.Debug(msg)
}

// pebbleLogger routes Pebble's logs to slog: its Info chatter (WAL
// recovery, format upgrades) at Debug, its errors at Error.
//
// Errors are rate limited: Pebble retries a failing background flush or
// compaction and logs every attempt (on a full disk, hundreds of lines a
// second); past pebbleErrorBurst lines in a second the rest are counted
// and summed up in the next line that gets through.
//
// Fatalf is a storage failure Pebble cannot go on from (a failed WAL or
// MANIFEST write or sync). It logs one clear line, calls onFatal (the
// daemon exits the process there), and otherwise panics with a
// *StorageFailure, which the node loop recovers into a fail-stop when it
// happens in its own write. Pebble expects Fatalf not to return.
type pebbleLogger struct {
	l       *slog.Logger
	limit   *loglimit.Limiter
	onFatal func(error)
}

func newPebbleLogger(l *slog.Logger, onFatal func(error)) pebbleLogger {
	return pebbleLogger{l: l, limit: &loglimit.Limiter{Burst: pebbleErrorBurst}, onFatal: onFatal}
}

func (p pebbleLogger) Infof(format string, args ...any) { p.l.Debug(fmt.Sprintf(format, args...)) }

func (p pebbleLogger) Errorf(format string, args ...any) {
	if ok, suppressed := p.limit.Allow(time.Now()); ok {
		if suppressed > 0 {
			p.l.Error(fmt.Sprintf(format, args...), "suppressed_before", suppressed)
			return
		}
		p.l.Error(fmt.Sprintf(format, args...))
	}
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	err := &StorageFailure{Msg: fmt.Sprintf(format, args...)}
	p.l.Error("storage failure: stopping the node (fail-stop)", "err", err.Msg)
	if p.onFatal != nil {
		p.onFatal(err)
	}
	panic(err)
}

// StorageFailure is a storage error the store cannot go on from.
type StorageFailure struct{ Msg string }

func (e *StorageFailure) Error() string { return "raftstore: storage failure: " + e.Msg }

// pebbleErrorBurst is how many Pebble error lines get through per second.
const pebbleErrorBurst = 5
