package control

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"

	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/fence"
)

// Fence signing keys (issue 23, core/fence.go): the Ed25519 keys whose
// signatures let a protected resource verify a grant's token offline.
// They live in the replicated control state; this package only makes
// them. The ready leader proposes the first once the cluster version
// allows it (the reconcile loop, so a new leader of a cluster that has
// none makes it too), and an admin rotates them (POST /v1/fence/rotate).
// The seed comes from crypto/rand here, on the leader, never from Apply.

// fenceKeyVersion is the cluster version SetFenceKey needs.
func fenceKeyVersion() uint64 { return core.CommandVersion(core.SetFenceKey(core.FenceSeed{})) }

// newFenceSeed draws a fresh fence key seed.
func newFenceSeed() (core.FenceSeed, error) {
	var seed core.FenceSeed
	if _, err := rand.Read(seed[:]); err != nil {
		return core.FenceSeed{}, fmt.Errorf("control: fence key seed: %w", err)
	}
	return seed, nil
}

// maybeSetFenceKey proposes the cluster's first fence key when the cluster
// version is 3 or more and the applied state holds none. The caller is the
// ready leader's reconcile loop: its state includes every entry of earlier
// terms, and it waits for its own proposal, so it proposes a first key
// once (a proposal whose outcome was lost may make a second one, which is
// only an early rotation).
func (p *Plane) maybeSetFenceKey(ctx context.Context) {
	var version uint64
	var has bool
	p.cfg.Node.View(func(m *core.Machine) {
		version = m.ClusterVersion()
		_, has = m.CurrentFenceKey()
	})
	if has || version < fenceKeyVersion() {
		return
	}
	seed, err := newFenceSeed()
	if err != nil {
		p.log.Warn("no fence key made", "err", err)
		return
	}
	res, cerr := p.proposeCtx(ctx, core.SetFenceKey(seed))
	if cerr != nil {
		p.log.Warn("propose the first fence key; retrying", "err", cerr)
		return
	}
	p.log.Info("fence signing key made", "result", res.String(), "key", p.currentFenceKeyText())
}

// rotateFenceKey makes a new fence key current (admin). The older keys
// stay (at most core.MaxFenceKeys, oldest dropped first), so fences signed
// before stay valid for resources that still trust them.
func (p *Plane) rotateFenceKey(r *http.Request, _ Request) (Reply, *Error) {
	var version uint64
	p.cfg.Node.View(func(m *core.Machine) { version = m.ClusterVersion() })
	if need := fenceKeyVersion(); version < need {
		return Reply{}, &Error{Code: CodeUnavailable, Message: fmt.Sprintf("fence keys need cluster version %d, the cluster runs version %d (a member runs an older binary); retry once every member is upgraded", need, version)}
	}
	seed, err := newFenceSeed()
	if err != nil {
		return Reply{}, &Error{Code: CodeUnavailable, Message: err.Error()}
	}
	res, cerr := p.propose(r, core.SetFenceKey(seed))
	if cerr != nil {
		return Reply{}, cerr
	}
	rep := Reply{Result: res.Kind.String(), ClusterID: p.cfg.ClusterID}
	rep.FenceKey, rep.FenceKeys = p.fenceKeyTexts()
	return rep, nil
}

// fenceKeyTexts are the applied fence keys in fence's text form: the
// current one and all of them, oldest first.
func (p *Plane) fenceKeyTexts() (current string, all []string) {
	var keys []core.FencePublicKey
	p.cfg.Node.View(func(m *core.Machine) { keys = m.FencePublicKeys() })
	for _, k := range keys {
		pk, err := fence.NewPublicKey(k.Key)
		if err != nil {
			continue // cannot happen: core keeps 32-byte keys
		}
		all = append(all, pk.String())
	}
	if len(all) > 0 {
		current = all[len(all)-1]
	}
	return current, all
}

func (p *Plane) currentFenceKeyText() string {
	cur, _ := p.fenceKeyTexts()
	return cur
}
