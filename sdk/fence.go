package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
	"github.com/ticketd/ticketd/transports/protocol"
)

// What the protected resource uses (issue 23; docs/fencing.md): a grant's
// fence (Lock.Fence), the public keys that verify it (FenceKeys), and the
// linearizable question "is this token still the key's current one"
// (Check).

// FenceKeys are a cluster's fence verification keys, as a resource
// configures them.
type FenceKeys struct {
	// ClusterID is the cluster whose fences the keys sign (0: a cluster
	// created before cluster IDs).
	ClusterID uint64
	// Keys are every key the cluster keeps, oldest first; the last is
	// Current. Empty before the cluster has made its first key (cluster
	// version below 3).
	Keys    []fence.PublicKey
	Current fence.PublicKey
}

// Verifier returns a fence.Verifier that trusts ClusterID and every key.
func (k FenceKeys) Verifier() (*fence.Verifier, error) {
	return fence.NewVerifier(k.ClusterID, k.Keys...)
}

// FenceKeys asks the leader for the cluster's fence public keys, read
// linearizably (after an acknowledged rotation the new key is there). It
// is read-only and retried like Get. A partitioned deployment has keys per
// group: use GroupFenceKeys.
func (c *Client) FenceKeys(ctx context.Context) (FenceKeys, error) {
	if c.cfg.partitioned {
		return FenceKeys{}, &Error{Code: protocol.CodeInvalidArgument, Op: "fence_keys",
			Message: "each group of a partitioned deployment is a cluster with its own ID and keys: use GroupFenceKeys"}
	}
	return c.fenceKeys(ctx, protocol.SubjectFenceKeys, nil)
}

// GroupFenceKeys asks the leader of group g of a partitioned deployment
// for that group's fence public keys (each group signs its own fences).
func (c *Client) GroupFenceKeys(ctx context.Context, g uint32) (FenceKeys, error) {
	return c.fenceKeys(ctx, protocol.GroupSubject(g, "fence_keys"), &g)
}

func (c *Client) fenceKeys(ctx context.Context, subject string, group *uint32) (FenceKeys, error) {
	r := &request{op: "fence_keys", subject: subject, group: group, readOnly: true}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return []byte("{}"), w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return FenceKeys{}, err
	}
	var fr protocol.FenceKeysReply
	if err := json.Unmarshal(rep.data, &fr); err != nil {
		return FenceKeys{}, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("unreadable fence keys reply: %v", err), nil)
	}
	out := FenceKeys{}
	if out.ClusterID, err = fence.ParseClusterID(fr.ClusterID); err != nil {
		return FenceKeys{}, c.newError(r, protocol.CodeMalformed, "fence keys reply: "+err.Error(), nil)
	}
	if len(fr.Keys) > fence.MaxTrustedKeys {
		return FenceKeys{}, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("fence keys reply: %d keys, more than %d", len(fr.Keys), fence.MaxTrustedKeys), nil)
	}
	for _, s := range fr.Keys {
		k, err := fence.ParsePublicKey(s)
		if err != nil {
			return FenceKeys{}, c.newError(r, protocol.CodeMalformed, "fence keys reply: "+err.Error(), nil)
		}
		out.Keys = append(out.Keys, k)
	}
	if n := len(out.Keys); n > 0 {
		out.Current = out.Keys[n-1]
	}
	return out, nil
}

// TokenCheck is what Check found.
type TokenCheck struct {
	Key string
	// Current: the key is held with the token asked about, now.
	Current bool
	// Token is the token the key is held with now (0: free).
	Token uint64
}

// Check asks whether key is held with token right now. The leader answers
// after a ReadIndex, so a token superseded by a grant that was
// acknowledged before Check was called is never reported current, and a
// token once reported not current never is again (tokens are never
// reused). It is read-only and retried like Get. An access list checks it
// as a get.
func (c *Client) Check(ctx context.Context, key string, token uint64) (TokenCheck, error) {
	bad := func(format string, args ...any) error {
		return &Error{Code: protocol.CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Op: "check", Key: key}
	}
	if err := core.ValidateKey(key); err != nil {
		return TokenCheck{}, bad("%s", detail(err))
	}
	if token == 0 {
		return TokenCheck{}, bad("token must be positive")
	}
	body, err := json.Marshal(protocol.CheckRequest{Key: key, Token: token})
	if err != nil {
		panic(err)
	}
	r := &request{op: "check", key: key, subject: c.keyedSubject("check", key), readOnly: true}
	r.build = func(_ int, now time.Time) ([]byte, time.Duration, bool) {
		w, ok := c.requestWait(ctx, now)
		return body, w, ok
	}
	rep, err := c.do(ctx, r)
	if err != nil {
		return TokenCheck{}, err
	}
	var cr protocol.CheckReply
	if err := json.Unmarshal(rep.data, &cr); err != nil || (cr.Key != "" && cr.Key != key) || (cr.Current && cr.Token != token) {
		return TokenCheck{}, c.newError(r, protocol.CodeMalformed, fmt.Sprintf("invalid check reply %.200q", rep.data), err)
	}
	return TokenCheck{Key: key, Current: cr.Current, Token: cr.Token}, nil
}
