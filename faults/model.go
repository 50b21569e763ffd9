package faults

import (
	"fmt"
	"math"
	"sort"

	"github.com/anishathalye/porcupine"
)

// jumpTimeline answers "how far forward did any lease clock jump between
// a and b", the most a lease can have been cut short in that window.
type jumpTimeline struct {
	at  []int64 // sorted
	cum []int64 // cum[i] = sum of forward deltas of jumps[0..i-1]
}

func newJumpTimeline(jumps []Jump) jumpTimeline {
	js := append([]Jump(nil), jumps...)
	sort.Slice(js, func(i, j int) bool { return js[i].At < js[j].At })
	jt := jumpTimeline{at: make([]int64, len(js)), cum: make([]int64, len(js)+1)}
	for i, j := range js {
		jt.at[i] = j.At
		jt.cum[i+1] = jt.cum[i] + max(j.Delta, 0)
	}
	return jt
}

// forward is the sum of forward jumps (on any node) at times in [a, b].
// Summing over all nodes is conservative: a lease is timed on one leader's
// clock at a time, and a new leader re-arms it in full.
func (jt jumpTimeline) forward(a, b int64) int64 {
	if len(jt.at) == 0 || b < a {
		return 0
	}
	lo := sort.Search(len(jt.at), func(i int) bool { return jt.at[i] >= a })
	hi := sort.Search(len(jt.at), func(i int) bool { return jt.at[i] > b })
	return jt.cum[hi] - jt.cum[lo]
}

// Porcupine inputs and outputs of the per-key lock model.

type lockInput struct {
	Kind  OpKind
	Token uint64 // release, renew: the lock's token
	Call  int64
	// Return is math.MaxInt64 for an unknown outcome: the operation may
	// take effect at any time after its call.
	Return int64
}

type lockOutput struct {
	Result Outcome
	Token  uint64 // acquire ok: granted; get ok: holder (0 free)
	Held   bool   // get ok
	Since  int64  // acquire ok: earliest lease start (SDK send time); renew ok: its call
	Lease  int64  // acquire ok: granted lease; renew ok: new local deadline - Since
}

type stateKind uint8

const (
	stFree    stateKind = iota
	stKnown             // held with a token some client received
	stPhantom           // held by a grant nobody received (indeterminate or timed-out acquire)
)

// lockState is one possible state of a key. The model is
// nondeterministic: porcupine carries the set of states consistent with
// the operations linearized so far.
type lockState struct {
	Kind stateKind
	// Token is the holder's token; for a phantom, 0 until a get reveals it.
	Token uint64
	// Since and Lease of a known lock: its lease cannot end before
	// Since+Lease on the leader's clock (the SDK's Lock.Deadline).
	Since, Lease int64
	// RSince and RLease: the same promise of the last confirmed renewal
	// linearized (0: none). The lock cannot end before either.
	RSince, RLease int64
	// NotBefore is a lower bound on the linearization time of every
	// later operation, set when a known lock is assumed to have expired
	// (the expiry happened no earlier than its deadline). 0: none.
	NotBefore int64
}

// lockModel is the per-key sequential specification:
//
//   - acquire ok(T) needs a free key (a held lock may first expire, see
//     below) and leaves it held by T with the granted lease;
//   - acquire held needs the key held; acquire timeout needs the key held,
//     or, from a free key, leaves a phantom (the server granted after the
//     requester's deadline and releases it itself, with "timeout" as the
//     reply);
//   - an unknown acquire has no effect, or, from a free key, leaves a phantom;
//   - release ok(T) needs the key held by T and frees it; release
//     not_found needs the key not held by T; an unknown release has no
//     effect or frees a key held by T;
//   - get free needs a free key; get held(T) needs the key held by T, or
//     a phantom whose token is not yet known and T is a token no acquire
//     returned (the phantom's token is then T);
//   - renew ok(T) needs the key held by T (known: only holders renew) and
//     leaves it held with the renewal's promise: it cannot end before the
//     holder's new local deadline (renew send time + the lease in the
//     reply) minus the forward jumps since the renew call; renew
//     not_found needs the key not held by T, or held by T with a lease
//     that can have ended (the leader refuses a renewal once the lease
//     ran out on its clock, before its Expire applies; a new leader may
//     even re-arm it). A renewal never makes a freed key held again. Unknown renewals are left out (see
//     porcupineOps): each may have lengthened the lease or not, and a
//     lease that lives longer is always allowed, so they constrain
//     nothing.
//
// Spontaneous transitions: before any operation, a phantom may vanish
// (lost-reply release or expiry, at any time), and a known lock T may
// expire if the operation may linearize at or after T's SDK deadline
// (the later of the grant's and its last renewal's) minus every forward
// clock jump in between: the expiry happens no earlier than that, so
// every later operation must be able to linearize after it (NotBefore).
type lockModel struct {
	known map[uint64]bool // tokens some acquire of this key returned
	jumps jumpTimeline
	slack int64
}

func (m *lockModel) step(s lockState, in lockInput, out lockOutput) []lockState {
	if s.NotBefore > 0 {
		if in.Return < s.NotBefore {
			return nil
		}
		if in.Call >= s.NotBefore {
			// This op linearizes after NotBefore, and every later op
			// after this one: the bound is implied from now on.
			s.NotBefore = 0
		}
	}
	pre := []lockState{s}
	switch s.Kind {
	case stPhantom:
		pre = append(pre, lockState{Kind: stFree, NotBefore: s.NotBefore})
	case stKnown:
		nb := m.endsNotBefore(s, in.Return)
		if in.Return >= nb {
			v := lockState{Kind: stFree, NotBefore: max(s.NotBefore, nb)}
			if in.Call >= v.NotBefore {
				v.NotBefore = 0
			}
			pre = append(pre, v)
		}
	}
	var next []lockState
	for _, p := range pre {
		next = append(next, m.apply(p, in, out)...)
	}
	return next
}

// endsNotBefore is the earliest time a known lock can have ended, as seen
// from an operation returning at t: the later of its grant's and its last
// renewal's promise, each shortened by the forward jumps since it.
func (m *lockModel) endsNotBefore(s lockState, t int64) int64 {
	nb := s.Since + s.Lease - m.jumps.forward(s.Since, t)
	if s.RLease > 0 {
		nb = max(nb, s.RSince+s.RLease-m.jumps.forward(s.RSince, t))
	}
	return nb - m.slack
}

func (m *lockModel) apply(p lockState, in lockInput, out lockOutput) []lockState {
	free := p.Kind == stFree
	heldBy := func(tok uint64) bool { return p.Kind != stFree && p.Token == tok }
	phantom := func() lockState { return lockState{Kind: stPhantom, NotBefore: p.NotBefore} }
	freed := lockState{Kind: stFree, NotBefore: p.NotBefore}
	switch in.Kind {
	case OpAcquire:
		switch out.Result {
		case OutOK:
			if free {
				return []lockState{{Kind: stKnown, Token: out.Token, Since: out.Since, Lease: out.Lease, NotBefore: p.NotBefore}}
			}
		case OutHeld:
			if !free {
				return []lockState{p}
			}
		case OutTimeout:
			if !free {
				return []lockState{p}
			}
			return []lockState{phantom()}
		case OutUnknown:
			if free {
				return []lockState{p, phantom()}
			}
			return []lockState{p}
		}
	case OpRelease:
		switch out.Result {
		case OutOK:
			if p.Kind == stKnown && p.Token == in.Token {
				return []lockState{freed}
			}
		case OutNotFound:
			if !(p.Kind == stKnown && p.Token == in.Token) {
				return []lockState{p}
			}
		case OutUnknown:
			if p.Kind == stKnown && p.Token == in.Token {
				return []lockState{p, freed}
			}
			return []lockState{p}
		}
	case OpRenew:
		held := p.Kind == stKnown && p.Token == in.Token
		switch out.Result {
		case OutOK:
			if held {
				r := p
				if out.Since+out.Lease > r.RSince+r.RLease {
					r.RSince, r.RLease = out.Since, out.Lease
				}
				return []lockState{r}
			}
		case OutNotFound:
			// The leader also refuses a renewal of a lease that ran
			// out on its clock before the Expire applied, so T may
			// still be held if its lease can have ended.
			if !held || m.endsNotBefore(p, in.Return) <= in.Return {
				return []lockState{p}
			}
		}
	case OpGet:
		if out.Result != OutOK {
			return nil
		}
		if !out.Held {
			if free {
				return []lockState{p}
			}
			return nil
		}
		if heldBy(out.Token) {
			return []lockState{p}
		}
		if p.Kind == stPhantom && p.Token == 0 && !m.known[out.Token] {
			bound := p
			bound.Token = out.Token
			return []lockState{bound}
		}
	}
	return nil
}

func (m *lockModel) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{lockState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := m.step(state.(lockState), input.(lockInput), output.(lockOutput))
			out := make([]interface{}, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Equal: func(a, b interface{}) bool { return a.(lockState) == b.(lockState) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(lockInput), output.(lockOutput)
			switch in.Kind {
			case OpAcquire:
				if out.Result == OutOK {
					return fmt.Sprintf("acquire -> %d (until %s)", out.Token, ms(out.Since+out.Lease))
				}
				return "acquire -> " + string(out.Result)
			case OpRelease:
				return fmt.Sprintf("release(%d) -> %s", in.Token, out.Result)
			case OpRenew:
				if out.Result == OutOK {
					return fmt.Sprintf("renew(%d) -> until %s", in.Token, ms(out.Since+out.Lease))
				}
				return fmt.Sprintf("renew(%d) -> %s", in.Token, out.Result)
			default:
				if out.Held {
					return fmt.Sprintf("get -> %d", out.Token)
				}
				return "get -> free"
			}
		},
		DescribeState: func(state interface{}) string {
			s := state.(lockState)
			var d string
			switch s.Kind {
			case stFree:
				d = "free"
			case stKnown:
				d = fmt.Sprintf("held %d until %s", s.Token, ms(max(s.Since+s.Lease, s.RSince+s.RLease)))
			case stPhantom:
				if s.Token == 0 {
					d = "held by an unknown grant"
				} else {
					d = fmt.Sprintf("held %d (unknown grant)", s.Token)
				}
			}
			if s.NotBefore > 0 {
				d += fmt.Sprintf(", not before %s", ms(s.NotBefore))
			}
			return d
		},
	}
	return nm.ToModel()
}

// reservedHeld returns the ids of "held" answers that a leader-side
// reservation may explain: the leader answers held for a key that is
// free in the state machine while it has picked an acquire for it (the
// reservation lasts until that acquire's Grant applies or fails; SPEC §3:
// the leader never proposes a Grant for a key that is held or pending),
// so held is not a linearizable observation of the lock while another
// client's acquire is in flight. Such answers are left out of the
// linearizability check; a held answer with no acquire of another client
// in flight must still be explained by a holder.
func reservedHeld(ops []Op) map[int]bool {
	return heldWhileInFlight(ops, func(o Op) bool { return o.Result != OutHeld })
}

// heldWhileInFlight returns the ids of the acquires answered held while
// an acquire of another client that inFlight accepts was between its
// call and its return (to the end of the history when its outcome is
// unknown).
func heldWhileInFlight(ops []Op, inFlight func(Op) bool) map[int]bool {
	type window struct {
		call, ret int64
		client    int
	}
	var rs []window
	for _, o := range ops {
		if o.Kind == OpAcquire && inFlight(o) {
			r := o.Return
			if o.Result == OutUnknown {
				r = math.MaxInt64
			}
			rs = append(rs, window{o.Call, r, o.Client})
		}
	}
	out := map[int]bool{}
	for _, o := range ops {
		if o.Kind != OpAcquire || o.Result != OutHeld {
			continue
		}
		for _, r := range rs {
			if r.client != o.Client && r.call < o.Return && r.ret > o.Call {
				out[o.ID] = true
				break
			}
		}
	}
	return out
}

// porcupineOps converts one key's operations. Failed operations (definite
// no effect) and failed gets are left out, and with lenient so are the
// held answers a reservation may explain; unknown outcomes return at
// infinity, except unknown renewals, which are left out: in the model
// they change nothing (a lease that lasts longer is always allowed, and
// no checker may count on the extension), so they only cost search.
func porcupineOps(ops []Op, lenient bool) []porcupine.Operation {
	var out []porcupine.Operation
	skip := map[int]bool{}
	if lenient {
		skip = reservedHeld(ops)
	}
	for _, o := range ops {
		if o.Result == OutFail || skip[o.ID] || (o.Kind == OpRenew && o.Result == OutUnknown) {
			continue
		}
		in := lockInput{Kind: o.Kind, Call: o.Call, Return: o.Return}
		res := lockOutput{Result: o.Result}
		switch o.Kind {
		case OpAcquire:
			if o.Result == OutOK {
				res.Token, res.Since, res.Lease = o.Token, o.Since(), o.Granted
			}
		case OpRelease:
			in.Token = o.Token
		case OpRenew:
			in.Token = o.Token
			if o.Result == OutOK {
				p := o.promised()
				res.Since, res.Lease = p.From, p.End-p.From
			}
		case OpGet:
			res.Token, res.Held = o.Token, o.Held
		}
		if o.Result == OutUnknown {
			in.Return = math.MaxInt64
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: in, Call: in.Call, Output: res, Return: in.Return, Metadata: o.ID})
	}
	return out
}
