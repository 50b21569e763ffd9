//go:build wasip1

package plugin

import "unsafe"

// The ABI exports. //go:wasmexport is allowed outside package main (Go
// 1.24+): linking this package into a c-shared wasip1 module exports these
// functions from it.

var (
	// in is the request buffer handed out by ticketd_alloc; out is the
	// last response. Both stay referenced from these variables, so the
	// garbage collector keeps them (and their addresses, which the host
	// holds) alive until the next call. Both are reused: the host copies a
	// request in before the call and the response out right after it, and
	// decoding copies the request into a string before a handler runs.
	in  []byte
	out []byte
)

//go:wasmexport ticketd_abi_version
func exportABIVersion() uint32 { return ABIVersion }

//go:wasmexport ticketd_hooks
func exportHooks() uint32 { return hooks() }

//go:wasmexport ticketd_alloc
func exportAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1 // never hand out a nil (zero) pointer
	}
	if uint32(cap(in)) < size {
		in = make([]byte, size)
	}
	in = in[:size]
	return addr(in)
}

//go:wasmexport validate_grant
func exportValidateGrant(ptr, n uint32) uint64 {
	req, ok := request(ptr, n)
	if !ok {
		return respond(encodeVerdict(out[:0], Verdict{Error: "sdk: request is not in the ticketd_alloc buffer"}))
	}
	return respond(validateGrantJSON(out[:0], req))
}

//go:wasmexport on_applied
func exportOnApplied(ptr, n uint32) uint64 {
	req, ok := request(ptr, n)
	if !ok {
		return respond(encodeApplied(out[:0], appliedResponse{Error: "sdk: request is not in the ticketd_alloc buffer"}))
	}
	return respond(onAppliedJSON(out[:0], req))
}

// request returns the bytes the host wrote. The host must pass back the
// pointer ticketd_alloc returned; anything else is refused rather than
// turned into a pointer.
func request(ptr, n uint32) ([]byte, bool) {
	if len(in) == 0 || ptr != addr(in) || n > uint32(len(in)) {
		return nil, false
	}
	return in[:n], true
}

// respond keeps b alive and packs its address and length as ptr<<32|len.
func respond(b []byte) uint64 {
	out = b
	if len(b) == 0 {
		return 0
	}
	return uint64(addr(b))<<32 | uint64(len(b))
}

func addr(b []byte) uint32 {
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
