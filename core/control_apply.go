package core

// Applying a control request: every rejection reason, and applyControl,
// which checks all of a transition's conditions before it changes
// anything.

// ControlReason is the stable code of a ControlRejected result. Reasons
// travel to operators and must never be renamed.
type ControlReason string

// Rejection reasons.
const (
	// Bootstrap after the cluster was bootstrapped (with any credential).
	ReasonAlreadyBootstrapped ControlReason = "already_bootstrapped"
	// MintJoin before Bootstrap.
	ReasonNotBootstrapped ControlReason = "not_bootstrapped"
	// MintJoin of a hash already minted (or the bootstrap credential's);
	// Admit with a consumed credential (or the bootstrap credential).
	ReasonCredentialReused ControlReason = "credential_reused"
	// Admit with a credential that was never minted.
	ReasonCredentialUnknown ControlReason = "credential_unknown"
	// Admit or PrepareReplacement with an address a current member uses
	// (a replacement may reuse the address of the node it replaces).
	ReasonAddressInUse ControlReason = "address_in_use"
	// Promote of a voter.
	ReasonNotALearner ControlReason = "not_a_learner"
	// PrepareReplacement of a learner.
	ReasonNotAVoter ControlReason = "not_a_voter"
	// Promote or Retire naming a member with a different incarnation.
	ReasonStaleIncarnation ControlReason = "stale_incarnation"
	// The node was never issued.
	ReasonUnknownNode ControlReason = "unknown_node"
	// The node was retired; it can never be a member again.
	ReasonNodeRetired ControlReason = "node_retired"
	// Promote or Retire of a node that is part of the pending replacement.
	ReasonInReplacement ControlReason = "in_replacement"
	// PrepareReplacement while another replacement is pending.
	ReasonReplacementPending ControlReason = "replacement_pending"
	// CompleteReplacement or AbortReplacement with none pending.
	ReasonNoReplacement ControlReason = "no_replacement"
	// CompleteReplacement or AbortReplacement that does not name the
	// pending replacement exactly.
	ReasonReplacementMismatch ControlReason = "replacement_mismatch"
	// Retire of the last voter.
	ReasonLastVoter ControlReason = "last_voter"
	// A bound in limits.go (or a counter's range) would be exceeded.
	ReasonLimitReached ControlReason = "limit_reached"
	// An identity about to be issued is already in the issued set. It
	// cannot happen while the counters only grow; it is checked anyway.
	ReasonIdentityReused ControlReason = "identity_reused"
	// SetClusterVersion to a version not above the current one.
	ReasonVersionNotNewer ControlReason = "version_not_newer"
	// SetFenceKey with a seed (or a key ID) already kept.
	ReasonFenceKeyExists ControlReason = "fence_key_exists"
)

func rejected(reason ControlReason) Result {
	return Result{Kind: ResultControlRejected, Reason: reason}
}

// applyControl applies a validated control request. Every transition
// checks all its conditions before it changes anything, so a rejection
// changes nothing.
func (m *Machine) applyControl(r ControlRequest) Result {
	c := &m.ctl
	switch r.Op {
	case ControlBootstrap:
		return c.applyBootstrap(r)
	case ControlMintJoin:
		return c.applyMintJoin(r)
	case ControlAdmit:
		return c.applyAdmit(r)
	case ControlPromote:
		return c.applyPromote(r)
	case ControlPrepareReplacement:
		return c.applyPrepareReplacement(r)
	case ControlCompleteReplacement, ControlAbortReplacement:
		return c.applyEndReplacement(r)
	case ControlRetire:
		return c.applyRetire(r)
	case ControlSetClusterVersion:
		if r.Version <= max(1, c.clusterVersion) {
			return rejected(ReasonVersionNotNewer)
		}
		c.clusterVersion = r.Version
		return Result{Kind: ResultControlApplied}
	case ControlSetFenceKey:
		return c.applySetFenceKey(r.FenceSeed)
	}
	return Result{Kind: ResultNoop} // unreachable: Validate rejects unknown ops
}

func (c *control) applyBootstrap(r ControlRequest) Result {
	if c.bootstrapped {
		return rejected(ReasonAlreadyBootstrapped)
	}
	id, inc, why := c.nextIdentity()
	if why != "" {
		return rejected(why)
	}
	c.bootstrapped = true
	c.bootstrapHash = r.CredentialHash
	c.issue(id, inc, r.Address, RoleVoter)
	return Result{Kind: ResultBootstrapRecorded, NodeID: id, Incarnation: inc}
}

func (c *control) applyMintJoin(r ControlRequest) Result {
	if !c.bootstrapped {
		return rejected(ReasonNotBootstrapped)
	}
	if c.credential(r.CredentialHash) != CredentialUnknown {
		return rejected(ReasonCredentialReused)
	}
	if len(c.creds) >= MaxJoinCredentials {
		return rejected(ReasonLimitReached)
	}
	if c.creds == nil {
		c.creds = make(map[[32]byte]CredentialState)
	}
	c.creds[r.CredentialHash] = CredentialMinted
	return Result{Kind: ResultControlApplied}
}

func (c *control) applyAdmit(r ControlRequest) Result {
	switch c.credential(r.CredentialHash) {
	case CredentialUnknown:
		return rejected(ReasonCredentialUnknown)
	case CredentialConsumed:
		return rejected(ReasonCredentialReused)
	}
	if c.addressUsed(r.Address, 0) {
		return rejected(ReasonAddressInUse)
	}
	id, inc, why := c.nextIdentity()
	if why != "" {
		return rejected(why)
	}
	c.creds[r.CredentialHash] = CredentialConsumed
	c.issue(id, inc, r.Address, RoleLearner)
	return Result{Kind: ResultAdmissionAccepted, NodeID: id, Incarnation: inc}
}

func (c *control) applyPromote(r ControlRequest) Result {
	mem, why := c.member(r.NodeID, r.Incarnation)
	switch {
	case why != "":
		return rejected(why)
	case mem.Role != RoleLearner:
		return rejected(ReasonNotALearner)
	case c.inReplacement(mem.NodeID):
		return rejected(ReasonInReplacement)
	}
	mem.Role = RoleVoter
	c.members[mem.NodeID] = mem
	return Result{Kind: ResultControlApplied, NodeID: mem.NodeID, Incarnation: mem.Incarnation}
}

func (c *control) applyPrepareReplacement(r ControlRequest) Result {
	if p := c.pending; p != nil {
		if p.Old == r.OldNodeID && p.Address == r.Address {
			// The same request again: a retry by an operator or a node
			// whose first answer was lost (indeterminate). It learns the
			// identity already prepared; nothing changes, so replicas
			// running a version that refused the retry keep the same state.
			return Result{Kind: ResultReplacementPrepared, NodeID: p.New, Incarnation: p.NewIncarnation}
		}
		return rejected(ReasonReplacementPending)
	}
	old, why := c.member(r.OldNodeID, 0)
	switch {
	case why != "":
		return rejected(why)
	case old.Role != RoleVoter:
		return rejected(ReasonNotAVoter)
	case c.addressUsed(r.Address, old.NodeID):
		return rejected(ReasonAddressInUse)
	}
	id, inc, why := c.nextIdentity()
	if why != "" {
		return rejected(why)
	}
	c.issue(id, inc, r.Address, RoleLearner)
	c.pending = &Replacement{Old: old.NodeID, New: id, NewIncarnation: inc, Address: r.Address}
	return Result{Kind: ResultReplacementPrepared, NodeID: id, Incarnation: inc}
}

// applyEndReplacement completes or aborts the pending replacement.
func (c *control) applyEndReplacement(r ControlRequest) Result {
	p := c.pending
	switch {
	case p == nil:
		return rejected(ReasonNoReplacement)
	case p.Old != r.OldNodeID || p.New != r.NewNodeID || p.NewIncarnation != r.NewIncarnation:
		return rejected(ReasonReplacementMismatch)
	}
	c.pending = nil
	if r.Op == ControlAbortReplacement {
		c.retire(p.New)
		return Result{Kind: ResultControlApplied, NodeID: p.New, Incarnation: p.NewIncarnation}
	}
	nm := c.members[p.New]
	nm.Role = RoleVoter
	c.members[p.New] = nm
	c.retire(p.Old)
	return Result{Kind: ResultControlApplied, NodeID: p.New, Incarnation: p.NewIncarnation}
}

func (c *control) applyRetire(r ControlRequest) Result {
	mem, why := c.member(r.NodeID, r.Incarnation)
	switch {
	case why != "":
		return rejected(why)
	case c.inReplacement(mem.NodeID):
		return rejected(ReasonInReplacement)
	case mem.Role == RoleVoter && c.voters() == 1:
		return rejected(ReasonLastVoter)
	}
	c.retire(mem.NodeID)
	return Result{Kind: ResultControlApplied, NodeID: mem.NodeID, Incarnation: mem.Incarnation}
}
