// Package testkit is the one set of test helpers the ticketd tests share:
// free loopback addresses, polling with a deadline, an embedded NATS
// server and a quiet logger. Its subpackage testcluster builds in-process
// clusters of daemon.Start nodes; pgtest starts a throwaway PostgreSQL
// server (fence/fencepg's tests, examples/fencing).
//
// # What it owns
//
// FreeAddr and FreeAddrs (addr.go, portlock_unix.go): 127.0.0.1 addresses that were free a
// moment ago, for configs that must name a port before anything listens;
// PickFreeAddr is the same for code that has no testing.TB (the faults
// harness calls it from its nemesis goroutine). Eventually (eventually.go):
// poll a condition until it holds, failing the test with what it waited
// for once the deadline passes; a test never sleeps and then checks.
// NATSServer and Connect (nats.go): an embedded nats-server on a free
// loopback port and client connections to it, both closed at cleanup.
// QuietLogger (log.go): a logger that discards everything; CaptureLogger:
// one that keeps everything, to check what was (not) logged. TLS
// (tls.go): a throwaway CA and certificate written as PEM files. Tmpfs,
// Fill, Unfill and FreeBytes (disk.go): a small real disk (a tmpfs mounted
// as root; the test is skipped otherwise) and filling it. TickMS and
// ElectionTicks: the short raft ticks of in-process test nodes. Workers
// (workers.go): n goroutines repeating one bounded step (a client's
// acquire and release) until a stop channel closes.
//
// # What it does not own
//
// It imports no ticketd package, so every package's internal tests can
// use it, including those of the packages daemon is built from. Starting
// nodes lives in testcluster (which imports daemon: tests inside package
// daemon cannot use it and run as package daemon_test instead); a single
// node, metrics readers and fakes stay with the tests that need them.
// Fault injection (filters, clock jumps, wipes) stays in faults.
package testkit
