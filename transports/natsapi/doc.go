// Package natsapi serves ticketd's client protocol (package protocol) as a
// NATS micro service, so `nats micro ls|info|stats ticketd` discovers it
// and every instance answers $SRV.PING/INFO/STATS.
//
// # Micro
//
// micro.go answers the micro protocol itself, with nats.go/micro's types,
// instead of through micro.AddService: each request is answered from its
// own goroutine (acquires wait in key queues), after micro's handler would
// have returned, so micro could count neither its error nor its time.
// Here each endpoint counts a request when its reply is written: the time
// since it arrived and the error code it carried (a relayed leader error
// too). A request a follower forwards is counted once, on the follower.
//
// # Routing
//
// The lock endpoints are in one queue group, so each request reaches at
// most one node, and only the ready leader subscribes to them
// (leadersubs.go): in steady state every lock request lands on the leader
// without an extra hop, and during an election clients see NATS "no
// responders" and retry. A node that receives one while not the leader
// (the hand-over window) proxies the untouched request to the leader's
// forward subject and relays the leader's reply, so a follower never
// answers a lock request from its own, possibly stale, state. When the leader is unknown, or the
// forward finds nobody subscribed (NATS "no responders"), the follower
// answers `unavailable`: nothing happened, retry. When the leader does not
// answer in time the follower answers `indeterminate` for acquire and
// release: the leader may have applied it.
//
// # Goroutines
//
// Each request runs on its own goroutine, as acquires may wait in a key's
// queue; workers.go reuses idle ones (with their grown stacks) instead of
// starting a fresh one per request. Nothing queues behind a busy worker.
//
// # Fair shares
//
// fair.go admits every request against its identity's share
// of the requests in progress (lockservice.BeginRequest:
// resource_exhausted) and against the node's budget (Config.MaxInflight,
// acquires and the rest apart: unavailable, "node overloaded"). An acquire
// waiting in a key's queue is parked: it counts against neither, only
// against the waiter limits. With Config.ReplyInterest (the daemon's view
// of its embedded NATS server), a sweep each second ends the parked waits
// whose requester no longer listens on its reply subject. forward.go holds
// the follower's forwarding to the leader.
//
// # Errors
//
// The lock service returns domain errors (lockservice.ErrHeld,
// NotLeaderError, ...); errors.go holds the one table that maps them to
// the stable codes of docs/protocol.md. Nothing else in ticketd speaks the
// wire protocol except the SDK and the CLI.
//
// # Status
//
// status.go assembles a node's status reply from the raft node, the peer
// addresses and the loaded plugins: its role (a learner named a learner,
// though raft calls it a follower), its binary's release and revision, the
// cluster ID, the newest cluster version it reads and its disk alarm.
//
// # Lost replies
//
// A granted acquire whose reply cannot be written (the publish fails) is
// released with its exact token through lockservice.ReleaseUndelivered. Connect
// the node's NATS connection with nats.ReconnectBufSize(-1) so a reply
// during a disconnect fails at once instead of sitting in a buffer.
//
// # Lifecycle endpoints and events
//
// lifecycle.go serves renew, list and withdraw, fence.go check and
// fence_keys (issue 23), all forwarded like release and get; a grant's
// reply carries the fence the lock service signed. delivery.go publishes a grant to a requester that waited with a
// reply subject on one per-node inbox, so that NATS's "no responders"
// answer tells the node for certain that the requester is gone; it then
// releases that grant with its exact token (on a follower: asks the
// leader to). watch.go publishes every applied lock change on its key's
// watch subject from a bounded buffer the raft loop never waits for (a
// session's close or expiry: one event per lock it ended).
//
// # Sessions
//
// session.go serves ticketd.v1.session.open, .keepalive and .close
// (lockservice sessions.go), leader-only and forwarded like the lock
// endpoints; an acquire carries its session and lock_delay_ms to the lock
// service, and a held answer in a key's lock-delay its delay_ms. A
// partitioned node does not subscribe to the session subjects and refuses
// an acquire in a session with unsupported (docs/scaling.md).
//
// # Identity
//
// identity.go reads who is asking from the Nats-Request-Info header that
// nats-server writes on a request crossing a service import, and carries it
// from a follower to the leader in Ticketd-Identity on the forward subject,
// trusted only there. It believes the header only where Config.Identity
// says the deployment lets nobody else publish in ticketd's account (the
// daemon decides that at start), and only on a request whose reply subject
// shows it crossed an import; every other request is anonymous, but an
// imported one on which no single header can be read (the client's header
// block hid the server's) is refused, never anonymous. The lock
// service checks the identity against its access list. headerguard.go
// makes the node's connection to its embedded server split header lines
// as nats-server does (a bare LF is no line end), so a client cannot hide
// a forged Nats-Request-Info from the server and show it to the node.
//
// # Partitions
//
// With Config.Partition set the node is one group of a partitioned
// deployment (docs/scaling.md): its lock endpoints, node status and
// forward subjects are the group's (protocol.Partition), it answers status
// on the group's status subject too, and partition.go makes its leader
// refuse, with wrong_group, an acquire, renew or get of a key that does
// not hash to its group, whatever subject it came on.
//
// # Control
//
// Control requests never travel on the client port: anything sent to
// ticketd.v1.control.> is refused with control_refused.
package natsapi
