// Package daemon assembles one ticketd node from its parts and runs it:
// the Pebble store and raft node (raftstore), the leader-side lock service
// (lockservice), the peer transport (transports/peer), the NATS client service
// (transports/natsapi) on an embedded or external NATS, Prometheus
// metrics and health endpoints.
//
// # What it owns
//
// Config (config.go): every setting with its default, validated before
// anything starts. Run (daemon.go): start in dependency order, stop in
// reverse order. cmd/ticketd parses files, TICKETD_* env and flags into a
// Config; tests start in-process nodes with Start directly.
package daemon
