package faults

import (
	"fmt"
	"math"
	"sort"
)

// Renewals in the checkers. A confirmed renewal (renew ok) promises the
// holder the lock until its new local deadline: the renew request's send
// time plus the lease in the reply (the server re-armed the lease no
// earlier than it received the request), less the forward jumps of a
// lease clock since (counted from the renew call, which only counts more).
// The grant's promise still stands beside it; the lock is the holder's
// until the later of them. An unknown renewal promises nothing: it may
// have lengthened the lease or not, and the SDK does not move the holder's
// deadline for it.

// confirmedRenewals returns one key's renew ok operations by token, in
// call order.
func confirmedRenewals(ops []Op) map[uint64][]Op {
	out := map[uint64][]Op{}
	for _, o := range ops {
		if o.Kind == OpRenew && o.Result == OutOK {
			out[o.Token] = append(out[o.Token], o)
		}
	}
	for _, rs := range out {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Call < rs[j].Call })
	}
	return out
}

// promisesOf is the grant's promise followed by every confirmed renewal's.
func promisesOf(a Op, renews []Op) []promise {
	ps := []promise{a.promised()}
	for _, n := range renews {
		ps = append(ps, n.promised())
	}
	return ps
}

// holdsUntil is the earliest time the lock granted by a can have ended,
// as seen from an operation invoked at call and returning at t: the later
// of the grant's promise and those of the renewals confirmed before call,
// each shortened by the forward jumps since it.
func holdsUntil(a Op, renews []Op, call, t int64, jt jumpTimeline, slack int64) int64 {
	p := a.promised()
	end := p.End - jt.forward(p.From, t)
	for _, n := range renews {
		if n.Return >= call {
			continue
		}
		p := n.promised()
		end = max(end, p.End-jt.forward(p.From, t))
	}
	return end - slack
}

// renewedBefore reports whether a renewal was confirmed before call.
func renewedBefore(renews []Op, call int64) bool {
	return len(renews) > 0 && renews[0].Return < call
}

// lastRenewal is the last confirmed renewal of a's lock, if any: the
// operation a reader of a violation needs beside the grant.
func lastRenewal(ops []Op, a Op) []Op {
	var last []Op
	for _, o := range ops {
		if o.Kind == OpRenew && o.Result == OutOK && o.Key == a.Key && o.Token == a.Token && (last == nil || o.Call > last[0].Call) {
			last = []Op{o}
		}
	}
	return last
}

// checkRenewals: a renewal answered not_found while the lock cannot have
// ended (by its grant and the renewals confirmed before, less forward
// jumps; no release of it invoked) is a lost lock ("renew-refused"); a
// renewal confirmed after an operation that completed before it showed
// the lock ended (a get invoked after the grant showing the key free or
// held by another token) revived an ended lock ("renew-after-end"). A
// refused renewal does not show that: the leader refuses a lease that ran
// out on its clock before the Expire applies, and a new leader may re-arm
// that lock in full. The linearizability check covers both too; these
// name them directly and cannot time out.
func checkRenewals(key string, ops []Op, jt jumpTimeline, slack int64) []Violation {
	grants := map[uint64]Op{}
	releaseCalled := map[uint64]int64{}
	var gets []Op
	for _, o := range ops {
		switch {
		case o.Kind == OpAcquire && o.Result == OutOK:
			grants[o.Token] = o
		case o.Kind == OpRelease:
			if c, ok := releaseCalled[o.Token]; !ok || o.Call < c {
				releaseCalled[o.Token] = o.Call
			}
		case o.Kind == OpGet && o.Result == OutOK:
			gets = append(gets, o)
		}
	}
	renews := confirmedRenewals(ops)
	var vs []Violation
	for _, r := range ops {
		a, ok := grants[r.Token]
		if r.Kind != OpRenew || !ok || r.Call <= a.Return {
			continue
		}
		switch r.Result {
		case OutNotFound:
			rc, released := releaseCalled[r.Token]
			if released && rc < r.Return {
				continue
			}
			if until := holdsUntil(a, renews[r.Token], r.Call, r.Return, jt, slack); r.Return < until {
				vs = append(vs, Violation{Checker: "renew-refused", Key: key,
					Message: fmt.Sprintf("a renewal of token %d found no lock (not_found) at %s, but the lock cannot have ended before %s",
						r.Token, ms(r.Return), ms(until)),
					Ops: append(append([]Op{a}, lastRenewalBefore(renews[r.Token], r.Call)...), r)})
			}
		case OutOK:
			if e, ok := endedBefore(a, r, gets); ok {
				vs = append(vs, Violation{Checker: "renew-after-end", Key: key,
					Message: fmt.Sprintf("a renewal of token %d was confirmed after an operation had shown the lock ended", r.Token),
					Ops:     []Op{a, e, r}})
			}
		}
	}
	return vs
}

// endedBefore finds a get that completed before renewal r of a's lock was
// invoked, was invoked after the grant was acknowledged, and saw the key
// free or held by another token.
func endedBefore(a, r Op, gets []Op) (Op, bool) {
	for _, g := range gets {
		if g.Return < r.Call && g.Call > a.Return && !shows(g, a.Token) {
			return g, true
		}
	}
	return Op{}, false
}

// lastRenewalBefore is the last of renews (in call order) confirmed
// before call.
func lastRenewalBefore(renews []Op, call int64) []Op {
	var last []Op
	ret := int64(math.MinInt64)
	for _, n := range renews {
		if n.Return < call && n.Return > ret {
			last, ret = []Op{n}, n.Return
		}
	}
	return last
}
