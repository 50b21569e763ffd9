// Package protocol is ticketd's client wire protocol: NATS subjects, the
// JSON request and reply bodies, the stable error codes, and the strict
// decoders that every server-side request goes through.
//
// # Subjects
//
// Every node serves the same subjects in the NATS queue group QueueGroup,
// so a request reaches exactly one node; a follower forwards it to the
// leader, and only the leader answers lock requests. See docs/protocol.md
// for the full description written for client authors in any language.
//
// # Hostile input
//
// Decoders reject payloads over MaxRequestSize, unknown fields, trailing
// data, wrong JSON types and values outside the limits of package core,
// each with an *Error carrying a stable Code. Acquire, release and get
// bodies in plain JSON take a fast path (fastdecode.go) that accepts
// exactly what the strict decoder accepts, with the same values, and
// hands everything else to it.
package protocol
