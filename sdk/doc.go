// Package sdk is the Go client of ticketd, the distributed lock service.
//
// # What it owns
//
// The client side of the NATS request-reply protocol of package
// transports/protocol (described for every language in docs/protocol.md):
// Acquire (try once, or wait in the key's FIFO queue), Release, Renew,
// Get (the current holder), List, Watch and Status, typed errors with the
// protocol's stable codes, and the retry rules below; on top of them the
// lock lifecycle (keepalive.go: KeepAlive, WithAutoRenew, Lost, Context),
// sessions (session.go) and leader election (election.go). It renews a lease only when asked
// to (Renew, KeepAlive, WithAutoRenew), and holds no lock state beyond
// each Lock's own deadline.
//
//	c, err := sdk.Connect("nats://127.0.0.1:4222")
//	lock, err := c.Acquire(ctx, "orders/42", sdk.WithLease(10*time.Second), sdk.WithOwner("worker-1"))
//	// ... use lock.Token as the fencing token, stop before lock.Deadline() ...
//	err = lock.Release(ctx)
//
// # Keeping a lock as long as the work
//
//	lock, err := c.Acquire(ctx, "jobs/nightly", sdk.WithLease(10*time.Second), sdk.WithAutoRenew())
//	defer lock.Release(context.WithoutCancel(ctx))
//	err = job(lock.Context(), lock.Token) // stops when the lock is lost
//
// KeepAlive (or WithAutoRenew) renews every (lease - margin)/3. Each
// confirmed renewal moves Deadline to its send time plus the lease in the
// reply; a failed or indeterminate one moves nothing. Failures that leave
// the lock in place are retried; when a renewal is refused (not_found:
// the lock is gone) or none got through by Deadline minus the safety
// margin (WithSafetyMargin; default a tenth of the lease within
// [20ms, 1s]), Lost is closed and Context cancelled, always before
// Deadline. A lost lock stays lost. Release stops the keepalive.
//
// # Sessions: one keepalive for many locks
//
//	s, err := sdk.NewSession(ctx, c, sdk.WithSessionTTL(10*time.Second), sdk.WithSessionLockDelay(15*time.Second))
//	defer s.Close(context.WithoutCancel(ctx)) // releases every lock of it at once
//	a, err := s.Acquire(ctx, "orders/42")
//	b, err := s.Acquire(ctx, "orders/43", sdk.WithWait(time.Minute))
//	// ... stop when s.Done() closes (or a.Lost(), which follows it) ...
//
// NewSession (session.go; cluster version 4, not with WithPartitioned)
// keeps the session alive in the background with WithAutoRenew's
// guarantee: every (TTL - margin)/3 a keepalive (up to 20 ms early, on a
// grid that sends a client's keepalives that fall due together at once);
// Deadline is the send of the last acknowledged one plus the TTL; Done
// closes before Deadline when none gets through by Deadline minus the
// margin, at once when one is answered not_found. A client has at most
// DefaultKeepAlivesInFlight keepalives in flight (WithKeepAlivesInFlight),
// and as many background renewals: after a pause, its overdue keepalives
// wait their turn instead of taking its identity's whole share of the
// node at once, each no longer than until its session's loss deadline.
// Locks acquired in a session have no lease (Lease 0, Renew and KeepAlive
// refuse): their Deadline is the session's and their Lost and Context end
// with it. If the session expires, its locks' keys stay unavailable for
// its lock-delay (WithSessionLockDelay; WithLockDelay for a leased lock):
// a try gets ErrHeld with Error.Delay.
// Session.NewElection runs an election whose terms are locks of the
// session.
//
// Client.Close stops everything the client keeps alive, whether or not it
// owns its connection: its sessions and kept-alive locks end at once
// (ErrLost and ErrClientClosed), and the cluster ends them within their
// TTLs and leases. Close a session before its client to release its locks
// at once.
//
// # Waiting and giving up
//
// An Acquire with WithWait names its wait (wait_id). If the caller's
// context ends, or no reply comes in time, the SDK withdraws the wait
// (within its own 2 s), and releases, with its exact token, a grant that
// raced the withdrawal. When that settles the outcome, the error is the
// context's with no code: nothing is held, and the next waiter is not
// kept waiting for a lease.
//
// # Fences and checks
//
// Lock.Fence is the grant's fence: its key, token and cluster ID signed
// with the cluster's fence key (docs/fencing.md). Send it to the protected
// resource instead of the bare token; the resource verifies it with the
// keys FenceKeys returns (FenceKeys.Verifier; in a partitioned deployment
// GroupFenceKeys, each group being a cluster of its own) and keeps the
// highest token per key (package fence). Check asks the leader whether a
// token is still its key's current one, linearizably.
//
// # Listing, watching, electing
//
// List and ListAll page through the held locks under a prefix (ListFrom
// reads on inside a key whose holders did not fit one page). Watch
// delivers a key's grant, release, expire and renew events, without
// repeats; it may miss events (see Watch), so read with Get when it
// matters. NewElection / Campaign / Resign / Leader / Observe run a
// leader election on one key, the lock's token numbering the terms.
//
// # Many groups
//
// WithPartitioned talks to a partitioned deployment (docs/scaling.md):
// many ticketd clusters behind one NATS system whose subject mapping sends
// each key's requests to the key's group (partition.go). Keyed operations
// go on the key's hashed subject and Lock.Group names the group whose
// token it is; List asks every group (the count from any node's status)
// and merges their pages, failing, with the group named, if one does not
// answer. Watch is per key and unchanged.
//
// # Connecting securely
//
// Connect takes WithAuth(Auth{...}): a NATS credentials file, an nkey seed
// file, or a user and password; the CA of the server's TLS certificate and
// a client certificate; the inbox prefix the user's subscribe permission
// names, so that no other user can read its replies. The ticketd CLI takes
// the same settings as --nats-* flags. A server with an access list answers
// what the identity NATS authenticated may not do with ErrPermissionDenied.
//
// A request the NATS server itself refuses (the user may not publish on
// the subject, or may not subscribe to its reply inbox) is
// ErrPermissionDenied at once, naming the subject (permissions.go), not a
// reply timeout: a refused publish reached no node, and the reply inbox
// is checked before the first request is sent, so nothing is sent on an
// inbox the server refused. For this New wraps the connection's
// asynchronous error handler.
//
// # Errors
//
// Every request failure is an *Error carrying the stable code
// (CodeOf(err)), the operation and the key. errors.Is matches the sentinel
// of its code: ErrHeld, ErrNotFound, ErrTimeout, ErrDenied,
// ErrInvalidArgument, ErrMalformed, ErrTooLarge, ErrControlRefused,
// ErrPermissionDenied, ErrResourceExhausted, ErrInternal, ErrIndeterminate,
// ErrGrantEnded, ErrUnsupported, and ErrUnavailable, which also matches
// the other retryable codes (ErrNotLeader, ErrShuttingDown). When the SDK
// gave up retrying because the context ended, the error also matches
// context.Canceled or context.DeadlineExceeded. A context that was done
// before anything was sent gives the context error, wrapped, with no code.
// A code unknown to this SDK (a newer server) gives an *Error with that
// code, matching no sentinel.
//
// Only ErrIndeterminate leaves the outcome unknown. ErrInternal and
// unknown codes say nothing either way; treat them like ErrIndeterminate.
// Every other error means the request changed nothing.
//
// # Retry semantics
//
// A request is sent again (a fresh NATS request with a new reply inbox,
// after an exponential backoff with jitter, see WithRetryBackoff) when the
// previous attempt certainly had no effect, and an acquire also when its
// outcome is unknown, since it carries a request_id (below):
//
//	failure                                    acquire          release          get, status
//	nats.ErrNoResponders (no node, no leader,  retry            retry            retry
//	  or the leader a follower forwarded to
//	  is gone; status tells which: the error
//	  says "no leader" when no node knows one)
//	NATS permissions violation on the          ErrPermissionDenied at once, never retried
//	  publish or the reply inbox
//	reply code not_leader, unavailable,        retry            retry            retry
//	  shutting_down (Code.Retryable)
//	not connected / reconnect buffer full      retry            retry            retry
//	  (nothing was published)
//	no reply (timeout, ctx done, disconnect    retry, same id   ErrIndeterminate retry
//	  after publishing)
//	unreadable reply                           retry, same id   ErrIndeterminate ErrMalformed
//	reply code indeterminate or internal       retry, same id   ErrIndeterminate (n/a)
//	reply code grant_ended (acquire's own id)  retry, new id    (n/a)            (n/a)
//	reply code unsupported (acquire's own id)  retry, no id     (n/a)            (n/a)
//	reply code timeout                         ErrTimeout (nothing granted)
//	reply code resource_exhausted              ErrResourceExhausted: a cluster limit
//	  (lock table, identity quota, waiter queue, leader's disk); nothing
//	  changed; not retried, since an immediate retry meets the same limit
//	any other reply code                       returned as is, never retried
//
// Retries stop when the context is done, or, for a context without a
// deadline, when the retry budget (WithRetryBudget) is spent; the error is
// then the last retryable failure (matching ErrUnavailable) joined with
// the reason.
//
// Every Acquire carries a request_id (docs/protocol.md §5.1): a random one
// of its own, or WithRequestID's. The cluster records which grant a
// request id produced (replicated, scoped to the identity), so an attempt
// whose reply did not arrive is sent again with the same id, to whichever
// node leads, until the context ends: a repeat is answered with the grant
// it made (the same token and fence; Lock.Repeated, Deadline counted from
// this call's first attempt with its own id, or from the lease the leader
// reports left for WithRequestID's), never a second grant. An attempt still
// waiting in the key's queue on the leader is taken over by its retry. If
// the repeat finds that grant ended (released or expired: the SDK, or the
// leader's lost-reply rule, released a grant nobody received),
// grant_ended, Acquire knows none of its replies arrived, so the token
// was never used: it acquires again with a new id (at most 8 ids per
// call). Acquire therefore returns ErrIndeterminate only when its context
// (or, without a deadline, the retry budget) ends while an attempt's
// outcome is unknown and the leader cannot settle it: Acquire then sends
// a withdraw with the request id (within about 2 s, like the withdrawal of
// a waiting acquire), which releases a grant of the request it never
// received or says none was made, and returns the context's error without
// a code ("gave up"; nothing held). A definite answer before the end (held,
// timeout, a grant) settles it too; but when it answers a retry (more than
// one attempt was sent), an earlier attempt may still be on its way to the
// leader, so a held or timeout answer is followed by the same withdraw
// before Acquire returns it: from cluster version 6 the leader records the
// request as settled and refuses any later attempt of it (ErrIndeterminate
// if that withdraw fails). With WithRequestID the caller may have used an earlier
// grant of that id (an earlier process), so ErrGrantEnded is returned
// instead, with Error.Token. Against a cluster below version 3 (the
// server answers unsupported, nothing changed) Acquire sends its request
// again without an id, and then an acquire whose reply did not arrive is
// ErrIndeterminate at once, as before: if the grant was applied after the
// deadline the request declared (timeout_ms), the leader releases it
// itself; otherwise it expires within its lease.
//
// A release whose reply did not arrive is ErrIndeterminate too, but the
// caller may simply call Release again: releasing with the same token
// twice is harmless (the second yields ErrNotFound).
//
// Get and Status are read-only, so a lost reply is retried like the
// rest. Renew follows the release column (a lost reply is
// ErrIndeterminate and keeps the earlier deadline; renewing again is
// harmless), List the get column.
//
// # Timeouts
//
// A request waits WithRequestTimeout for its reply. An acquire with
// WithWait(w) waits w plus the request timeout, and declares to the
// server, as timeout_ms, slightly less than the time the SDK will actually
// wait (never less than wait_ms): the server then releases a grant that
// could only be applied after the SDK stopped listening. A context
// deadline that comes earlier shortens both, and the wait if needed.
//
// # The Lock deadline rule
//
// Acquire records the time just before it sends the request that
// succeeds; Lock.Deadline is that time plus the granted lease, on the
// monotonic clock. (A repeated grant, made for an earlier attempt with the
// same request id, counts from that request id's first attempt, or from
// the lease the leader says is left, whichever is later; with
// WithRequestID's id, which an earlier process may have sent, only from
// the lease left.) The server's
// lease cannot have started before that send, so until Deadline the lock
// is still yours (only a committed Expire
// or Release removes a lock, and the leader never expires a lock before
// its lease has passed on its own clock). A confirmed renewal moves
// Deadline the same way: its send time plus the lease it returned.
// After Deadline the holder must
// assume it has lost the lock: stop writing to the protected resource.
// Check Lock.Valid or Lock.Remaining before each protected step, and
// always pass Lock.Token to the resource, which must reject any token
// lower than the highest it has accepted: that, not the deadline, is what
// stops a paused or partitioned old holder. Time queued with WithWait
// counts against Deadline, so choose a lease comfortably longer than the
// work, and check Valid right after a waiting Acquire returns.
package sdk
