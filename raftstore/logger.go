package raftstore

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

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
// recovery, format upgrades) at Debug, its errors at Error. Pebble expects
// Fatalf not to return; it panics (after logging) instead of exiting the
// process.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) { p.l.Debug(fmt.Sprintf(format, args...)) }

func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Error(fmt.Sprintf(format, args...)) }

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg, "fatal", true)
	panic("raftstore: pebble: " + msg)
}
