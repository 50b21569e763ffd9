// Package plugins hosts ticketd's WebAssembly plugins with wazero.
//
// A plugin is a WebAssembly module that implements one or both hooks of
// SPEC §4.6:
//
//   - validate_grant (a Policy): asked before the leader proposes a Grant,
//     it allows or denies it, with a reason;
//   - on_applied (an Auditor): shown every applied command and its result,
//     it returns audit events.
//
// The ABI (exports, memory protocol, JSON payloads and limits) is
// specified in README.md beside this file; package
// github.com/ticketd/ticketd/sdk/plugin implements the guest side for Go.
//
// # Plugins never touch tokens
//
// A plugin can neither change a command nor assign, alter or observe a
// token before it is issued. The host gives it serialised copies only (the
// Grant's key, owner, lease and the requester's authenticated identity;
// after apply, a copy of the command and of its result) written into the
// plugin's own linear memory; the plugin has
// no access to host memory, no host functions beyond WASI's sandboxed
// stubs, and its only outputs are a Verdict or a list of Events, which the
// host decodes and checks. ValidateGrant can only veto a Grant before it is
// proposed; OnApplied runs after the state machine has applied the command
// and produced its result, and nothing it returns is fed back into the
// state machine.
//
// # Sandbox and determinism
//
// Every instance runs in wazero's default sandbox: no file system, no
// environment, no arguments, no network; the wall clock and the monotonic
// clock are fake (they advance by a fixed step per reading), sleep returns
// at once, and the random source is a fixed sequence. Only the WASI
// snapshot_preview1 module is available to import, because Go's wasip1
// runtime needs it. The same module given the same input therefore gives
// the same verdict on every node. Memory is capped per instance
// (Config.MemoryLimitPages) and every call has a deadline
// (Config.CallTimeout) enforced with wazero's close-on-context-done: a
// guest that loops is cut off, not waited for.
//
// # Failures fail closed
//
// A guest is treated as hostile. A trap, a deadline overrun, memory
// exhaustion, a wild pointer, an oversize or malformed response or an
// unknown ABI version gives a typed error (ErrPluginTrap, ErrPluginMemory,
// ErrPluginTimeout, ErrPluginABI; see errors.go), and ValidateGrant then
// also returns a denying Verdict whose Reason starts "plugin error: ". The
// instance that failed is replaced by a fresh one, on the failed call's
// time (so its caller pays for it, not the next one), and one bad call
// never poisons the next. wazero reports guest faults as
// errors; nothing here recovers panics.
//
// # Compile once, pool instances
//
// Load compiles the module once (Config.CompilationCache can share the
// machine code across runtimes) and keeps a pool of up to
// Config.MaxInstances warm instances. Instantiating a Go guest means
// allocating its memory and running its runtime's _initialize: several
// milliseconds and megabytes (see BenchmarkInstantiate), against tens of
// microseconds for a pooled call (BenchmarkValidateGrant). A fresh
// instance per call would make every Grant pay that. The price of the
// pool is that an instance's memory survives between calls, so a guest
// could carry state from one call to the next; the ABI forbids it (hooks
// must be pure functions of their input), and since calls land on
// arbitrary instances, which are discarded at will, such state would not
// even be consistent on one node. An instance is used by one call at a
// time, which is what makes the Plugin safe for concurrent use.
//
// # Shares between identities
//
// share.go divides a plugin's policy calls among the identities that make
// them: each runs at most Config.IdentityCalls calls at once and may use
// Config.IdentityTime of instance time per second; beyond that its calls
// are refused at once with a *ShareError. An identity whose keys make the
// policy slow therefore cannot hold the instances every other identity's
// Grants need (issue 21).
//
// # Sets of plugins
//
// A Set runs several plugins as one Policy (in order, the first deny or
// failure wins, no policy plugin means allow) and one Auditor (all audit
// plugins, events concatenated in order, one plugin's failure does not
// stop the others). Package plugins/audit runs the Auditor off the raft
// loop and publishes its events on NATS; this package knows nothing of
// NATS.
package plugins
