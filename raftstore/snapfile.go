package raftstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Snapshot files.
//
// The data of the latest snapshot (core snapshot bytes, self-checking with
// their CRC) lives in a file of its own, snap/<term>-<index>.snap under
// the store directory, and Pebble holds only its metadata (r/snapmeta).
// A snapshot of a large table is hundreds of megabytes; written into
// Pebble it would pass through the WAL, where every small commit of the
// raft loop queues behind it (heartbeats stall), and a received one would
// sit in the same batch as the lock rows. As etcd does with its .snap
// files, the data is written to a temporary file, synced, renamed into
// place and the directory synced, and only then is the metadata naming it
// committed. A crash leaves at worst an orphan file, removed at the next
// Open or snapshot. Stores written before this format (storeFormatVersion
// 1) keep the data in the r/snapdata row; they are read as they are and
// move to a file with their next snapshot.

const (
	snapDirName = "snap"
	snapSuffix  = ".snap"
	tmpSuffix   = ".tmp"
)

// snapFiles manages the snapshot files of one store.
type snapFiles struct {
	fs  vfs.FS
	dir string
}

func (f snapFiles) name(term, index uint64) string {
	return f.fs.PathJoin(f.dir, fmt.Sprintf("%016x-%016x%s", term, index, snapSuffix))
}

// init creates the directory and removes leftover temporary files.
func (f snapFiles) init() error {
	if err := f.fs.MkdirAll(f.dir, 0o750); err != nil {
		return fmt.Errorf("raftstore: snapshot directory: %w", err)
	}
	names, err := f.fs.List(f.dir)
	if err != nil {
		return fmt.Errorf("raftstore: list snapshot directory: %w", err)
	}
	for _, n := range names {
		if strings.HasSuffix(n, tmpSuffix) {
			if err := f.fs.Remove(f.fs.PathJoin(f.dir, n)); err != nil {
				return fmt.Errorf("raftstore: remove %s: %w", n, err)
			}
		}
	}
	return nil
}

// write durably stores data as the snapshot file for (term, index): temp
// file, sync, rename, sync of the directory. It returns once the file is
// durable under its final name.
func (f snapFiles) write(term, index uint64, data []byte) error {
	return f.writeWith(term, index, writeBytes(data))
}

// writeBytes is a fill for writeWith that writes data.
func writeBytes(data []byte) func(w io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// writeWith is write for data that fill writes to the file as it makes it
// (a snapshot encoded as it is read from the store); if fill fails, the
// file is removed and its error returned, wrapped.
func (f snapFiles) writeWith(term, index uint64, fill func(w io.Writer) error) (err error) {
	final := f.name(term, index)
	tmp := final + tmpSuffix
	file, err := f.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("raftstore: create snapshot file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.fs.Remove(tmp)
		}
	}()
	if err := fill(file); err != nil {
		_ = file.Close()
		return fmt.Errorf("raftstore: write snapshot file: %w", err)
	}
	if err := file.Sync(); err != nil {
		_ = file.Close()
		return fmt.Errorf("raftstore: sync snapshot file: %w", err)
	}
	if err := file.Close(); err != nil {
		return fmt.Errorf("raftstore: close snapshot file: %w", err)
	}
	if err := f.fs.Rename(tmp, final); err != nil {
		return fmt.Errorf("raftstore: rename snapshot file: %w", err)
	}
	return f.syncDir()
}

func (f snapFiles) syncDir() error {
	d, err := f.fs.OpenDir(f.dir)
	if err != nil {
		return fmt.Errorf("raftstore: open snapshot directory: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftstore: sync snapshot directory: %w", err)
	}
	return nil
}

// open opens the snapshot file for (term, index). On Linux an open file
// stays readable after a newer snapshot removed its name.
func (f snapFiles) open(term, index uint64) (vfs.File, error) {
	file, err := f.fs.Open(f.name(term, index))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: snapshot %d has no file %s", ErrCorrupt, index, f.name(term, index))
		}
		return nil, fmt.Errorf("raftstore: open snapshot file: %w", err)
	}
	return file, nil
}

// exists reports whether the file for (term, index) is there.
func (f snapFiles) exists(term, index uint64) bool {
	_, err := f.fs.Stat(f.name(term, index))
	return err == nil
}

// readAll reads an open snapshot file and closes it.
func readAll(file vfs.File) ([]byte, error) {
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, fmt.Errorf("raftstore: stat snapshot file: %w", err)
	}
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(file, data); err != nil {
		return nil, fmt.Errorf("raftstore: read snapshot file: %w", err)
	}
	return data, nil
}

// removeExcept removes every snapshot file but the one for (term, index)
// (and temporary files being written, which belong to a writer in flight).
func (f snapFiles) removeExcept(term, index uint64) error {
	keep := f.fs.PathBase(f.name(term, index))
	names, err := f.fs.List(f.dir)
	if err != nil {
		return fmt.Errorf("raftstore: list snapshot directory: %w", err)
	}
	for _, n := range names {
		if n != keep && strings.HasSuffix(n, snapSuffix) {
			if err := f.fs.Remove(f.fs.PathJoin(f.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("raftstore: remove old snapshot %s: %w", n, err)
			}
		}
	}
	return nil
}
