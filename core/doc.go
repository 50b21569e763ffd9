// Package core is ticketd's deterministic lock state machine.
//
// # What it owns
//
// The replicated commands of SPEC §2 (Grant, Release, Expire, Control),
// their results (SPEC §3), the lock table, the fencing-token counter, the
// replicated control state (control.go: requests; control_apply.go: their
// application; control_state.go: the state), and the versioned binary
// encodings of log entries and lock records (encoding.go), snapshots
// (encoding_snapshot.go, including SnapshotEncoder, which builds a
// snapshot one lock or one stored lock record at a time) and the control
// record (encoding_control.go), the incremental state digest (digest.go)
// and the limits, with the arithmetic that makes the largest table fit
// every path a snapshot travels (limits.go).
//
// # Control
//
// A Control command carries one ControlRequest: Bootstrap, MintJoin,
// Admit, Promote, PrepareReplacement, CompleteReplacement,
// AbortReplacement or Retire. The leader authenticates the caller and
// proposes it (SPEC §4.5); Apply checks only the replicated invariants and
// answers BootstrapRecorded, AdmissionAccepted, ReplacementPrepared,
// ControlApplied, or ControlRejected with a stable ControlReason. A
// rejection changes nothing. NodeIDs and incarnations come from counters
// that only grow, every identity ever issued stays in the issued set, and
// a retired NodeID is never a member again; Machine.CheckIdentity lets the
// peer transport refuse a node that comes back with a retired or stale
// identity.
//
// # Reseeding
//
// Reseed (reseed.go) turns a backed-up state into the first state of a
// new cluster (ticketd snapshot restore): the token counter bumped past
// every token the old cluster may have issued since, the locks kept or
// dropped, and the control state either reduced to its cluster version
// (static clusters) or given one fresh voter with every old member
// retired. It is a pure function of its input, like Apply.
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
// Decoders (DecodeEntry, DecodeSnapshot, DecodeSnapshotState,
// DecodeLockRecord, DecodeControlState) accept only their known versions
// (snapshots: 2, and 1 from before the control state), enforce the limits in limits.go, reject trailing
// bytes, and return *Error values with stable codes. They are fuzzed; see
// fuzz_test.go and testdata/fuzz.
package core
