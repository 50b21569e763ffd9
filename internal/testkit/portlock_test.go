//go:build unix

package testkit

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// A port whose lock another holder has is not claimed; once released it
// is, and this process may claim a port it holds again.
func TestClaimPortSkipsPortsLockedElsewhere(t *testing.T) {
	const port = 9999 // below lowestPort: PickFreeAddr never hands it out
	dir := filepath.Join(os.TempDir(), "ticketd-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	// Another open file description stands for another process: flock
	// locks conflict between them even within one process.
	other, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Skipf("port %d is locked by another test process: %v", port, err)
	}
	if claimPort(port) {
		t.Fatalf("claimed port %d while another holder has its lock", port)
	}
	if err := syscall.Flock(int(other.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if !claimPort(port) || !claimPort(port) {
		t.Fatalf("port %d not claimed once free, or not again by its holder", port)
	}
}
