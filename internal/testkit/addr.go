package testkit

import (
	"net"
	"testing"
)

// PickFreeAddr returns a 127.0.0.1 address whose port was free a moment
// ago. It is FreeAddr for callers without a testing.TB.
func PickFreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
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
