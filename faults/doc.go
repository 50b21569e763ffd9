// Package faults is ticketd's Jepsen-style fault harness: it runs a
// cluster under crashes, partitions, pauses and clock jumps while many SDK
// clients take, use and release locks, records every operation, and checks
// the history for safety violations.
//
// # Running it
//
// The default suite runs a short version of both drivers (about two
// minutes, with or without -race):
//
//	go test ./faults/                 # in-process + process-level, 2 rounds x 12s each, a wipe, storage faults, sessions
//	go test -race ./faults/           # what CI runs (~125s)
//	go test -short ./faults/          # in-process only, 1 round of 7s (~12s)
//
// The long run is opt-in:
//
//	TICKETD_FAULTS_LONG=1 TICKETD_FAULTS_DURATION=10m go test -run 'Test(InProcess|Process)Faults' -timeout 0 -v ./faults/
//
// DURATION is the workload time of each of the two tests (rounds of 30s,
// 10 clients, 4 keys), so the command above runs about 20 minutes. Other
// variables:
//
//	TICKETD_FAULTS_NODES=5       5 nodes instead of 3 (adds bridge partitions)
//	TICKETD_FAULTS_CONTROL=1     in-process cluster formed through the control plane, adds wipe-node (always on in long mode)
//	TICKETD_FAULTS_SEED=N        reproduce a fault schedule and workload mix (timing still varies)
//	TICKETD_FAULTS_OUT=DIR       where artifacts go (default $TMPDIR/ticketd-faults); setting it keeps them
//	TICKETD_FAULTS_KEEP=1        keep the artifacts of a passing run (the long run always keeps them)
//	TICKETD_FAULTS_REPLAY=FILE   TestReplay re-checks a history.json and visualizes every key
//	TICKETD_FAULTS_KINDS=N       limit of the semaphore key (default 3; 0: no semaphore and read/write keys)
//
// Every run logs its seed and artifact directory first and a report last:
// faults injected by kind; operations by kind as ok, definite refusals
// (held, timeout, not_found), fail (certainly no effect) and
// indeterminate, with error codes; resource writes accepted and fenced;
// porcupine verdicts per key and round; lease overlaps excused by clock
// jumps; notable legal events; and every violation with the operations
// that show it. On failure (always in long mode) the directory holds
// history.json (every operation, write, fault and clock jump, replayable
// with TestReplay), summary.txt, porcupine visualizations (HTML) of every
// key of a round with a violation, and the node logs.
//
// # Drivers and faults
//
// The in-process driver starts 3 or 5 daemon.Start nodes on 127.0.0.1
// (embedded NATS, routed together; small snapshot intervals so restarted
// nodes catch up from snapshots) with internal/testkit/testcluster, the
// builder the daemon tests use; the faults stay here. Its faults: crash and restart of the
// leader, a follower or a majority (daemon.Close: a clean stop, the
// process driver does the dirty one), and the planned stop of the leader
// (stop-leader: leadership handed over first, as on SIGTERM); partitions through
// peer.Transport.SetFilter (isolate the leader or a follower, split into a
// minority and a majority, one-way loss of a node's outbound or inbound
// raft traffic, bridge with 5 nodes, flaky links dropping 30% of
// messages); and jumps of a node's lease clock (daemon.Options.Now): forward
// jumps of 1/4 to 3/2 of the longest lease, backward jumps of 1/8 to 1/2,
// and a forward jump of the leader immediately followed by its isolation;
// and storage faults (disk.go), through a testkit.FaultFS under each
// node's store (Pebble's vfs/errorfs): disk-fsync (the node's log fsyncs
// fail; it must stop, fail-stop, and is restarted on a healthy disk),
// disk-full (writes fail with ENOSPC and free space is 0 for the hold: the
// ballast is spent, the alarm refuses grants there and a leader hands
// leadership over) and disk-full-restart (a node stopped, its disk full,
// started again: the start must be refused at once with ErrNoSpace, then
// it starts on a freed disk). Each checks its own outcome (checkers
// disk-fsync and disk-full-restart) besides every checker below.
// TestInProcessStorageFaults (part of the default run, ~12s) injects only
// these.
//
// In control mode (TICKETD_FAULTS_CONTROL=1, always in long mode) the
// in-process cluster is formed through the control plane instead of a
// static member list: node 1 starts with a bootstrap credential and is
// bootstrapped (/v1/bootstrap), every other node joins with a one-time
// credential (/v1/join-credentials, Config.Join), and raft ids are the
// ones the cluster issues (peer filters map them to node slots). This
// adds the fault wipe-node: the leader or a follower is closed, its data
// directory deleted, and a fresh node started in its slot (new data
// directory, new peer and control addresses, the same NATS addresses so
// the clients' URL lists stay valid) with Config.Join and
// Config.Replace=<old id>, so it gets a new NodeID and incarnation; the
// harness polls /v1/replacements/complete until the learner has caught
// up, waits until the raft voters are exactly the slots' current ids, and
// from then on crashes, partitions and status reads of the slot address
// the new node. Checked by the fault itself (checker "wipe-node"): the
// replacement completes within 30s, the leader's state machine refuses
// the wiped identity (core.Machine.CheckIdentity of the old NodeID and
// incarnation fails) and accepts the new one; the workload keeps running
// throughout, so every checker below covers the wipe, and the round's
// convergence check includes the new node's applied index and digest.
// TestInProcessWipe (part of the default run, ~9s) forms such a cluster
// and injects exactly one wipe under the workload.
//
// Sessions and lock-delays (issue 24) are checked apart from the porcupine
// model, whose lock model has leases: TestInProcessSessions (part of the
// default run without -short, ~13s) keeps locks in sessions (one holder
// dying now and then) while contenders try the same keys and the leader
// is crashed four times, and checks that a session is never ended on the
// server before the holder's local deadline, and that no key is granted
// again before its ended session's last promised deadline plus its
// lock-delay (sessions_test.go says why both are sound).
//
// The process-level driver builds ./cmd/ticketd once and runs real `ticketd
// serve` processes. Every raft link a -> b goes through a TCP proxy of the
// harness (node a's --initial-cluster names the proxy as b's address; the
// peer transport uses one connection per direction), so partitions and
// one-way loss are proxies that drop (close and refuse) or blackhole
// (accept and discard, then close on heal). Its faults: kill -9 of the
// leader, a follower, a majority or every node, each restarted on its
// data; SIGTERM of the leader (stop-leader: it hands leadership over,
// then exits), restarted likewise; SIGSTOP/SIGCONT of the leader or a
// follower; and the partitions
// above. NATS routes are not proxied: clients always reach some node, and
// only raft traffic is cut.
//
// Faults come one at a time, each held for 2 to 8 election timeouts
// (pauses from 1) and healed before the next, with 2 to 6 election
// timeouts between them.
//
// # Workload
//
// Clients (8 by default) each have their own SDK connection to all nodes
// (1s request timeout, fast NATS failover) and loop, bounded in count and
// time: a get (25%), or a cycle of acquire (try-only or waiting up to 1s,
// lease 300ms to 2s) and, if granted, writes to the fenced resource while
// the lock is valid, sometimes a get, then a release (retried once if
// indeterminate), or holding past the lease and letting it expire. A
// third of the granted cycles renew instead: they hold the lock for 1.5
// to 3 of its leases (never past the round's end), renew every third of
// the lease (three times in four Lock.Renew, keeping the lock's lease and
// moving Lock.Deadline on a confirmed renewal; once in four
// Client.Renew asking for 1.25 to 2 times the granted lease, which does
// not move Lock.Deadline until the next Lock.Renew brings the longer
// lease back), write to the fenced resource between renewals only while
// Lock.Valid(), keep renewing after that deadline passed (a confirmed
// renewal then shows the lock was still held, and writes resume), stop
// renewing once a renewal is refused (not_found), and then release, or
// once in five let the lease run out. Each renewal is recorded (call,
// return, token, requested lease, outcome, and on ok the deadline it
// promised the holder: the Lock.Deadline it moved to, or the
// Renewal.Deadline of a Client.Renew). Every operation has a context
// deadline (its wait plus 1.5s). A run is a
// number of rounds; after each round every fault is healed, a get of every
// key is recorded at once, the keys are drained (polled until free), and
// the replicas must converge to the same applied index and lock-table
// digest. Each round is checked on its own, starting with all keys free.
//
// Beside the mutex keys every run (both drivers, short and long) has a
// counting semaphore key (limit 3; TICKETD_FAULTS_KINDS) and a read/write
// key (issue 25; kinds_workload.go), worked by the same clients with the
// same cycles, renewals, gets and releases: the acquire names the limit,
// or on the read/write key is shared two times in three; exclusive
// requests there always wait (1s to twice the longest lease), so they see
// the shared holders leave and queue the shared requests behind them. A
// get of such a key records every holder and the mode. Their holders use
// a guarded resource instead of the fenced one: from a holder's first use
// until it leaves (before its release) or its SDK deadline passes, and a
// use that would make more users valid by their deadlines than the key
// admits is refused and recorded. Before the first round the harness
// waits until the cluster serves semaphores (a new cluster answers
// unsupported until its leader has raised the cluster version to 5).
// (This assumes an operation of a round cannot take effect after the next
// round started: by then the cluster is healed, every lease has run out
// and the replicas agree.)
//
// # Checkers
//
// Outcomes: success, held, timeout and not_found (of a release or a
// renew) are definite answers; a retryable code after the SDK gave up (or
// nothing sent) is "fail" and certainly changed nothing (left out of the
// model); indeterminate, internal, unknown codes and codes an operation
// does not document (a release or renew answered "timeout") are unknown:
// the operation may take effect at any time after its call (porcupine:
// return time infinity). A failed get is left out. An acquire abandoned by
// its context ends without a code when the SDK settled it: a waiting one
// withdrawn (any grant that raced the withdrawal released), or one whose
// last attempt's outcome was unknown settled by its request_id (a grant it
// never received released, or none made); it is modelled as a timeout (a
// grant may have existed meanwhile), code gave_up. The SDK retries an
// acquire whose reply was lost with the same request_id, so the history
// holds one operation per Acquire call, whatever its attempts.
//
// Renewals: a confirmed renewal promises the holder the lock until its
// new deadline (the renew request's send time plus the lease in the
// reply; the server re-arms the lease no earlier), less every forward
// clock jump since the renew call. The grant's promise stands beside it,
// and every checker below that bounds a lease uses the later of the two.
// An unknown renewal promises nothing: it may or may not have lengthened
// the lease (a longer-lived lock is always allowed), no checker counts on
// it, and the SDK does not move the holder's deadline for it, so the
// resource writes stay within what was confirmed. A renewal never makes a
// released or expired lock held again (core refuses a Renew of a missing
// or different token).
//
// Linearizability (porcupine, per key): a nondeterministic lock model whose
// state is free, held by a known token with the holder's lease window, or
// held by a "phantom" grant nobody received. acquire ok needs a free key;
// held needs a held key (but see reservations below); release ok(T) needs T held; release not_found
// needs T not held; get shows exactly the holder; renew ok(T) needs T
// held (by a known grant) and records its promise; renew not_found needs
// T not held; unknown renewals are left out of the porcupine history (in
// the model they change nothing, so they would only cost search). An unknown acquire may
// leave a phantom; so may an acquire answered "timeout", because the
// server answers timeout for a grant applied after the requester's
// deadline, which it then releases itself. A phantom may vanish at any time
// (lost-reply release or expiry) and its token is learned from the first
// get that shows a token no acquire returned. Leases end by a committed
// Expire at a time nobody observes, so expiry is a spontaneous transition:
// a known lock may expire only if the operation being linearized can be
// placed at or after its SDK deadline (send time of the successful
// attempt + lease, Lock.Deadline; or the promise of its last confirmed
// renewal linearized before, if later) minus every forward clock jump
// since it was sent; the expiry then constrains every later operation to that
// time, so an indeterminate operation (which may linearize arbitrarily
// late) cannot be used to expire a lease early.
//
// Reservations: the leader answers a try-acquire with held while the key
// is free in the state machine but reserved for another acquire whose
// Grant is being committed (SPEC §3: no Grant is proposed for a key that
// is held or pending). Under message loss that lasts hundreds of
// milliseconds, and a linearizable get meanwhile says free, so held is not
// an observation of the lock while another client's acquire is in flight;
// such answers are left out of the model (counted in the report), and a
// held answer with no other acquire in flight must still be explained by
// a holder. A violation's message carries the shortest non-linearizable
// prefix found (by call time) and its last operations.
//
// Tokens: tokens of granted acquires are unique per key; an acquire's
// token is above every token observed (granted or shown by a get) by
// operations that completed before it was invoked; a get never shows a
// token older than one observed before it started, and no renewal of such
// an older token is confirmed.
//
// Acknowledged operations are not lost: after a release is acknowledged,
// no get invoked later shows its token and no renewal invoked later is
// confirmed; a grant is visible to every get invoked after its
// acknowledgement that completes before its lease can have ended (by the
// grant and the renewals confirmed before the get was invoked, less
// forward jumps), unless a release of its token was invoked.
//
// Renewals on their own (renew-refused, renew-after-end; the
// linearizability check covers both as well, but these cannot time out):
// a renewal answered not_found while the lock cannot have ended (as
// above, and no release of it invoked) is a lost lock; a renewal
// confirmed after an operation that completed before it showed the lock
// ended (a get invoked after the grant that saw the key free or held by
// another token, a renewal of it refused) revived an ended lock.
//
// Mutual exclusion and the fenced resource: a holder may act from its
// acquire's acknowledgement to the latest deadline it was promised (its
// grant's, or a confirmed renewal's; or its release call if earlier). Two
// such windows of different tokens on one key must not overlap: the other
// grant must come after every confirmed renewal's promise ended. (A
// confirmed renewal counts whenever it was invoked: one applied after
// another grant would have found the lock gone.) The
// resource remembers the highest token that wrote to a key and rejects
// lower ones; holders write only while valid, checked under the resource's
// mutex. A rejected write of a valid holder means a higher token was
// granted while it was valid.
//
// Clock jumps: a forward jump of the leader's lease clock makes it expire
// leases early in real time, before the holder's SDK deadline; SPEC §4 does
// not promise otherwise ("clocks never decide state" is about replica
// agreement, and Lock.Deadline assumes the leader's clock runs at real
// speed). So an early expiry, an overlap of validity windows, or a fenced
// write is accepted when, and only when, the forward jumps between the
// lock's send time and the observation add up to at least the time cut
// from its lease (from the grant's and from every confirmed renewal's,
// each counting only the jumps after it: a renewal re-arms the lease on
// the leader's clock, so earlier jumps do not shorten it); the overlap is
// then reported as excused, and fencing is
// what must still hold: tokens keep increasing (the token checker does not
// excuse anything), so the newer holder's writes win and the stale
// holder's are rejected (counted as fenced). Backward jumps lengthen
// leases, which no checker minds (the drain waits for them).
// TestCheckersCatchAnUnrecordedClockJump shows the checkers catch the
// same overlap when the jump is not recorded, and
// TestCheckersCatchAnUnhonouredRenewal the same for a lock kept only by
// its renewal (a grant of the key to another client before the renewed
// deadline, with the jump unrecorded, is a violation; with the renew
// operations taken out of the history it is not). TestModelRenewals
// holds hand-made renewal histories: a grant before the renewed deadline
// is caught, after it (or excused by a later forward jump) it is not,
// jumps before the renewal excuse nothing, an unknown renewal extends
// nothing, refusals and revivals are caught.
//
// Semaphores and read/write locks (issue 25; kinds_model.go,
// kinds_check.go): a key whose acquires name a kind (Op.Lock: a semaphore
// of Op.Limit, or a read/write lock whose acquires are shared or
// exclusive) is checked by the same acked-grant, acked-release and
// renewal checkers per holder token (a get shows every holder,
// Op.Holders), and in place of the mutex ones by: tokens (unique, and
// each grant above every token observed before its call; a get's older
// holders beside newer ones are legal); kinds-exclusion (at the start of
// every validity window, no more holders valid by their SDK deadlines than
// the key admits: N for a semaphore, and beside an exclusive holder no
// other; holders a forward jump can have cut short are excused); fifo
// (two grants A and B of a key where A's successful attempt was sent
// 250ms before B was invoked, and no fault was under way from 250ms
// before that send to 2s after both returned, so one leader queued both:
// A's token must be the lower one; this includes a shared request
// granted before an earlier exclusive waiter; CheckResult.FIFOPairs
// counts the pairs judged); kinds-resource (the workload's guarded
// resource of such keys refused a use because holders valid by their
// deadlines filled the key); and linearizability under the kinds model,
// the lock model with a set of holders: a grant needs room (fewer than N;
// shared: no exclusive holder; exclusive: none) and a token above every
// token granted before it in the linearization (so an exclusive grant's
// token is above every shared one granted before it), a get must show
// exactly the holders and the mode, any holders whose leases can have
// ended may expire together, any phantoms may vanish. Held answers given
// with room while another client's acquire was in flight (a reservation,
// or FIFO: a shared try behind a waiting exclusive acquire) are left out
// by the lenient pass, as for mutexes. TestKindsLegalHistories and
// TestKindsCatchesViolations hold hand-made histories of both kinds: each
// illegal one must be refused by the checkers it names.
// TestKindsCheckersCatchBrokenHistories records a scripted run on a real
// node (a semaphore of 2 filled and passed on; two shared holders, an
// exclusive waiter, a shared waiter behind it), which passes every
// checker, and breaks copies of it: a third holder of the semaphore
// (kinds-exclusion, linearizability), a shared hold made exclusive
// (kinds-exclusion, linearizability), two grants' tokens swapped so one
// falls (tokens, linearizability), the two waiters' tokens swapped
// (fifo, linearizability); TestKindsResourceRefusesBeyondTheKey shows the
// guarded resource refusing a holder beyond what it takes the key to
// admit, and kinds-resource reporting it.
//
// What these checks see, and what not: the counts are of holders valid
// by their SDK deadlines (grant send time plus lease, or a confirmed
// renewal's), which the server's lease outlives without clock jumps; a
// holder the server lost early is caught only if a get, a refused
// renewal or a grant beyond the limit shows it. "Shared beside
// exclusive" and "N+1 holders" are seen both in the client-side
// validity windows (kinds-exclusion, the guarded resource) and in what
// gets show (the kinds model). Tokens are checked per key across all
// grants and rounds; a get legally shows older holders beside newer
// ones. FIFO is judged only for pairs of grants one leader must have
// queued in order: the earlier request's successful attempt sent 250ms
// before the later one was invoked, and no fault from 250ms before it to
// 2s after both were granted, so under the default runs' nearly
// continuous faults few pairs qualify (the report counts them); FIFO
// across a leader change is not promised (a new leader has a new queue)
// and not checked, nor is the order of two requests that reached the
// leader within 250ms of each other, nor which of a shared try's held
// answers came from FIFO rather than a full key (both are left to the
// lenient pass).
//
// Sessions (issue 24; sessions_workload.go, sessions_check.go): with
// Config.Sessions (the process driver: TestProcessFaults and
// TestProcessSessions) holders keep keys in sessions and close them or
// die, every crash-leader first kills one holder's client, contenders
// try the keys, and a poller records every node's term and role.
// CheckSessions reports a keepalive refused before the session's local
// deadline (session-lost), a grant of a session's key before that
// deadline plus the lock-delay (session-exclusion), and before the full
// TTL a leader that took over while the session lived owes it, plus the
// lock-delay (session-rearm; the takeover bounded from below by the
// status answers). All on the harness's monotonic clock, assuming the
// servers' clocks run at the real rate; README.md says what the checks
// cannot see. TestInProcessSessions checks the same in process.
//
// Liveness is checked loosely: a leader within 30s of healing, every key
// free within the longest lease plus all backward jumps plus 15s, replicas
// converged within 30s, and no node exiting on its own.
//
// # Bugs this harness found
//
// Both fixed in be9c3bb; the tests stay as regressions. Under -race every
// in-process run tripped a data race in transports/natsapi, which answered
// nats micro requests from a goroutine after micro's handler had returned
// (TestInProcessFaults is the regression test). The clock-jump fault
// showed natsapi turning the injected lease clock into real-time context
// deadlines, so a node whose lease clock was behind abandoned queue waits
// at once and answered forwarded acquires with indeterminate
// (TestLeaseClockOnlyTimesLeases).
//
// Fixed after the harness found it: the context given to daemon.Start, if
// it ended after start-up, silently closed the node's raft peer transport
// (TestStartContextDoesNotBoundPeerTransport).
//
// Fixed after the wipe-node fault found it: a learner admitted after the
// leader's latest snapshot could not catch up once the log it needed was
// compacted. The leader sent its stored snapshot, whose ConfState
// predated the learner; etcd raft refuses such a snapshot ("N attempted
// to restore snapshot but it is not in the ConfState ...") and the
// replacement stayed not_caught_up for 8-17 s, or for ever without write
// traffic. raftstore now takes a fresh snapshot whenever a membership
// change applies; a 90 s control-mode run then completed 5 wipes in
// 0.2-1.2 s each.
//
// Fixed in 49d3b9b and re-verified by the same long run, found by
// the process driver's pause-leader fault once renewals ran: lockservice.Renew answers its refusals (not held with that token,
// lease ran out) from the leader's local lease timers without confirming
// leadership, so a leader resumed after SIGSTOP, before it learned of the
// new term, answered not_found for a lock the new leader had granted to
// exactly that token and renewed (checkers renew-refused and
// linearizability; the history is a case of TestModelRenewals). Not
// unsafe, the holder only stops early, but a definite wrong answer. The
// fix (lockservice) confirms leadership with a ReadIndex before a refusal.
//
// Fixed (cluster version 6), found by the 10-minute process run with the
// semaphore and read/write keys: an acquire attempt that sat in a paused
// node's NATS server was granted when the node resumed, after the acquire
// was already answered held by a later attempt; the leader took the stale
// attempt as a new request and granted it, to nobody, for its whole
// lease. The SDK now settles such a request (a withdraw by request_id,
// applied as core.Settle), and the stale attempt is answered grant_ended
// (TestStaleAttemptIsNotGrantedLater, run by default).
//
// # Not covered
//
// Membership changes other than the replacement of a wiped node (growing
// or shrinking the cluster, aborted replacements, retiring), and wipes in
// the process-level driver; clock jumps of real processes (there is
// no clock hook in the binary, and the kernel's monotonic clock cannot be
// stepped per process); disk faults beyond the storage faults above
// (silently lost fsyncs, corruption); NATS-level partitions between
// clients and nodes or between the embedded NATS servers; plugins. Of
// issue 12 only renewals are exercised: the SDK's KeepAlive, Lost and
// Context, withdrawn waits, lock exec, list, watch and Election are not
// (the workload calls Lock.Renew and Client.Renew itself, so the checker
// sees every renewal).
package faults
