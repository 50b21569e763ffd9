package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DuplicateWindowDefault is how long the audit stream remembers
// Nats-Msg-Id values: every node publishes each event, the stream keeps one.
const DuplicateWindowDefault = 2 * time.Minute

// MaxBytesDefault bounds the audit stream when the caller does not.
const MaxBytesDefault = 1 << 30

// EnsureStream creates or updates the JetStream stream name that captures
// the audit events published on plain NATS (SubjectPrefix.>), on file
// storage, de-duplicated within DuplicateWindowDefault, and holding at
// most maxBytes (MaxBytesDefault if <= 0): past it the oldest events are
// dropped (DiscardOld), so audit history is a bounded window and can never
// fill the disk the raft store shares. ctx bounds the exchange with the
// JetStream API.
func EnsureStream(ctx context.Context, nc *nats.Conn, name string, maxBytes int64) error {
	if maxBytes <= 0 {
		maxBytes = MaxBytesDefault
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("audit: jetstream: %w", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{SubjectPrefix + ".>"},
		Duplicates: DuplicateWindowDefault,
		Storage:    jetstream.FileStorage,
		MaxBytes:   maxBytes,
		Discard:    jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("audit: stream %s: %w", name, err)
	}
	return nil
}
