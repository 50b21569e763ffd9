// Package core is ticketd's deterministic lock state machine.
//
// # What it owns
//
// The replicated commands of SPEC §2 (Grant, Release, Expire; Control is
// reserved for the control-plane work), their results (SPEC §3), the lock
// table, the fencing-token counter, and the versioned binary encodings of
// log entries and lock-table snapshots.
//
// # Rules
//
// Apply is a pure function of (state, command): no clock, no randomness, no
// I/O, and no map-iteration order leaks into a result, a snapshot or a
// digest. Every replica that applies the same commands in the same order
// reaches byte-identical state. Time enters only as data inside a command
// (Grant.GrantedAtMS, recorded for information and never consulted).
//
// Fencing tokens are assigned by Apply from a counter that is part of the
// replicated state, so they are identical on every node for the same entry
// and strictly increasing across the cluster's whole life: snapshots carry
// the counter, restarts restore it.
//
// # Hostile input
//
// Decoders (DecodeEntry, DecodeSnapshot, DecodeLockRecord) accept only
// their known versions, enforce the limits in limits.go, reject trailing
// bytes, and return *Error values with stable codes. They are fuzzed; see
// fuzz_test.go and testdata/fuzz.
package core
