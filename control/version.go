package control

import (
	"context"
	"time"

	"github.com/ticketd/ticketd/core"
)

// VersionProbe asks member id for the newest cluster version its binary
// supports (core.MaxClusterVersion there). A member that does not answer,
// or predates version reporting, must make the probe return an error or 1.
type VersionProbe func(ctx context.Context, id uint64) (uint64, error)

// VersionProbeTimeoutDefault bounds one member's answer.
const VersionProbeTimeoutDefault = time.Second

// SetVersionProbe sets how the leader learns its members' versions. Call
// it before Start; without a probe only a cluster of this node alone has
// its version raised.
func (p *Plane) SetVersionProbe(probe VersionProbe) { p.versionProbe = probe }

// maybeRaiseClusterVersion proposes SetClusterVersion once every current
// raft member (voters and learners) reports that it reads a newer version
// than the cluster's: a member's binary must be able to decode every
// committed entry, or it stops (core/version.go).
func (p *Plane) maybeRaiseClusterVersion(ctx context.Context) {
	var current uint64
	p.cfg.Node.View(func(m *core.Machine) { current = m.ClusterVersion() })
	if current >= core.MaxClusterVersion {
		return
	}
	target := core.MaxClusterVersion
	cs := p.cfg.Node.ConfState()
	for _, ids := range [][]uint64{cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext} {
		for _, id := range ids {
			if id == p.cfg.ID {
				continue
			}
			if p.versionProbe == nil {
				return
			}
			pctx, cancel := context.WithTimeout(ctx, VersionProbeTimeoutDefault)
			v, err := p.versionProbe(pctx, id)
			cancel()
			if err != nil {
				p.log.Debug("member version unknown; cluster version stays", "member", id, "version", current, "err", err)
				return
			}
			target = min(target, v)
		}
	}
	if target <= current {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, TimeoutDefault)
	defer cancel()
	a, err := p.cfg.Node.Propose(pctx, core.SetClusterVersion(target))
	if err != nil {
		p.log.Warn("propose cluster version", "version", target, "err", err)
		return
	}
	if a.Result.Kind != core.ResultControlApplied {
		// Another proposal (a leader before this one) raised it first.
		p.log.Debug("cluster version not raised", "from", current, "to", target, "result", a.Result.String())
		return
	}
	p.log.Info("cluster version raised", "from", current, "to", target)
}
