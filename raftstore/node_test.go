package raftstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
)

// logBuffer is a concurrency-safe log sink for tests that check log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSingle starts a single-voter node (id 1) on store st with fast
// ticks, and waits until it leads and has applied its first entry.
func startSingle(t testing.TB, st *Store, cfg Config) *Node {
	t.Helper()
	cfg.ID = 1
	cfg.Peers = []uint64{1}
	cfg.Store = st
	if cfg.Logger == nil {
		cfg.Logger = testkit.QuietLogger()
	}
	cfg.TickInterval = 5 * time.Millisecond
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatalf("NewNode: %v", err)
	}
	t.Cleanup(n.Stop)
	n.Start()
	testkit.Eventually(t, 10*time.Second, "single node leads", func() bool {
		select {
		case <-n.Done():
			return true
		default:
		}
		return n.LeaderReady()
	})
	return n
}

// TestUndecodableEntryStopsNode: a committed entry of a version this
// binary does not know must stop the node at that index (never be
// skipped), with the index and version in the error and in one log line,
// and the node must stop at the same entry again after a restart.
func TestUndecodableEntryStopsNode(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	var logs logBuffer
	n := startSingle(t, st, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.Propose(ctx, core.Grant("before", "", 1000, 0)); err != nil {
		t.Fatalf("propose: %v", err)
	}
	// An entry of version 9, as a newer binary would write it.
	bad := []byte{9, 1, byte(core.KindGrant), 1, 'k'}
	if err := n.raft.Propose(ctx, bad); err != nil {
		t.Fatalf("raw propose: %v", err)
	}
	select {
	case <-n.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("node did not stop on an undecodable committed entry")
	}
	var ue *UndecodableEntryError
	if err := n.Err(); !errors.As(err, &ue) || ue.Version != 9 || !errors.Is(err, core.ErrUnknownVersion) {
		t.Fatalf("Err() = %v, want an UndecodableEntryError of version 9 wrapping unknown_version", err)
	}
	badIndex := ue.Index
	if applied := n.AppliedIndex(); applied >= badIndex {
		t.Fatalf("applied index %d reached the undecodable entry %d", applied, badIndex)
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "fail-stop") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "committed entry "+strconv.FormatUint(badIndex, 10)) || !strings.Contains(lines[0], "entry version 9") {
		t.Fatalf("want one fail-stop log line naming entry %d and version 9, got %q", badIndex, lines)
	}
	n.Stop()

	// The entry is committed: a restart on the same binary stops there again.
	st = reopen(t, st, dir)
	n2, err := NewNode(Config{ID: 1, Peers: []uint64{1}, Store: st, Logger: testkit.QuietLogger(), TickInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewNode after restart: %v", err)
	}
	t.Cleanup(n2.Stop)
	n2.Start()
	select {
	case <-n2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("restarted node did not stop on the undecodable entry")
	}
	if err := n2.Err(); !errors.As(err, &ue) || ue.Index != badIndex {
		t.Fatalf("after restart Err() = %v, want the same entry %d", err, badIndex)
	}
	var held bool
	n2.View(func(m *core.Machine) { _, held = m.Get("before") })
	if !held {
		t.Fatal("the entry before the undecodable one is not applied")
	}
}
