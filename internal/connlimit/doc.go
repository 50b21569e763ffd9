// Package connlimit bounds the connections a listener holds for parties
// that have proved nothing yet, so that a flood of idle connections, from
// one address or from many, cannot keep a legitimate caller out.
//
// # What it owns
//
// Table: the connections of one listener, counted per source address and
// overall. A new connection always finds room by closing the oldest one
// that may be evicted (one not yet authenticated or idle, as the owner
// says), from its own source when that source is at its limit, else from
// the whole table when that is full. It is refused only when nothing may
// be evicted. Sources the owner trusts (a cluster's member addresses) can
// be admitted as reserved: they count against their per-source limit but
// not against the overall one, and a connection from any other source
// never evicts them.
//
// Oldest first is what makes a flood harmless: a newcomer that completes
// its handshake within the time it takes the flood to open Total (or
// PerSource) newer connections stays, however many sources the flood
// has, and idle connections are the first to go.
//
// # What it does not own
//
// Accepting, timeouts and handshakes stay with the listener's owner
// (transports/peer, control), which says when a connection is in service
// (Hold), idle again (Release) or gone (Done).
package connlimit
