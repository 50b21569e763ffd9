// Package fence is what a resource protected by a ticketd lock uses to
// refuse a former holder: it verifies fences (a grant's key, token and
// cluster ID signed with the cluster's Ed25519 key) and keeps the highest
// token accepted per key. It imports no ticketd server code; the server
// imports it to sign. docs/fencing.md tells the same for any language.
//
// # Format (version 1)
//
//	fence     = "tf1." B64(payload) "." B64(signature)
//	payload   = version u8 (1) | cluster_id u64 | key_id [8] | token u64 | key_len u16 | key
//	signature = Ed25519(priv, "ticketd-fence-v1\x00" | payload)
//
// Integers are big-endian. B64 is base64url without padding, canonical
// (unused bits zero) and without any other character. key_id is the first
// 8 bytes of SHA-256 of the 32-byte public key. The key is 1 to MaxKeyLen
// (512, ticketd's key limit) bytes of UTF-8 without NUL, the token at
// least 1, and the payload ends exactly after the key; a fence is at most
// MaxLen (810) bytes. Public keys are written "tfk1." B64(32-byte key).
// Parsing refuses anything Sign cannot produce, so every fence has one
// text form.
//
// # Verifying
//
// A Verifier trusts one cluster ID and up to MaxTrustedKeys public keys
// (several during a key rotation). Verify checks, in order: the shape
// (ErrMalformed, ErrUnsupportedVersion), the key ID (ErrUnknownKey), the
// signature (ErrForged), the cluster (ErrWrongCluster). Then the resource
// checks that the fence's Key is the lock key that guards what it is asked
// to touch (a fence of any other lock of the cluster verifies too; refuse
// one for another key with CodeWrongKey, as fencehttp.WithKey does), and
// applies the highest-token rule through a Store: a lower token than the
// highest accepted for the key is refused with ErrStale, an equal one is
// accepted (the same holder writing again).
//
// # What it owns
//
// The format (format.go: Sign, Signer (a key prepared once for many
// fences), ParseUnverified, the limits), keys and
// verification (keys.go: KeyID, PublicKey and its text form, Verifier,
// the cluster ID's text form), the errors and their stable codes
// (errors.go), the Store contract and MemoryStore (store.go).
// Subpackages: fencepg (the rule in PostgreSQL, in the write's
// transaction), fencehttp (net/http middleware for the Ticketd-Fence
// header) and fencetest (the conformance test of every Store).
//
// # What it does not own
//
// Generating, storing, replicating and rotating the cluster's private key,
// and putting fences in grants: that is the server's. Whether a lock is
// still held now (a fence stays valid for ever; the highest-token rule is
// what refuses a superseded one).
package fence
