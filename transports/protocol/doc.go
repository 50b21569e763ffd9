// Package protocol is ticketd's client wire protocol: NATS subjects, the
// JSON request and reply bodies, the stable error codes, and the strict
// decoders that every server-side request goes through.
//
// # Subjects
//
// The lock subjects (acquire, release, get, and lifecycle.go's renew,
// list and withdraw) are served in the NATS queue group QueueGroup by the
// ready leader only, so a request reaches at most one node; a node that
// still receives one while leadership moves forwards it to the leader.
// Status is served by every node. Applied changes are published on watch
// subjects (WatchSubject). See docs/protocol.md for the full description
// written for client authors in any language.
//
// # Sessions
//
// session.go (cluster version 4) names the session subjects (open,
// keepalive, close), their bodies and the decimal session ID, and the
// acquire's session and lock_delay_ms fields; a held reply in a key's
// lock-delay carries delay_ms (Error.DelayMS).
//
// # Partitions
//
// partition.go names the subjects of a partitioned deployment
// (docs/scaling.md): clients send keyed requests on KeyedSubject, which
// carries KeyHash(key); the NATS mapping of PartitionMapping rewrites it
// to the subject of group GroupOf(key, groups), computed exactly as
// nats-server's partition function does; a Partition gives one group's
// subjects (lock, status, node status, forward) and refuses keys that are
// not its own (Owns, wrong_group).
//
// # Hostile input
//
// Decoders reject payloads over MaxRequestSize, unknown fields (names are
// matched case and all), a field given twice or as null, strings that are
// not valid UTF-8 (raw or as a lone surrogate escape; strict.go), trailing
// data, wrong JSON types and values outside the limits of package core,
// each with an *Error carrying a stable Code. Acquire, release, get, check
// and session bodies in plain JSON take a fast path (fastdecode.go) that accepts
// exactly what the strict decoder accepts, with the same values, and
// hands everything else to it.
package protocol
