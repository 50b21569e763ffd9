// A ticketd client in plain JavaScript: one NATS request per operation,
// JSON bodies, nothing but docs/protocol.md. The subjects, fields, error
// codes and retry rules below are that page's; section numbers refer to it.
import { performance } from "node:perf_hooks";

const enc = new TextEncoder();
const dec = new TextDecoder();

// §4: codes that certainly did nothing; the same request may be sent again.
const RETRYABLE = new Set(["not_leader", "unavailable", "shutting_down"]);
// §4: retry with exponential backoff from 25 ms doubling to 1 s.
const BACKOFF_MIN_MS = 25;
const BACKOFF_MAX_MS = 1000;
// §5: the client waits slightly longer than the timeout_ms it declares.
const REPLY_SLACK_MS = 100;

/** A refusal with a stable code (§4); `indeterminate` means maybe. */
export class TicketdError extends Error {
  constructor(code, message, leader) {
    super(`${code}: ${message}`);
    this.code = code;
    this.leader = leader;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// request sends body to subject and returns the parsed reply, or throws:
// TicketdError for an error reply, the nats error otherwise (503: no
// responders, TIMEOUT: no reply). `sent` is taken just before sending.
async function request(nc, subject, body, timeoutMs) {
  const sent = performance.now();
  const m = await nc.request(subject, enc.encode(JSON.stringify(body)), { timeout: timeoutMs });
  const reply = JSON.parse(dec.decode(m.data));
  if (reply.error) {
    throw new TicketdError(reply.error.code, reply.error.message, reply.error.leader);
  }
  return { reply, sent };
}

const isNoResponders = (err) => err && err.code === "503";
const isTimeout = (err) => err && err.code === "TIMEOUT";

// withRetry repeats op on the definite failures of §4 (and on no
// responders) with backoff, until deadlineMs (performance.now()) passes.
async function withRetry(op, deadlineMs) {
  let delay = BACKOFF_MIN_MS;
  for (;;) {
    try {
      return await op();
    } catch (err) {
      const definite = isNoResponders(err) || (err instanceof TicketdError && RETRYABLE.has(err.code));
      if (!definite || performance.now() + delay > deadlineMs) {
        throw err;
      }
      await sleep(delay * (0.5 + Math.random() / 2)); // jitter
      delay = Math.min(delay * 2, BACKOFF_MAX_MS);
    }
  }
}

/**
 * Take a lock (§3 Acquire). waitMs 0 tries once (`held` if taken); more
 * waits in the key's FIFO queue (`timeout` if it stayed taken). Resolves
 * to a Lock whose `deadline` (performance.now() scale) is the last moment
 * it may be used (§7). A lost reply throws TicketdError("indeterminate"):
 * never retried (§5).
 *
 * §12 (cluster version 5): `limit` 2..1024 takes a slot of a counting
 * semaphore of that many holders; `mode: "shared"` a reader's hold of a
 * read/write lock (the default, exclusive, is the writer). Each holder
 * has its own token; every holder and waiter of a key names the same
 * limit (`invalid_argument` otherwise).
 */
export async function acquire(nc, key, { owner = "", leaseMs = 10000, waitMs = 0, retryForMs = 5000, limit = 0, mode = "" } = {}) {
  const clientWaitMs = waitMs + 3000; // how long we really wait for a reply
  const body = { key, owner, lease_ms: leaseMs, wait_ms: waitMs, timeout_ms: clientWaitMs - REPLY_SLACK_MS };
  if (limit > 1) {
    body.limit = limit;
  }
  if (mode) {
    body.mode = mode;
  }
  const { reply, sent } = await withRetry(async () => {
    try {
      return await request(nc, "ticketd.v1.lock.acquire", body, clientWaitMs);
    } catch (err) {
      if (isTimeout(err)) {
        throw new TicketdError("indeterminate", "no reply: a lock may exist and expires within its lease");
      }
      throw err;
    }
  }, performance.now() + retryForMs);
  return new Lock(nc, reply.key, reply.token, reply.owner ?? "", sent + reply.lease_ms);
}

/** Who holds key (§3 Get): {held, token, owner, remaining_ms, ...}. */
export async function get(nc, key, { timeoutMs = 5000 } = {}) {
  const deadline = performance.now() + timeoutMs;
  // Get changes nothing: a lost reply may be retried too (§5).
  return withRetry(async () => {
    try {
      return (await request(nc, "ticketd.v1.lock.get", { key }, 2000)).reply;
    } catch (err) {
      if (isTimeout(err)) {
        throw new TicketdError("unavailable", "no reply to get");
      }
      throw err;
    }
  }, deadline);
}

/** A held lock: its key, fencing token (§6) and local deadline (§7). */
export class Lock {
  constructor(nc, key, token, owner, deadline) {
    this.nc = nc;
    this.key = key;
    this.token = token;
    this.owner = owner;
    this.deadline = deadline;
  }

  /** Milliseconds left before the lock must no longer be used. */
  remainingMs() {
    return Math.max(0, this.deadline - performance.now());
  }

  /**
   * Extend the lease (§3 Renew): the deadline becomes
   * max(deadline, sent + lease_ms of the reply). `not_found` means the lock
   * is gone: stop using it. A renew without a reply changes the deadline
   * not at all, and sending it again is harmless.
   */
  async renew(leaseMs = 0) {
    const body = { key: this.key, token: this.token };
    if (leaseMs > 0) {
      body.lease_ms = leaseMs;
    }
    const stop = this.deadline; // a renew that answers after this is too late
    const { reply, sent } = await withRetry(async () => {
      try {
        return await request(this.nc, "ticketd.v1.lock.renew", body, 2000);
      } catch (err) {
        // unsupported: the cluster is being upgraded; nothing changed (§4).
        if (isTimeout(err) || (err instanceof TicketdError && err.code === "unsupported")) {
          throw new TicketdError("unavailable", err.message);
        }
        throw err;
      }
    }, stop);
    if (sent > stop) {
      throw new TicketdError("not_found", "the lease ran out before the renewal was sent");
    }
    this.deadline = Math.max(this.deadline, sent + reply.lease_ms);
    return this;
  }

  /**
   * Give the lock back (§3 Release). A release whose reply was lost is
   * sent again: a duplicate is harmless and answers not_found, which
   * counts as released.
   */
  async release({ timeoutMs = 5000 } = {}) {
    const deadline = performance.now() + timeoutMs;
    try {
      await withRetry(async () => {
        try {
          return await request(this.nc, "ticketd.v1.lock.release", { key: this.key, token: this.token }, 2000);
        } catch (err) {
          if (isTimeout(err) || (err instanceof TicketdError && err.code === "indeterminate")) {
            throw new TicketdError("unavailable", err.message); // resend the same release
          }
          throw err;
        }
      }, deadline);
    } catch (err) {
      if (err instanceof TicketdError && err.code === "not_found") {
        return false; // released already, or expired: nothing is held
      }
      throw err;
    }
    return true;
  }
}

/**
 * A session (§11): one keepalive for many locks. `openSession` opens it
 * and keeps it alive every third of its TTL; `session.deadline` is the
 * send of the last acknowledged keepalive + ttl_ms (performance.now()
 * scale), and `session.lost` is set (and `onLost` called) a margin before
 * it when keepalives stop getting through, or at once on not_found (the
 * session ended: its locks are gone). Locks taken with `session.acquire`
 * have no lease: they last until released or until the session ends.
 */
export async function openSession(nc, { ttlMs = 10000, lockDelayMs = 0, onLost = () => {} } = {}) {
  const { reply, sent } = await withRetry(async () => {
    try {
      return await request(nc, "ticketd.v1.session.open", { ttl_ms: ttlMs, lock_delay_ms: lockDelayMs }, 2000);
    } catch (err) {
      if (isTimeout(err)) {
        // A session may have been opened; nobody keeps it alive, so it
        // expires after its TTL.
        throw new TicketdError("indeterminate", "no reply to session open");
      }
      throw err;
    }
  }, performance.now() + 5000);
  return new Session(nc, reply.session, reply.ttl_ms, sent + reply.ttl_ms, onLost);
}

export class Session {
  constructor(nc, id, ttlMs, deadline, onLost) {
    this.nc = nc;
    this.id = id;
    this.ttlMs = ttlMs;
    this.deadline = deadline;
    this.lost = false;
    this.onLost = onLost;
    this.marginMs = Math.min(Math.max(ttlMs / 10, 20), 1000);
    this.keepalives = 0;
    this.timer = setTimeout(() => this.#tick(), (ttlMs - this.marginMs) / 3);
  }

  #end() {
    if (!this.lost) {
      this.lost = true;
      clearTimeout(this.timer);
      this.onLost();
    }
  }

  async #tick() {
    if (this.lost) {
      return;
    }
    if (performance.now() >= this.deadline - this.marginMs) {
      this.#end(); // no keepalive got through in time
      return;
    }
    let next = (this.ttlMs - this.marginMs) / 3;
    try {
      await this.keepalive();
    } catch (err) {
      if (err instanceof TicketdError && err.code === "not_found") {
        this.#end();
        return;
      }
      next = BACKOFF_MAX_MS / 4; // not now: try again soon, until the margin
    }
    if (!this.lost) {
      this.timer = setTimeout(() => this.#tick(), Math.max(0, Math.min(next, this.deadline - this.marginMs - performance.now())));
    }
  }

  /** One keepalive (§11); it never writes the raft log. */
  async keepalive() {
    const { reply, sent } = await request(this.nc, "ticketd.v1.session.keepalive", { session: this.id }, 2000);
    this.deadline = Math.max(this.deadline, sent + reply.ttl_ms);
    this.keepalives++;
    return this;
  }

  /** Take key in the session (§11): no lease, `lock.deadline` is the session's at the grant. */
  async acquire(key, { owner = "", waitMs = 0, retryForMs = 5000 } = {}) {
    const clientWaitMs = waitMs + 3000;
    const body = { key, owner, session: this.id, wait_ms: waitMs, timeout_ms: clientWaitMs - REPLY_SLACK_MS };
    const { reply } = await withRetry(async () => {
      try {
        return await request(this.nc, "ticketd.v1.lock.acquire", body, clientWaitMs);
      } catch (err) {
        if (isTimeout(err)) {
          throw new TicketdError("indeterminate", "no reply: a lock may exist and ends with the session");
        }
        throw err;
      }
    }, performance.now() + retryForMs);
    return new Lock(this.nc, reply.key, reply.token, reply.owner ?? "", this.deadline);
  }

  /** Close the session: every lock of it is released in one command; resolves to how many. */
  async close() {
    this.lost = true;
    clearTimeout(this.timer);
    const { reply } = await withRetry(
      () => request(this.nc, "ticketd.v1.session.close", { session: this.id }, 2000),
      performance.now() + 5000,
    );
    return reply.released;
  }
}
