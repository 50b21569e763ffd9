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
//     carries a Nats-Msg-Id (msgid.go): its log index and an HMAC of
//     index, plugin and position under a key every node of the cluster
//     shares and no client knows (KeyFromSecret: from the peer secret and
//     cluster ID; LoadOrCreateKey: a random key in the data directory of a
//     node without peers). The same on every node, so EnsureStream
//     (stream.go) sets up a JetStream stream that keeps one copy within
//     DuplicateWindowDefault, and plain subscribers can de-duplicate on
//     the header themselves; unpredictable to clients, so a forged event
//     published first can never take a real event's id and have it
//     dropped as a duplicate.
//
// # What it does not protect
//
// Who may publish on ticketd.v1.audit.> is a NATS matter. On an open NATS
// (the default embedded server) anyone can, so the stream and subscribers
// can receive forged events next to the real ones: trust an event's
// content only where NATS lets nothing but ticketd publish there
// (examples/secure: the audit subjects live in ticketd's account and are
// exported to readers as a stream).
//
// # What it does not own
//
// The plugin host, the sandbox and the hooks themselves live in package
// plugins, which knows nothing of NATS. What feeds Offer (the lock
// service's applied hook or a raftstore observer) and when Start and
// Close run is package daemon's wiring. Events are observations only:
// nothing published here goes back into the state machine.
package audit
