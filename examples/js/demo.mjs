// Takes, waits for, renews and releases a ticketd lock, printing one JSON
// line per step:  node demo.mjs [nats://127.0.0.1:4222] [--renew] [--key K]
import { connect } from "nats";
import { acquire, get, openSession, TicketdError } from "./lock.mjs";

const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const value = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const url = args.find((a) => a.startsWith("nats://")) ?? process.env.TICKETD_NATS ?? "nats://127.0.0.1:4222";
const key = value("--key", "js/demo");
const print = (step, fields = {}) => console.log(JSON.stringify({ step, ...fields }));
const expect = (cond, what) => {
  if (!cond) {
    throw new Error(`unexpected: ${what}`);
  }
};

const nc = await connect({ servers: url, name: "ticketd-js-example" });
try {
  // Take the lock, try-only.
  const a = await acquire(nc, key, { owner: "js-a", leaseMs: 10000 });
  print("acquired", { key: a.key, token: a.token, owner: a.owner, remaining_ms: Math.round(a.remainingMs()) });

  // A second try-only acquire is refused: the key is held.
  try {
    await acquire(nc, key, { owner: "js-b", leaseMs: 10000 });
    expect(false, "a second acquire of a held key succeeded");
  } catch (err) {
    expect(err instanceof TicketdError && err.code === "held", `second acquire failed with ${err}`);
    print("held", { code: err.code });
  }

  // Who holds it (the owner is information, the token is the proof).
  const h = await get(nc, key);
  expect(h.held && h.token === a.token, `get says ${JSON.stringify(h)}`);
  print("get", { held: h.held, token: h.token, owner: h.owner, remaining_ms: h.remaining_ms });

  if (flag("--renew")) {
    const before = a.deadline;
    await a.renew(20000);
    expect(a.deadline > before, "renew did not move the deadline");
    print("renewed", { token: a.token, remaining_ms: Math.round(a.remainingMs()) });
  }

  // Wait for it: b queues behind a, a releases, b gets the next token.
  const waiting = acquire(nc, key, { owner: "js-b", leaseMs: 10000, waitMs: 5000 });
  await new Promise((r) => setTimeout(r, 200));
  expect(await a.release(), "release of a held lock said not found");
  print("released", { token: a.token });
  const b = await waiting;
  expect(b.token > a.token, `the waiter got token ${b.token}, not above ${a.token}`);
  print("waited", { token: b.token, owner: b.owner });

  // Release it; a duplicate release is harmless and finds nothing.
  expect(await b.release(), "release of the waiter's lock said not found");
  expect((await b.release()) === false, "a second release found a lock");
  const after = await get(nc, key);
  expect(!after.held, `get after release says ${JSON.stringify(after)}`);
  print("done", { held: after.held });

  // A session: two locks, one keepalive, released together by the close.
  let lost = false;
  const s = await openSession(nc, { ttlMs: 2000, onLost: () => (lost = true) });
  const k1 = await s.acquire(`${key}/s1`, { owner: "js-s" });
  const k2 = await s.acquire(`${key}/s2`, { owner: "js-s" });
  const hs = await get(nc, k1.key);
  expect(hs.held && hs.session === s.id && !hs.lease_ms, `get of a session lock says ${JSON.stringify(hs)}`);
  print("session", { session: s.id, tokens: [k1.token, k2.token] });
  await new Promise((r) => setTimeout(r, 3000)); // longer than the TTL: only the keepalive holds them
  expect(!lost && s.keepalives >= 2, `session lost ${lost} after ${s.keepalives} keepalives`);
  expect((await get(nc, k2.key)).token === k2.token, "a kept-alive session lost its lock");
  const released = await s.close();
  expect(released === 2, `close released ${released}`);
  expect(!(await get(nc, k1.key)).held, "a lock of the closed session is still held");
  print("session_closed", { released, keepalives: s.keepalives });

  // A counting semaphore of 2 (§12): two holders, each with its own token;
  // a third is refused until one leaves, and get shows every holder.
  const pool = `${key}/pool`;
  const p1 = await acquire(nc, pool, { owner: "js-p1", limit: 2 });
  const p2 = await acquire(nc, pool, { owner: "js-p2", limit: 2 });
  try {
    await acquire(nc, pool, { owner: "js-p3", limit: 2 });
    expect(false, "a third slot of a semaphore of 2 was granted");
  } catch (err) {
    expect(err instanceof TicketdError && err.code === "held", `third slot failed with ${err}`);
  }
  const hp = await get(nc, pool);
  expect(hp.limit === 2 && hp.holders?.length === 2 && hp.holders[1].token === p2.token, `get of the semaphore says ${JSON.stringify(hp)}`);
  expect(await p1.release(), "release of a slot said not found");
  const p3 = await acquire(nc, pool, { owner: "js-p3", limit: 2 });
  expect(p3.token > p2.token, `the freed slot got token ${p3.token}, not above ${p2.token}`);
  print("semaphore", { limit: hp.limit, holders: hp.holders.map((h) => h.token), freed_slot_token: p3.token });
  await p2.release();
  await p3.release();

  // A read/write lock (§12): readers share it; a writer waits for them, and
  // a reader that comes after the waiting writer is refused (FIFO across
  // modes: the writer is not starved).
  const rw = `${key}/rw`;
  const r1 = await acquire(nc, rw, { owner: "js-r1", mode: "shared" });
  const r2 = await acquire(nc, rw, { owner: "js-r2", mode: "shared" });
  const writer = acquire(nc, rw, { owner: "js-w", waitMs: 5000 });
  await new Promise((r) => setTimeout(r, 200));
  try {
    await acquire(nc, rw, { owner: "js-r3", mode: "shared" });
    expect(false, "a reader overtook a waiting writer");
  } catch (err) {
    expect(err instanceof TicketdError && err.code === "held", `late reader failed with ${err}`);
  }
  await r1.release();
  await r2.release();
  const w = await writer;
  expect(w.token > r2.token, `the writer got token ${w.token}, not above the readers' ${r2.token}`);
  print("rwlock", { readers: [r1.token, r2.token], writer: w.token });
  await w.release();
} catch (err) {
  print("error", { message: String(err), code: err.code });
  process.exitCode = 1;
} finally {
  await nc.close();
}
