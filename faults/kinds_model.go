package faults

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// LockKind is the kind of a workload key (issue 25): a mutex (""), a
// counting semaphore or a read/write lock.
type LockKind string

// The kinds of workload keys.
const (
	LockMutex     LockKind = ""
	LockSemaphore LockKind = "semaphore" // acquires name Op.Limit
	LockRW        LockKind = "rw"        // acquires are shared (Op.Shared) or exclusive
)

// maxModelHolders bounds the holders (known and phantom) one state of the
// kinds model carries. A state that would need more is not a state of
// the model, so the workload keeps every key well below it (a semaphore's
// limit is at most kindsMaxLimit, and a key has at most one holder per
// client plus grants nobody received).
const maxModelHolders = 16

// kHolder is one holder of a multi-holder key in the kinds model.
type kHolder struct {
	// Token is the holder's token; for a phantom (a grant nobody
	// received), 0 until a get shows it.
	Token   uint64
	Phantom bool
	Shared  bool // a shared hold of a read/write lock
	// Since, Lease, RSince and RLease are a known holder's promises, as
	// in lockState.
	Since, Lease, RSince, RLease int64
}

// kindsState is one possible state of a semaphore or read/write key:
// its holders in a canonical order (known by token, then phantoms), the
// highest token a known grant linearized so far received, and NotBefore
// as in lockState. It is comparable, so porcupine's Equal is ==.
type kindsState struct {
	N         int
	H         [maxModelHolders]kHolder
	MaxTok    uint64
	NotBefore int64
}

func (s kindsState) holders() []kHolder { return s.H[:s.N] }

// withHolders returns s with holders hs in canonical order, or false when
// they do not fit.
func (s kindsState) withHolders(hs []kHolder) (kindsState, bool) {
	if len(hs) > maxModelHolders {
		return kindsState{}, false
	}
	sorted := append([]kHolder(nil), hs...)
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Phantom != b.Phantom {
			return !a.Phantom
		}
		if (a.Token == 0) != (b.Token == 0) {
			return a.Token != 0
		}
		if a.Token != b.Token {
			return a.Token < b.Token
		}
		return !a.Shared && b.Shared
	})
	out := kindsState{N: len(sorted), MaxTok: s.MaxTok, NotBefore: s.NotBefore}
	copy(out.H[:], sorted)
	return out, true
}

type kindsInput struct {
	Kind   OpKind
	Token  uint64 // release, renew: the holder's token
	Shared bool   // acquire: a shared hold
	Call   int64
	Return int64 // math.MaxInt64 for an unknown outcome
}

type kindsOutput struct {
	Result       Outcome
	Token        uint64 // acquire ok: granted
	Since, Lease int64  // acquire ok, renew ok: as in lockOutput
	Holders      []uint64
	Shared       bool // get ok: the key is held shared
}

// kindsModel is the per-key sequential specification of a counting
// semaphore (kind LockSemaphore, limit N) or a read/write lock (LockRW).
// It is lockModel with a set of holders in place of one:
//
//   - acquire ok(T) needs room (a semaphore: fewer than N holders; a
//     shared hold: no exclusive holder; an exclusive hold: no holder) and
//     T above every token granted before it on the key (tokens rise, so
//     an exclusive grant's token is above every shared one granted before
//     it); it adds a known holder T with the granted lease;
//   - acquire held needs no room; acquire timeout needs no room, or, with
//     room, leaves a phantom holder of the acquire's mode (a grant
//     applied after the requester's deadline, which the server releases);
//     an unknown acquire has no effect or, with room, leaves a phantom;
//   - release, renew: as lockModel, on the holder T names; other holders
//     are not touched;
//   - get ok shows exactly the holders: every known holder's token, each
//     phantom's (a phantom whose token is unknown takes one that no
//     acquire returned), and for a read/write lock the mode (held shared:
//     every holder shared; exclusive: one exclusive holder).
//
// Spontaneous transitions before any operation: any set of phantoms may
// vanish, and any set of known holders whose leases can have ended (as in
// lockModel) may expire, constraining later operations (NotBefore).
//
// FIFO across modes (a shared try behind a waiting exclusive acquire is
// answered held although the key has room for it) is a held answer
// while another client's acquire is in flight: the lenient check leaves
// those out, as it does reservations (kindsReservedHeld).
type kindsModel struct {
	kind  LockKind
	limit int             // LockSemaphore: N
	known map[uint64]bool // tokens some acquire of this key returned
	jumps jumpTimeline
	slack int64
}

func newKindsModel(kind LockKind, limit int, ops []Op, jt jumpTimeline, slack int64) *kindsModel {
	m := &kindsModel{kind: kind, limit: limit, known: map[uint64]bool{}, jumps: jt, slack: slack}
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			m.known[o.Token] = true
		}
	}
	return m
}

// room tells whether a grant of the given mode fits beside hs.
func (m *kindsModel) room(hs []kHolder, shared bool) bool {
	switch {
	case m.kind == LockSemaphore:
		return len(hs) < m.limit
	case m.kind == LockRW && shared:
		for _, h := range hs {
			if !h.Shared {
				return false
			}
		}
		return true
	default:
		return len(hs) == 0
	}
}

// endsNotBefore is lockModel.endsNotBefore for one known holder.
func (m *kindsModel) endsNotBefore(h kHolder, t int64) int64 {
	nb := h.Since + h.Lease - m.jumps.forward(h.Since, t)
	if h.RLease > 0 {
		nb = max(nb, h.RSince+h.RLease-m.jumps.forward(h.RSince, t))
	}
	return nb - m.slack
}

func (m *kindsModel) step(s kindsState, in kindsInput, out kindsOutput) []kindsState {
	if s.NotBefore > 0 {
		if in.Return < s.NotBefore {
			return nil
		}
		if in.Call >= s.NotBefore {
			s.NotBefore = 0
		}
	}
	var next []kindsState
	seen := map[kindsState]bool{}
	for _, p := range m.ended(s, in) {
		for _, n := range m.apply(p, in, out) {
			if !seen[n] {
				seen[n] = true
				next = append(next, n)
			}
		}
	}
	return next
}

// ended returns s and every state reachable from it by spontaneous ends
// before the operation in: any subset of the phantoms and of the known
// holders that may have expired by in.Return.
func (m *kindsModel) ended(s kindsState, in kindsInput) []kindsState {
	hs := s.holders()
	var gone []int // holders that may end
	var nbs []int64
	for i, h := range hs {
		if h.Phantom {
			gone, nbs = append(gone, i), append(nbs, 0)
			continue
		}
		if nb := m.endsNotBefore(h, in.Return); in.Return >= nb {
			gone, nbs = append(gone, i), append(nbs, nb)
		}
	}
	out := []kindsState{s}
	seen := map[kindsState]bool{s: true}
	for mask := 1; mask < 1<<len(gone); mask++ {
		drop := map[int]bool{}
		nb := s.NotBefore
		for b, i := range gone {
			if mask&(1<<b) != 0 {
				drop[i] = true
				nb = max(nb, nbs[b])
			}
		}
		var keep []kHolder
		for i, h := range hs {
			if !drop[i] {
				keep = append(keep, h)
			}
		}
		v, _ := s.withHolders(keep)
		v.NotBefore = nb
		if in.Call >= v.NotBefore {
			v.NotBefore = 0
		}
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func (m *kindsModel) apply(p kindsState, in kindsInput, out kindsOutput) []kindsState {
	hs := p.holders()
	idx := -1 // the known holder in.Token names
	for i, h := range hs {
		if !h.Phantom && h.Token == in.Token {
			idx = i
		}
	}
	add := func(h kHolder) []kindsState {
		n, ok := p.withHolders(append(append([]kHolder(nil), hs...), h))
		if !ok {
			return nil
		}
		return []kindsState{n}
	}
	without := func(i int) kindsState {
		n, _ := p.withHolders(append(append([]kHolder(nil), hs[:i]...), hs[i+1:]...))
		return n
	}
	phantom := kHolder{Phantom: true, Shared: in.Shared}
	room := m.room(hs, in.Shared)
	switch in.Kind {
	case OpAcquire:
		switch out.Result {
		case OutOK:
			if !room || out.Token <= p.MaxTok {
				return nil
			}
			for _, h := range hs {
				if h.Token == out.Token {
					return nil
				}
			}
			n := add(kHolder{Token: out.Token, Shared: in.Shared, Since: out.Since, Lease: out.Lease})
			for i := range n {
				n[i].MaxTok = out.Token
			}
			return n
		case OutHeld:
			if !room {
				return []kindsState{p}
			}
		case OutTimeout:
			if !room {
				return []kindsState{p}
			}
			return add(phantom)
		case OutUnknown:
			if room {
				return append([]kindsState{p}, add(phantom)...)
			}
			return []kindsState{p}
		}
	case OpRelease:
		switch out.Result {
		case OutOK:
			if idx >= 0 {
				return []kindsState{without(idx)}
			}
		case OutNotFound:
			if idx < 0 {
				return []kindsState{p}
			}
		case OutUnknown:
			if idx >= 0 {
				return []kindsState{p, without(idx)}
			}
			return []kindsState{p}
		}
	case OpRenew:
		switch out.Result {
		case OutOK:
			if idx >= 0 {
				r := p
				h := &r.H[idx]
				if out.Since+out.Lease > h.RSince+h.RLease {
					h.RSince, h.RLease = out.Since, out.Lease
				}
				return []kindsState{r}
			}
		case OutNotFound:
			if idx < 0 || m.endsNotBefore(hs[idx], in.Return) <= in.Return {
				return []kindsState{p}
			}
		}
	case OpGet:
		if out.Result == OutOK {
			return m.get(p, out)
		}
	}
	return nil
}

// get matches a get's holders against p: every holder shown, nothing
// else, phantoms with unknown tokens taking the shown tokens no holder
// explains (tokens no acquire returned), and a read/write lock's mode.
func (m *kindsModel) get(p kindsState, out kindsOutput) []kindsState {
	hs := p.holders()
	if len(out.Holders) != len(hs) {
		return nil
	}
	if m.kind == LockRW && len(hs) > 0 {
		for _, h := range hs {
			if h.Shared != out.Shared {
				return nil
			}
		}
		if !out.Shared && len(hs) != 1 {
			return nil
		}
	}
	shown := map[uint64]bool{}
	for _, t := range out.Holders {
		shown[t] = true
	}
	var unbound []int
	for i, h := range hs {
		switch {
		case h.Token == 0:
			unbound = append(unbound, i)
		case shown[h.Token]:
			delete(shown, h.Token)
		default:
			return nil
		}
	}
	if len(shown) != len(unbound) {
		return nil
	}
	if len(unbound) == 0 {
		return []kindsState{p}
	}
	rest := make([]uint64, 0, len(shown))
	for t := range shown {
		if m.known[t] {
			return nil
		}
		rest = append(rest, t)
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	bound := append([]kHolder(nil), hs...)
	for j, i := range unbound {
		bound[i].Token = rest[j]
	}
	n, _ := p.withHolders(bound)
	return []kindsState{n}
}

func (m *kindsModel) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{kindsState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := m.step(state.(kindsState), input.(kindsInput), output.(kindsOutput))
			out := make([]interface{}, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Equal: func(a, b interface{}) bool { return a.(kindsState) == b.(kindsState) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(kindsInput), output.(kindsOutput)
			mode := ""
			if in.Shared {
				mode = " shared"
			}
			switch in.Kind {
			case OpAcquire:
				if out.Result == OutOK {
					return fmt.Sprintf("acquire%s -> %d (until %s)", mode, out.Token, ms(out.Since+out.Lease))
				}
				return "acquire" + mode + " -> " + string(out.Result)
			case OpRelease:
				return fmt.Sprintf("release(%d) -> %s", in.Token, out.Result)
			case OpRenew:
				if out.Result == OutOK {
					return fmt.Sprintf("renew(%d) -> until %s", in.Token, ms(out.Since+out.Lease))
				}
				return fmt.Sprintf("renew(%d) -> %s", in.Token, out.Result)
			default:
				if len(out.Holders) == 0 {
					return "get -> free"
				}
				if out.Shared {
					mode = " shared"
				}
				return fmt.Sprintf("get -> %v%s", out.Holders, mode)
			}
		},
		DescribeState: func(state interface{}) string {
			s := state.(kindsState)
			var parts []string
			for _, h := range s.holders() {
				d := fmt.Sprintf("%d", h.Token)
				if h.Phantom {
					d = "unknown grant"
					if h.Token != 0 {
						d = fmt.Sprintf("%d (unknown grant)", h.Token)
					}
				} else {
					d += " until " + ms(max(h.Since+h.Lease, h.RSince+h.RLease))
				}
				if h.Shared {
					d += " shared"
				}
				parts = append(parts, d)
			}
			d := "free"
			if len(parts) > 0 {
				d = "held by " + strings.Join(parts, ", ")
			}
			if s.NotBefore > 0 {
				d += fmt.Sprintf(", not before %s", ms(s.NotBefore))
			}
			return d
		},
	}
	return nm.ToModel()
}

// kindsReservedHeld is reservedHeld for a semaphore or read/write key,
// where a held answer with room may also come from FIFO: a waiting
// request queued before it. A waiting acquire was queued whatever its
// outcome, held included (the SDK's last retry of a wait that ran out is
// a try), so every acquire of another client that waited, or was not
// answered held, counts as in flight from its call to its return.
func kindsReservedHeld(ops []Op) map[int]bool {
	return heldWhileInFlight(ops, func(o Op) bool { return o.Result != OutHeld || o.Wait > 0 })
}

// kindsPorcupineOps is porcupineOps for a semaphore or read/write key.
func kindsPorcupineOps(ops []Op, lenient bool) []porcupine.Operation {
	var out []porcupine.Operation
	skip := map[int]bool{}
	if lenient {
		skip = kindsReservedHeld(ops)
	}
	for _, o := range ops {
		if o.Result == OutFail || skip[o.ID] || (o.Kind == OpRenew && o.Result == OutUnknown) {
			continue
		}
		in := kindsInput{Kind: o.Kind, Call: o.Call, Return: o.Return}
		res := kindsOutput{Result: o.Result}
		switch o.Kind {
		case OpAcquire:
			in.Shared = o.Shared
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
			res.Holders, res.Shared = shownHolders(o), o.Shared
		}
		if o.Result == OutUnknown {
			in.Return = math.MaxInt64
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: in, Call: in.Call, Output: res, Return: in.Return, Metadata: o.ID})
	}
	return out
}

// shownHolders is every token a get ok showed, in order: Holders, or the
// one holder of a key held exclusively.
func shownHolders(o Op) []uint64 {
	if len(o.Holders) > 0 {
		hs := append([]uint64(nil), o.Holders...)
		sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
		return hs
	}
	if o.Held {
		return []uint64{o.Token}
	}
	return nil
}
