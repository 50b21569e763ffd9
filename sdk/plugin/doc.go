// Package plugin is the guest-side SDK for ticketd WebAssembly plugins.
//
// A plugin is a Go program compiled to a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.wasm .
//
// The host (package github.com/ticketd/ticketd/plugins) loads the module,
// runs its init functions once per instance and then calls the hooks the
// plugin registered. The ABI itself (exports, memory protocol, JSON
// payloads, limits) is specified in plugins/README.md; this package
// implements it so a plugin author writes only the decisions:
//
//	package main
//
//	import "github.com/ticketd/ticketd/sdk/plugin"
//
//	func main() {}
//
//	func init() {
//		plugin.HandleValidateGrant(func(r plugin.GrantRequest) plugin.Verdict {
//			if r.Owner == "" {
//				return plugin.Deny("an owner is required")
//			}
//			return plugin.Allow()
//		})
//		plugin.HandleOnApplied(func(a plugin.Applied) []plugin.Event {
//			return []plugin.Event{{
//				Type: "lock." + a.Result.Kind,
//				Data: plugin.Fields{{Name: "key", Value: a.Command.Key}},
//			}}
//		})
//	}
//
// # Registering hooks
//
// Register handlers from an init function. A reactor's main function is
// never called: the host runs _initialize, which runs package
// initialisation only. The host asks the module which hooks it has right
// after initialisation (the ticketd_hooks export), so a handler registered
// later is never called. Registering a hook twice replaces the handler.
//
// # Rules for handlers
//
// Handlers must be pure functions of their input. The host keeps a small
// pool of warm instances and may run any call on any instance, fresh or
// reused, on any node; it discards instances at will (after every trap, for
// instance). State kept in package variables between calls is therefore
// not reliable and breaks the guarantee that every node reaches the same
// verdict. The sandbox has no file system, network, environment or
// arguments; time.Now returns a fake clock and crypto/rand a fixed
// sequence, so neither can carry information.
//
// A panic in a handler is not recovered: the instance traps, the host
// discards it and, for ValidateGrant, denies the grant (fail closed) and
// reports ErrPluginTrap. Anything written to standard error (the panic
// message included) is captured by the host for its logs.
//
// # Cost
//
// Go code compiled to WebAssembly is slow at reflection and at heap
// allocation, and every package linked in makes the module larger, which
// the host pays at compile and instantiation time. The SDK therefore does
// not use encoding/json: it decodes requests and encodes responses with a
// small hand-written codec (which agrees with encoding/json on every
// input), and event data is built as Fields, encoded without reflection.
// A plugin may still import encoding/json (or fmt) for its own needs.
//
// # Building on other platforms
//
// The exports live in a file built only for GOOS=wasip1. On any other
// platform the package compiles (so go build ./... and go vet ./... work
// and handlers can be unit tested natively) but exports nothing.
package plugin
