package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Ports below the kernel's ephemeral range are never given to outgoing
// connections, so a port picked there and bound a moment later cannot
// have been taken by one of the test's own client or route connections
// (which a port from ":0" can). Each test process takes its ports from
// its own block of that range (chosen by its pid) and walks through the
// block, so the successive picks of one binary do not hand out the same
// port. Two test binaries running side by side (go test -p) can still
// get the same block; a port is therefore also claimed with a lock on a
// file named after it (portlock_unix.go), held until the process exits,
// and a port another live process claimed is skipped.
const (
	lowestPort = 10000
	blockPorts = 256
)

// ports is this process's allocator, shared by every test of the process
// (a test helper's only package-level state): the walk through its block
// and the port locks it holds.
var ports struct {
	next  atomic.Uint32
	mu    sync.Mutex
	locks map[int]*os.File // by port; kept open: closing one would release its claim
}

// PickFreeAddr returns a 127.0.0.1 address whose port was free a moment
// ago. It is FreeAddr for callers without a testing.TB.
func PickFreeAddr() (string, error) {
	if blocks := (ephemeralLow() - lowestPort) / blockPorts; blocks > 0 {
		base := lowestPort + (os.Getpid()%blocks)*blockPorts
		ports.next.CompareAndSwap(0, uint32(rand.IntN(blockPorts))+1)
		for range blockPorts {
			port := base + int(ports.next.Add(1)%blockPorts)
			if !claimPort(port) {
				continue
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				addr := ln.Addr().String()
				ln.Close()
				return addr, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (0 when
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago;
// it fails the test if none can be had.
func FreeAddr(t testing.TB) string {
	t.Helper()
	a, err := PickFreeAddr()
	if err != nil {
		t.Fatalf("free address: %v", err)
	}
	return a
}

// FreeAddrs returns n FreeAddr addresses.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = FreeAddr(t)
	}
	return out
}
