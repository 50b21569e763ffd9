// Package fencehttp is net/http middleware for a resource protected by a
// ticketd lock: a request carries its holder's fence in the Ticketd-Fence
// header; the middleware verifies it and refuses a former holder.
//
// # What a request gets
//
//   - no header: 428 fence_missing (or, with AllowUnfenced, the handler
//     runs with no fence in the context);
//   - a malformed fence, two headers, a version it does not know: 400;
//   - a forged fence, one signed by an untrusted key, another cluster's,
//     or (WithKey) one for another lock key: 403;
//   - a token below the highest accepted for its key: 409, the body
//     naming the current token;
//   - otherwise the token advances the Store and the handler runs, the
//     verified fence in the request's context (FromContext).
//
// Pass WithKey unless every fence of the cluster may write everything
// the middleware guards: a fence proves its own key's grant, so without
// it the holder of any lock (one taken just for this) passes.
//
// Every refusal has a JSON body {"code","message"} (plus "key", "token"
// and "current" for fence_stale) with the stable codes of package fence;
// the handler is not called.
//
// # Atomic check and write
//
// With a Store, the middleware holds a per-key lock from the Advance
// until the handler returns, so within this process a request with a
// lower token can never write after one with a higher token (it waits,
// then is refused). That is enough for a resource served by one process.
// A resource served by several processes must make the check part of the
// write itself: pass a nil Store (the middleware then only verifies) and
// call fencepg.Advance in the transaction of the write, answering its
// error with WriteError.
//
// # What it owns
//
// Middleware, its options, FromContext, WriteError (the code-to-status
// table) and the per-key lock (keylock.go), whose entries exist only
// while requests of the key are in flight.
//
// # What it does not own
//
// Verification and the highest-token rule (package fence), stores
// (fence.MemoryStore, fencepg.Store), and what the handler writes.
package fencehttp
