// Command badabi is a hostile test guest, written without the SDK. Its
// validate_grant misbehaves according to the request's key, and its
// on_applied according to the applied command's key:
//
//	validate_grant: oob, huge, empty, json, unknown, noallow, trailing,
//	                longreason, error, array; anything else allows.
//	on_applied:     many, badtype, emptytype, array, string, noevents,
//	                nulldata; anything else emits one good event.
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
	in = make([]byte, size)
	return addr(in)
}

func addr(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func respond(s string) uint64 {
	out = []byte(s)
	return uint64(addr(out))<<32 | uint64(len(out))
}

// key finds the value of the first "key" member: enough for the requests
// this host sends, without pulling encoding/json into the module.
func key(req []byte) string {
	s := string(req)
	i := strings.Index(s, `"key":"`)
	if i < 0 {
		return ""
	}
	s = s[i+len(`"key":"`):]
	if j := strings.IndexByte(s, '"'); j >= 0 {
		return s[:j]
	}
	return ""
}

//go:wasmexport validate_grant
func validateGrant(ptr, n uint32) uint64 {
	switch key(in[:n]) {
	case "oob":
		return 0xffff0000<<32 | 100
	case "huge":
		respond(`{"allow":true}`)
		return uint64(addr(out))<<32 | (64<<10 + 1)
	case "empty":
		return 0
	case "json":
		return respond(`{"allow":tru`)
	case "unknown":
		return respond(`{"allow":true,"extra":1}`)
	case "noallow":
		return respond(`{"reason":"no allow field"}`)
	case "trailing":
		return respond(`{"allow":true} {"allow":true}`)
	case "longreason":
		return respond(`{"allow":false,"reason":"` + strings.Repeat("x", 300) + `"}`)
	case "error":
		return respond(`{"allow":true,"error":"cannot think today"}`)
	case "array":
		return respond(`[true]`)
	}
	return respond(`{"allow":true}`)
}

//go:wasmexport on_applied
func onApplied(ptr, n uint32) uint64 {
	switch key(in[:n]) {
	case "many":
		return respond(`{"events":[` + strings.Repeat(`{"type":"x"},`, 16) + `{"type":"x"}]}`)
	case "badtype":
		return respond(`{"events":[{"type":"lock granted"}]}`)
	case "emptytype":
		return respond(`{"events":[{"type":""}]}`)
	case "array":
		return respond(`{"events":[{"type":"x","data":[1,2]}]}`)
	case "string":
		return respond(`{"events":[{"type":"x","data":"s"}]}`)
	case "noevents":
		return respond(`{}`)
	case "nulldata":
		return respond(`{"events":[{"type":"x","data":null}]}`)
	}
	return respond(`{"events":[{"type":"test.ok","data":{ "a" : 1 }}]}`)
}
