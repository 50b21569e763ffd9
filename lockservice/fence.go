package lockservice

import (
	"context"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
)

// Fences and checks (issue 23): what lets the protected resource, not
// only the holder, tell a current token from a superseded one.
//
//   - A grant carries a fence: its key, token and the cluster ID signed
//     with the cluster's current fence key (core/fence.go; the format is
//     package fence's, docs/fencing.md). The leader that answers signs it
//     with the key its applied state holds; a resource verifies it with
//     the public keys (FenceKeys) and cannot be poisoned by an invented
//     token. Before the cluster has a key (cluster version below 3, or
//     the first key not yet applied) grants carry no fence.
//   - Check answers whether a token is the key's current one, read like
//     Get: on the ready leader after a ReadIndex, so never from a deposed
//     leader's table.

// fence signs the fence of a grant of key with token, or returns "" when
// the cluster has no fence key yet. The key is read from the applied state
// on every grant, as before, so a rotation applies to the next grant; only
// its preparation (key ID, expanded key) is kept between grants, in
// s.signer, and redone when the current public key differs. This runs on
// the request's own goroutine after its entry applied: signing (one
// Ed25519 signature, tens of µs) never holds a lock or the raft loop, so
// grants of different requests sign in parallel.
func (s *Service) fence(key string, token uint64) string {
	sg := s.signer.Load()
	var k core.FenceKey
	var ok, current bool
	s.node.View(func(m *core.Machine) {
		// The common case, the prepared signer's key still current, copies
		// no key out of the state (issue 26 item 4: per-grant allocations).
		if current = sg != nil && m.CurrentFenceKeyIs(sg.PublicKey()); !current {
			k, ok = m.CurrentFenceKey()
		}
	})
	if !current {
		if !ok {
			return ""
		}
		var err error
		if sg, err = fence.NewSigner(k.Private); err != nil {
			// Cannot happen: core validated the key when it applied it.
			s.log.Error("fence key not usable", "key_id", k.ID.String(), "err", err)
			return ""
		}
		s.signer.Store(sg)
	}
	f, err := sg.Sign(s.cfg.ClusterID, key, token)
	if err != nil {
		// Cannot happen: the key and token passed core's validation.
		s.log.Error("fence not signed", "key", key, "token", token, "err", err)
		return ""
	}
	return f
}

// FenceKeys are the cluster's fence verification keys.
type FenceKeys struct {
	ClusterID uint64
	// Keys are every kept key, oldest first; the last signs new fences.
	// Empty before the cluster has a key.
	Keys []core.FencePublicKey
}

// FenceKeys returns the fence public keys, read linearizably (ReadIndex
// on the leader): once a rotation was acknowledged, its key is in the
// answer. The keys are public; no access list entry is needed.
func (s *Service) FenceKeys(ctx context.Context) (FenceKeys, error) {
	if !s.IsLeader() {
		return FenceKeys{}, s.notLeader()
	}
	if err := s.node.ReadIndex(ctx); err != nil {
		return FenceKeys{}, s.nodeErr(err)
	}
	out := FenceKeys{ClusterID: s.cfg.ClusterID}
	s.node.View(func(m *core.Machine) { out.Keys = m.FencePublicKeys() })
	return out, nil
}

// Check is what a check found: whether token is key's current token, and
// the token key is held with now (0: free).
type Check struct {
	Current bool
	Token   uint64
}

// Check tells whether key is held with token right now, read linearizably:
// on the ready leader after a ReadIndex, so a token superseded by a grant
// committed before the check began is never reported current. The access
// list checks it as a get.
func (s *Service) Check(ctx context.Context, key string, token uint64) (Check, error) {
	if err := core.ValidateKey(key); err != nil {
		return Check{}, err
	}
	if token == 0 {
		return Check{}, &core.Error{Code: core.CodeInvalidArgument, Detail: "token must be positive"}
	}
	h, err := s.Get(ctx, key)
	if err != nil {
		return Check{}, err
	}
	if !h.Held {
		return Check{}, nil
	}
	// Any holder of a multi-holder key is current (Token: the oldest).
	for _, x := range h.All {
		if x.Lock.Token == token {
			return Check{Current: true, Token: token}, nil
		}
	}
	return Check{Current: h.Lock.Token == token, Token: h.Lock.Token}, nil
}
