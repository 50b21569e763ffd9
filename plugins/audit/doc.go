// Package audit publishes the events of ticketd's audit plugins on NATS.
//
// # What it owns
//
//   - The Publisher (audit.go): a bounded queue that the raft loop feeds
//     through Offer, which never blocks (a full queue drops the command
//     and counts it); one goroutine that shows each queued applied
//     command to the audit plugins (plugins.Auditor, bounded by
//     CallTimeoutDefault) and publishes every event they return as an
//     Event on SubjectPrefix.<type>; the ticketd_audit_* counters.
//   - De-duplication: every node publishes the events of the entries it
//     applies, so none is lost across a leader change. Each message
//     carries a Nats-Msg-Id made of its log index, plugin and position,
//     the same on every node; EnsureStream (stream.go) sets up a
//     JetStream stream that keeps one copy within DuplicateWindowDefault,
//     and plain subscribers can de-duplicate on the header themselves.
//
// # What it does not own
//
// The plugin host, the sandbox and the hooks themselves live in package
// plugins, which knows nothing of NATS. What feeds Offer (the lock
// service's applied hook or a raftstore observer) and when Start and
// Close run is package daemon's wiring. Events are observations only:
// nothing published here goes back into the state machine.
package audit
