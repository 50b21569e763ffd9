package testkit

import (
	"io"
	"log/slog"
)

// QuietLogger discards every record.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Raft ticks of in-process test nodes: a 200 ms base election timeout,
// short enough for failover tests, long enough for a loaded 2-core box.
const (
	TickMS        = 20
	ElectionTicks = 10
)
