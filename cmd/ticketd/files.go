package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// writeFileAtomic writes b to path, readable by its owner only (mode
// 0600: backups hold lock owners and credential hashes, credential files
// a secret), through a synced temporary file moved into place, and syncs
// the directory, so a crash leaves the old file or the new one. Without
// overwrite an existing path is refused, also one created meanwhile (the
// move is a hard link, which never replaces a file).
func writeFileAtomic(path string, b []byte, overwrite bool) error {
	tmp := path + ".part"
	// A stale .part may have another mode; O_EXCL after removing it
	// creates the file with 0600 (less the umask).
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp) // after a failure; gone after a rename
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if overwrite {
		err = os.Rename(tmp, path)
	} else if err = os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s exists: name a new file, or --force to replace it", path)
	}
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", tmp, path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
