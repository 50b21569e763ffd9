package raftstore

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/ticketd/ticketd/core"
)

// The holder rows: the state machine's multi-holder keys (core/kinds.go,
// cluster version 5: semaphores and read/write keys held shared), one row
// per key holding all its holders and delayed slots (a key has at most
// core.MaxHoldersPerKey of them, so a row is bounded). Applying a run of
// commands rewrites the rows of the keys it touched, in the same batch as
// the applied index; the mutex and exclusive locks stay in the k/ rows
// and the delayed keys in the d/ rows, untouched by any of this.

// holderKey is the key of the holder row of a lock key.
func holderKey(key string) []byte {
	k := make([]byte, 0, len(prefixHolder)+len(key))
	return append(append(k, prefixHolder...), key...)
}

// stageHolders adds the holder rows of sc.PutHolders and the deletions of
// sc.DeleteHolders to b, checking each row the way LoadMachine will read
// it (and no token above the last), so that no row it would refuse is
// written. A key may not repeat.
func stageHolders(b *pebble.Batch, sc *StateChange) error {
	seen := make(map[string]struct{}, len(sc.PutHolders)+len(sc.DeleteHolders))
	for _, kh := range sc.PutHolders {
		if _, dup := seen[kh.Key]; dup {
			return fmt.Errorf("%w: multi-holder key %q twice in PutHolders", ErrInvariant, kh.Key)
		}
		seen[kh.Key] = struct{}{}
		rec := core.EncodeHolderRecord(kh)
		if _, err := core.DecodeHolderRecord(rec); err != nil {
			return fmt.Errorf("%w: multi-holder key %q: %w", ErrInvariant, kh.Key, err)
		}
		if n := len(kh.Holders); n > 0 && kh.Holders[n-1].Token > sc.LastToken {
			return fmt.Errorf("%w: holder of %q has token %d above last token %d", ErrInvariant, kh.Key, kh.Holders[n-1].Token, sc.LastToken)
		}
		if err := b.Set(holderKey(kh.Key), rec, nil); err != nil {
			return err
		}
	}
	for _, k := range sc.DeleteHolders {
		if err := core.ValidateKey(k); err != nil {
			return fmt.Errorf("%w: delete holders of %q: %w", ErrInvariant, k, err)
		}
		if _, dup := seen[k]; dup {
			return fmt.Errorf("%w: multi-holder key %q twice, or in both PutHolders and DeleteHolders", ErrInvariant, k)
		}
		seen[k] = struct{}{}
		if err := b.Delete(holderKey(k), nil); err != nil {
			return err
		}
	}
	return nil
}

// stageSnapshotHolders replaces every holder row with those of ks (a
// snapshot being installed).
func stageSnapshotHolders(b *pebble.Batch, ks []core.KeyHolders) error {
	if err := b.DeleteRange(prefixHolder, endHolder, nil); err != nil {
		return err
	}
	for _, kh := range ks {
		if err := b.Set(holderKey(kh.Key), core.EncodeHolderRecord(kh), nil); err != nil {
			return err
		}
	}
	return nil
}

// forEachHolderRow calls f with every holder row of r in key order,
// checking each decodes and is under its own key.
func forEachHolderRow(r reader, f func(core.KeyHolders) error) error {
	return scanRows(r, prefixHolder, endHolder, func(k, v []byte) error {
		kh, err := core.DecodeHolderRecord(v)
		if err != nil {
			return fmt.Errorf("%w: holder row %q: %w", ErrCorrupt, k, err)
		}
		if !bytes.Equal(k[len(prefixHolder):], []byte(kh.Key)) {
			return fmt.Errorf("%w: holder row %q holds key %q", ErrCorrupt, k, kh.Key)
		}
		return f(kh)
	})
}

// loadHolders reads the holder rows back into m (after its locks, control
// state, request records and sessions), which checks them against the
// rest of the state (tokens, requests, sessions, delays, nothing before
// cluster version 5).
func loadHolders(r reader, m *core.Machine) error {
	var ks []core.KeyHolders
	if err := forEachHolderRow(r, func(kh core.KeyHolders) error {
		ks = append(ks, kh)
		return nil
	}); err != nil {
		return err
	}
	if err := m.LoadHolders(ks); err != nil {
		return fmt.Errorf("%w: holders: %w", ErrCorrupt, err)
	}
	return nil
}

// encodeHolders adds the holder rows of r to a snapshot being encoded.
// stop is checked as the lock rows' walk checks it.
func encodeHolders(r reader, enc *core.SnapshotEncoder, stop <-chan struct{}) error {
	rows := 0
	return forEachHolderRow(r, func(kh core.KeyHolders) error {
		if rows++; rows%snapshotCheckStopEvery == 0 {
			select {
			case <-stop:
				return errSnapshotStopped
			default:
			}
		}
		return enc.AddKeyHolders(kh)
	})
}

// touchedMulti are the multi-holder keys a run of commands touched, in
// first-touch order.
type touchedMulti struct {
	keys []string
	seen map[string]struct{}
}

func (t *touchedMulti) add(key string) {
	if _, ok := t.seen[key]; ok {
		return
	}
	if t.seen == nil {
		t.seen = make(map[string]struct{})
	}
	t.seen[key] = struct{}{}
	t.keys = append(t.keys, key)
}

// holderChange adds the net change of the touched multi-holder keys to sc:
// the row of each that is one now, the deletion of each that is not.
func holderChange(m *core.Machine, t *touchedMulti, sc *StateChange) {
	for _, key := range t.keys {
		if kh, ok := m.KeyHolders(key); ok {
			sc.PutHolders = append(sc.PutHolders, kh)
		} else {
			sc.DeleteHolders = append(sc.DeleteHolders, key)
		}
	}
}
