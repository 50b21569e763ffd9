package testkit

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
)

// QuietLogger discards every record.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Raft ticks of in-process test nodes: a 200 ms base election timeout,
// short enough for failover tests, long enough for a loaded 2-core box.
const (
	TickMS        = 20
	ElectionTicks = 10
)

// LogBuffer keeps everything a logger writes, for tests that check what
// was (or was not) logged. It is safe for concurrent use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// CaptureLogger returns a debug-level logger writing to a new LogBuffer.
func CaptureLogger() (*slog.Logger, *LogBuffer) {
	buf := &LogBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
