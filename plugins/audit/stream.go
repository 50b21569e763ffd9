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

// EnsureStream creates or updates the JetStream stream name that captures
// the audit events published on plain NATS (SubjectPrefix.>), on file
// storage, de-duplicated within DuplicateWindowDefault. ctx bounds the
// exchange with the JetStream API.
func EnsureStream(ctx context.Context, nc *nats.Conn, name string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("audit: jetstream: %w", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{SubjectPrefix + ".>"},
		Duplicates: DuplicateWindowDefault,
		Storage:    jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("audit: stream %s: %w", name, err)
	}
	return nil
}
