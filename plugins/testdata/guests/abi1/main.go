// Command abi1 is a policy and audit guest of plugin ABI version 1,
// written without the SDK (as a module built before version 2 was): it
// checks that the host still sends it the version-1 requests, byte for
// byte in layout, whatever the lock's kind.
//
//	validate_grant: denies a request that has any member but key, owner,
//	                identity and lease_ms (reason "abi1: unexpected
//	                member"), or a key under "deny/"; allows the rest.
//	on_applied:     one event, abi1.applied, or abi1.unexpected when the
//	                command or result has a member version 1 did not have.
package main

import (
	"strings"
	"unsafe"
)

func main() {}

var in, out []byte

//go:wasmexport ticketd_abi_version
func abiVersion() uint32 { return 1 }

//go:wasmexport ticketd_alloc
func alloc(size uint32) uint32 {
	in = make([]byte, max(size, 1))
	return addr(in)
}

func addr(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func respond(s string) uint64 {
	out = []byte(s)
	return uint64(addr(out))<<32 | uint64(len(out))
}

// members returns the member names of the flat JSON objects in s, in
// order (the host's requests are compact encoding/json output: a name is
// a string followed by ':'). Good enough for the test's keys, which hold
// no quotes or colons.
func members(s string) []string {
	var names []string
	for {
		i := strings.Index(s, `":`)
		if i < 0 {
			return names
		}
		j := strings.LastIndexByte(s[:i], '"')
		names = append(names, s[j+1:i])
		s = s[i+2:]
	}
}

func only(names []string, allowed ...string) bool {
	for _, n := range names {
		ok := false
		for _, a := range allowed {
			ok = ok || n == a
		}
		if !ok {
			return false
		}
	}
	return true
}

//go:wasmexport validate_grant
func validateGrant(ptr, n uint32) uint64 {
	req := string(in[:n])
	if !only(members(req), "key", "owner", "identity", "lease_ms") {
		return respond(`{"allow":false,"reason":"abi1: unexpected member"}`)
	}
	if strings.HasPrefix(req, `{"key":"deny/`) {
		return respond(`{"allow":false,"reason":"abi1: keys under deny/ are refused"}`)
	}
	return respond(`{"allow":true}`)
}

//go:wasmexport on_applied
func onApplied(ptr, n uint32) uint64 {
	if !only(members(string(in[:n])), "index", "command", "kind", "key", "owner", "lease_ms", "granted_at_ms", "token", "result", "existed") {
		return respond(`{"events":[{"type":"abi1.unexpected"}]}`)
	}
	return respond(`{"events":[{"type":"abi1.applied"}]}`)
}
