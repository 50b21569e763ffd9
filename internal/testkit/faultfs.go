package testkit

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// FaultFS is the operating system's filesystem with storage faults a test
// turns on and off, built on Pebble's vfs/errorfs, for stores opened with
// it (raftstore.StoreOptions.FS, daemon.Options.FS):
//
//   - SetFailSync: every sync of a Pebble log file fails (EIO), as a disk
//     whose fsync reports an error;
//   - SetFull: the disk is full: writes fail with ENOSPC and free space is
//     0, until the store removes its ballast file (a file named BALLAST),
//     which gives back ballastFreed bytes;
//   - SetFree: the free space GetDiskUsage reports (-1: the real one).
type FaultFS struct {
	*errorfs.FS
	failSync atomic.Bool
	full     atomic.Bool
	free     atomic.Int64
	released atomic.Bool // a ballast was removed while full
	enospc   atomic.Int64
	syncs    atomic.Int64
}

// ballastFreed is the free space a full FaultFS reports once the ballast
// is gone.
const ballastFreed = 1 << 20

// NewFaultFS returns a FaultFS with every fault off.
func NewFaultFS() *FaultFS {
	f := &FaultFS{}
	f.free.Store(-1)
	f.FS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(f.inject))
	return f
}

func (f *FaultFS) inject(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		if f.failSync.Load() && strings.HasSuffix(op.Path, ".log") {
			f.syncs.Add(1)
			return fmt.Errorf("sync %s: %w (injected)", op.Path, syscall.EIO)
		}
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt:
		if f.full.Load() && !isBallast(op.Path) && f.ballastLeft() {
			f.enospc.Add(1)
			return fmt.Errorf("write %s: %w (injected)", op.Path, syscall.ENOSPC)
		}
	}
	return nil
}

func isBallast(path string) bool { return strings.HasSuffix(path, "/BALLAST") }

// ballastLeft reports whether some store on this FS still holds its
// ballast (the full disk has no room until one is released). With no
// ballast ever made, the disk stays full.
func (f *FaultFS) ballastLeft() bool { return !f.released.Load() }

// SetFailSync turns failing log syncs on or off.
func (f *FaultFS) SetFailSync(on bool) { f.failSync.Store(on) }

// SetFull fills the disk (on) or frees it again (off).
func (f *FaultFS) SetFull(on bool) {
	if on {
		f.released.Store(false)
	}
	f.full.Store(on)
}

// SetFree sets the free space reported (-1: the real one).
func (f *FaultFS) SetFree(n int64) { f.free.Store(n) }

// ENOSPCs and FailedSyncs count the faults injected so far.
func (f *FaultFS) ENOSPCs() int64     { return f.enospc.Load() }
func (f *FaultFS) FailedSyncs() int64 { return f.syncs.Load() }

// Remove notes the release of a ballast.
func (f *FaultFS) Remove(name string) error {
	err := f.FS.Remove(name)
	if err == nil && isBallast(name) && f.full.Load() {
		f.released.Store(true)
	}
	return err
}

// GetDiskUsage reports the free space the faults say.
func (f *FaultFS) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	u, err := f.FS.GetDiskUsage(path)
	if err != nil && !errors.Is(err, errorfs.ErrInjected) {
		return u, err
	}
	switch {
	case f.full.Load() && f.released.Load():
		u.AvailBytes = ballastFreed
	case f.full.Load():
		u.AvailBytes = 0
	case f.free.Load() >= 0:
		u.AvailBytes = uint64(f.free.Load())
	}
	return u, nil
}
