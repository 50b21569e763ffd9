// Package natsclient turns the NATS client settings that every ticketd
// process shares (credentials, TLS, inbox prefix) into nats.go options,
// and keeps credentials out of what ticketd prints.
//
// # What it owns
//
// Auth: the client side of NATS authentication and TLS, with the same
// meaning on `ticketd serve` (for the node's own connection, embedded or
// --nats-url), on every client command and in the SDK (sdk.Auth is this
// type). Redact: a URL (or comma-separated list of URLs) with any
// user:password replaced, for logs and errors; HasSecret: whether one
// carries a password or a token (refused everywhere). Flags: the one helper that
// adds the NATS client flags to a command's flag set. ResolveSecret: how
// every command reads a secret (--NAME-file, TICKETD_NAME_FILE,
// TICKETD_NAME). DialRecorder: keeps the OS error of a dial that nats.go
// reports only as "no servers available".
//
// # What it does not own
//
// The server side: which users, accounts and permissions exist is the
// nats-server configuration (--nats-config, package daemon). What a
// request may do once authenticated: the access list (lockservice).
package natsclient
