// Command ticketd runs a ticketd node and talks to a running cluster.
//
//	ticketd serve [--config FILE] [flags]       run a node (embedded NATS by default)
//	ticketd lock acquire KEY --lease 10s [--owner NAME] [--wait 5s]
//	ticketd lock release KEY --token N
//	ticketd lock get KEY
//	ticketd lock renew KEY TOKEN [--lease 30s]
//	ticketd lock ls PREFIX [--limit 100]       every held lock under PREFIX, one JSON line each
//	ticketd lock watch KEY                    one JSON line per event until interrupted
//	ticketd lock exec KEY [--lease 10s] [--wait 30s] [--grace 5s] [--lock-delay 0] -- CMD ARGS...
//	ticketd lock exec KEY [KEY...] --session-ttl 10s [--wait 30s] [--grace 5s] [--lock-delay 0] -- CMD ARGS...
//	                                          several keys in one session (docs/protocol.md §11)
//	ticketd lock check KEY TOKEN              exit 0 when TOKEN is KEY's current token, 1 when not
//	ticketd fence pubkey [--json]             the public keys that verify the cluster's fences
//	ticketd status [--watch [--interval 1s]]   one view, or a live view of every member
//	ticketd bench --clients 16 --keys 1000 --duration 10s [--json]
//	ticketd version                                  release, revision, Go, cluster version
//	ticketd snapshot save FILE --control URLS [--force] back up (control credential), mode 0600
//	ticketd snapshot status FILE                      verify a backup file
//	ticketd snapshot restore FILE --data DIR [--peer-address A | --id N --initial-cluster ...]
//	                         [--bump-tokens N] [--drop-locks]
//	ticketd admin bootstrap|mint-join [--out FILE]|members|replace complete|replace abort|retire|fence rotate
//
// The command tree is built with cobra (commands.go): every command's
// --help (and `ticketd help PATH`) shows a description, its Usage line with
// positional arguments, its own flags and examples; a mistake on the
// command line prints "Error: ..." and the command's usage on stderr, exit
// status 2. Each leaf binds its flags to an options struct beside its body
// function, which cobra calls with the positional arguments.
//
// Client commands take --nats URL (default nats://127.0.0.1:4222) and
// --partitioned for a deployment of many groups (docs/scaling.md: keyed
// requests on the key's hashed subject, ls across every group), print
// one JSON object on stdout (ls and watch: one per line; exec: only the
// command's output, and it exits with the command's status, 128+N if
// signal N ended it), and on failure print the stable error code and
// message on stderr and exit non-zero (exit status 2 for usage errors, 3
// for indeterminate outcomes, 4 when a cluster limit refused the request
// (resource_exhausted: nothing changed, retry later), 1 otherwise; the
// table is exitCodesHelp). An unreachable NATS or control endpoint is
// named with its OS error (natsclient.DialRecorder, checkReachable).
// lock acquire and lock exec name their owner USER@HOST:PID unless
// --owner says otherwise; lock exec resolves its command before taking the
// lock, so a missing command uses up no token.
//
// Secrets (secrets.go) never come from a flag value: each has a
// --NAME-file flag, TICKETD_NAME_FILE and TICKETD_NAME, read the same way
// by every command (natsclient.ResolveSecret); a secret given as a value,
// or a password inside a NATS URL, is refused naming what to use instead.
//
// serve stops on SIGTERM or SIGINT, a leader handing leadership over
// first. On Linux, lock exec runs its command under a guard (the binary
// itself, with a hidden first argument, execguard_linux.go) that kills the
// command's process group if lock exec dies, even by SIGKILL.
//
// Configuration of serve comes from, in increasing precedence: built-in
// defaults, a YAML file (--config), TICKETD_* environment variables
// (TICKETD_NATS_LISTEN for nats-listen) and flags. Unknown keys are
// rejected.
package main
