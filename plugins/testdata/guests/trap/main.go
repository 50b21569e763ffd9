// Command trap is a test guest whose hooks trap on request: a key of
// "panic" panics, "nil" dereferences a nil pointer, "exit" calls WASI's
// proc_exit directly;
// a key of "identity" is denied with the request's identity as the reason
// (so a test sees what reached the guest); any other key is allowed (and
// any applied command gets one event), so a test can check that the host
// recovers with a fresh instance.
package main

import "github.com/ticketd/ticketd/sdk/plugin"

func main() {}

type box struct{ n int }

var nilBox *box

func init() {
	plugin.HandleValidateGrant(func(r plugin.GrantRequest) plugin.Verdict {
		trap(r.Key)
		if r.Key == "identity" {
			return plugin.Deny("identity=" + r.Identity)
		}
		return plugin.Allow()
	})
	plugin.HandleOnApplied(func(a plugin.Applied) []plugin.Event {
		trap(a.Command.Key)
		return []plugin.Event{{Type: "test.ok"}}
	})
}

func trap(key string) {
	switch key {
	case "panic":
		panic("boom: trap guest asked to panic")
	case "nil":
		println(nilBox.n)
	case "exit":
		procExit(3)
	}
}

// procExit is WASI's proc_exit, imported directly (os.Exit would pull the
// os package into the module).
//
//go:wasmimport wasi_snapshot_preview1 proc_exit
func procExit(code uint32)
