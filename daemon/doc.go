// Package daemon assembles one ticketd node from its parts and runs it:
// the Pebble store and raft node (raftstore), the leader-side lock service
// (lockservice), the peer transport (transports/peer), the control plane
// (control), WebAssembly plugins (plugins) and their audit publisher
// (plugins/audit), the NATS client service (transports/natsapi) on an
// embedded or external NATS, Prometheus metrics and health endpoints.
//
// # What it owns
//
// Config (config.go): every setting with its default, validated before
// anything starts, with secrets read from their *-file settings
// (LoadSecretFiles). The embedded NATS server from a nats-server
// configuration file (--nats-config) and the node's own authenticated NATS
// connection (nats.go), whose warnings reach the node's log rate-limited
// (natslog.go); the access list file, and the start-up check that the
// access list and per-identity limits run only where a client cannot forge
// the Nats-Request-Info header they rely on (identity.go, Config.
// IdentitySettings). TLS of the peer transport and the
// control API from PEM files (tls.go). The cluster ID and the refusal to
// bootstrap a static member on an empty data directory (clusterid.go). A
// member that was removed from the cluster (retired or replaced) stops
// itself with ErrRemoved, as etcd's removed member does: refused at start
// when its own applied state says so, and while it runs once it applies
// its removal or, after a long time without a leader, once the leader's
// status over NATS no longer lists it (removed.go); Done and Err say so.
// Start and Close (daemon.go): start the parts in dependency order, hand each one the others it needs, stop them in
// reverse order; Shutdown, the planned stop (SIGTERM), has a leader hand
// leadership over first. Plugin loading from the configured files and the adapter
// that makes a plugin set the lock service's Grant policy (plugins.go).
// The node's health, readiness and status views, which read several parts
// at once; the metrics listener (http.go), its connections bounded in all
// and per source, the oldest idle one closed to make room. The garbage collector's
// headroom of a node that owns its process (Options.TuneGC, gc.go).
// For upgrade tests only, a node that acts as a binary of an older
// cluster version (Options.MaxClusterVersion, oldversion.go; no flag).
// cmd/ticketd parses files, TICKETD_* env and flags into a
// Config; tests start in-process nodes with Start, directly or through
// internal/testkit/testcluster.
//
// # What it does not own
//
// Each part's behaviour lives in its package: the control API, identity
// file and membership reconciliation in control, audit events in
// plugins/audit, leases and waiters in lockservice, the Ready loop in
// raftstore. The daemon only wires them: which identity the node starts
// with comes from control.ResolveIdentity, and applied commands reach the
// audit publisher through the lock service's Applied hook.
package daemon
