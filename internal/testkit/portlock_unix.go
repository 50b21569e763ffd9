//go:build unix

package testkit

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// claimPort takes an exclusive lock on a file named after port, shared by
// every test process of the machine, and keeps it for the life of this
// process (the kernel drops it when the process exits, however it ends).
// It reports whether this process holds the port's lock now: false when
// another live process claimed it. Without a usable lock directory every
// port counts as claimed.
func claimPort(port int) bool {
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.locks[port] != nil {
		return true // ours already: a second lock of our own would conflict with it
	}
	dir := filepath.Join(os.TempDir(), "ticketd-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	if ports.locks == nil {
		ports.locks = make(map[int]*os.File)
	}
	ports.locks[port] = f
	return true
}
