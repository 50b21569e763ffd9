package faults

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checkers of semaphore and read/write keys (issue 25). Check runs
// them in place of checkTokens, checkExclusion and the lock model for a
// key whose acquires name a kind (Op.Lock); checkAcks and checkRenewals
// apply as they are, per holder token (shows).

// FIFO check margins: a waiter counts as queued before a later request
// only if its successful attempt was sent fifoArrival before that request
// was invoked, and only while no fault was under way from fifoArrival
// before it to fifoSettle after the fault healed (a leader elected after
// a heal has a new queue).
const (
	fifoArrival = 250 * time.Millisecond
	fifoSettle  = 2 * time.Second
)

// keyKind is the kind the acquires of a key name, and a semaphore's
// limit (the workload keeps one kind and limit per key).
func keyKind(ops []Op) (LockKind, int) {
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Lock != LockMutex {
			return o.Lock, o.Limit
		}
	}
	return LockMutex, 0
}

// shows tells whether get g showed tok among the key's holders.
func shows(g Op, tok uint64) bool {
	if !g.Held {
		return false
	}
	if len(g.Holders) == 0 {
		return g.Token == tok
	}
	return slices.Contains(g.Holders, tok)
}

// checkKindsKey runs every checker of a semaphore or read/write key.
func (res *CheckResult) checkKindsKey(round int, key string, kind LockKind, limit int, ops []Op, jt jumpTimeline, slack int64, opt CheckOptions, add func(Violation)) {
	vs := checkKindsTokens(key, ops)
	vs = append(vs, checkAcks(key, ops, jt, slack)...)
	vs = append(vs, checkRenewals(key, ops, jt, slack)...)
	ex, excused := checkKindsExclusion(key, kind, limit, ops, jt, slack)
	vs = append(vs, ex...)
	res.Excused = append(res.Excused, excused...)
	fifo, pairs := checkFIFO(key, ops, opt.Faults)
	vs = append(vs, fifo...)
	res.FIFOPairs += pairs
	for _, v := range vs {
		add(v)
	}
	m := newKindsModel(kind, limit, ops, jt, slack)
	timeout := opt.LinearizabilityTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	model := m.porcupine()
	verdict, info := porcupine.CheckOperationsVerbose(model, kindsPorcupineOps(ops, false), timeout)
	if verdict == porcupine.Illegal && len(kindsReservedHeld(ops)) > 0 {
		if v, i := porcupine.CheckOperationsVerbose(model, kindsPorcupineOps(ops, true), timeout); v != porcupine.Illegal {
			verdict, info = v, i
			res.ReservedKeys = append(res.ReservedKeys, key)
		}
	}
	res.Linearizable[key] = verdict
	var file string
	if opt.VisualizeDir != "" && (verdict == porcupine.Illegal || opt.VisualizeAll) {
		file = filepath.Join(opt.VisualizeDir, fmt.Sprintf("round%d-%s.html", round, sanitize(key)))
		if err := porcupine.VisualizePath(model, info, file); err != nil {
			add(Violation{Checker: "visualize", Key: key, Message: fmt.Sprintf("porcupine visualization %s: %v", file, err)})
			file = ""
		} else {
			res.Visualizations = append(res.Visualizations, file)
		}
	}
	if verdict == porcupine.Illegal {
		n, excerpt := explainKindsIllegal(kind, limit, ops, jt, slack)
		add(Violation{Checker: "linearizability", Key: key,
			Message: fmt.Sprintf("the history of this %s key is not linearizable under the kinds model (kinds_model.go); the first %d operations (by call time) already are not, ending with #%d; its operations of the last 2s (and indeterminate ones of the last 10s) follow%s",
				kind, n, excerpt[len(excerpt)-1].ID, seeFile(file)),
			Ops: excerpt})
	}
}

// explainKindsIllegal is explainIllegal under the kinds model.
func explainKindsIllegal(kind LockKind, limit int, ops []Op, jt jumpTimeline, slack int64) (int, []Op) {
	return shortestIllegal(ops, func(prefix []Op) bool {
		m := newKindsModel(kind, limit, ops, jt, slack)
		r, _ := porcupine.CheckOperationsVerbose(m.porcupine(), kindsPorcupineOps(prefix, true), 10*time.Second)
		return r == porcupine.Illegal
	})
}

// checkKindsTokens: tokens of granted acquires are unique per key, and
// every grant's token is above every token observed (granted, or shown
// among a get's holders) by operations that completed before the acquire
// was invoked. (A get of a multi-holder key shows older holders beside
// newer ones, so checkTokens' rule on gets does not apply; the kinds
// model checks what a get may show.)
func checkKindsTokens(key string, ops []Op) []Violation {
	var vs []Violation
	byToken := map[uint64]Op{}
	type seen struct {
		at  int64
		tok uint64
		op  Op
	}
	var obs []seen
	var acqs []Op
	for _, o := range ops {
		switch {
		case o.Kind == OpAcquire && o.Result == OutOK:
			if prev, dup := byToken[o.Token]; dup {
				vs = append(vs, Violation{Checker: "tokens", Key: key, Message: fmt.Sprintf("token %d granted twice", o.Token), Ops: []Op{prev, o}})
			}
			byToken[o.Token] = o
			obs = append(obs, seen{o.Return, o.Token, o})
			acqs = append(acqs, o)
		case o.Kind == OpGet && o.Result == OutOK && o.Held:
			for _, t := range shownHolders(o) {
				obs = append(obs, seen{o.Return, t, o})
			}
		}
	}
	sort.Slice(obs, func(i, j int) bool { return obs[i].at < obs[j].at })
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].Call < acqs[j].Call })
	var best seen
	i := 0
	for _, a := range acqs {
		for i < len(obs) && obs[i].at < a.Call {
			if obs[i].tok > best.tok {
				best = obs[i]
			}
			i++
		}
		if best.tok != 0 && a.Token <= best.tok {
			vs = append(vs, Violation{Checker: "tokens", Key: key,
				Message: fmt.Sprintf("grant of token %d after token %d was already observed: tokens must increase", a.Token, best.tok),
				Ops:     []Op{best.op, a}})
		}
	}
	return vs
}

// checkKindsExclusion: at no moment are more holders valid by their SDK
// deadlines than the key admits: a semaphore's limit, or beside an
// exclusive holder of a read/write lock any other holder ("never shared
// beside exclusive"). Validity windows are validities'; the count at
// the start of every window is the most there is. A holder whose every
// promise forward clock jumps can have cut short by then is not counted
// (the overlap is excused, fencing protects the resource).
func checkKindsExclusion(key string, kind LockKind, limit int, ops []Op, jt jumpTimeline, slack int64) ([]Violation, []string) {
	vals := validities(ops)
	sort.Slice(vals, func(i, j int) bool { return vals[i].start < vals[j].start })
	var vs []Violation
	var excused []string
	for _, b := range vals {
		var live, cut []validity
		for _, a := range vals {
			if a.op.Token == b.op.Token || !(a.start <= b.start && b.start < a.end) {
				continue
			}
			if cutShort(a.promises, b.start, jt, slack) {
				cut = append(cut, a)
			} else {
				live = append(live, a)
			}
		}
		bad := func(set []validity) bool {
			switch kind {
			case LockSemaphore:
				return len(set)+1 > limit
			default: // LockRW
				for _, a := range set {
					if !a.op.Shared || !b.op.Shared {
						return true
					}
				}
				return false
			}
		}
		if bad(live) {
			vs = append(vs, Violation{Checker: "kinds-exclusion", Key: key,
				Message: fmt.Sprintf("at %s the holder of token %d (%s) was valid beside %d other holders valid by their SDK deadlines: %s",
					ms(b.start), b.op.Token, holdMode(b.op), len(live), kindRule(kind, limit)),
				Ops: append(opsOf(live), b.op)})
			if len(vs) >= 10 {
				break
			}
		} else if bad(append(live, cut...)) {
			excused = append(excused, fmt.Sprintf("key %s: token %d from %s overlapped %d holders whose leases a forward clock jump cut short",
				key, b.op.Token, ms(b.start), len(cut)))
		}
	}
	return vs, excused
}

func opsOf(vals []validity) []Op {
	out := make([]Op, len(vals))
	for i, v := range vals {
		out[i] = v.op
	}
	return out
}

func holdMode(o Op) string {
	switch {
	case o.Lock == LockSemaphore:
		return fmt.Sprintf("semaphore of %d", o.Limit)
	case o.Shared:
		return "shared"
	}
	return "exclusive"
}

func kindRule(kind LockKind, limit int) string {
	if kind == LockSemaphore {
		return fmt.Sprintf("a semaphore of %d admits %d", limit, limit)
	}
	return "an exclusive holder admits no other holder, a shared one only shared ones"
}

// checkFIFO: one leader serves a key's requests in arrival order, so of
// two granted acquires A and B of a key, A's grant comes first (its token
// is lower) when the history shows A reached that leader first: A's
// successful attempt was sent fifoArrival before B was invoked, and no
// fault was under way from fifoArrival before that send until fifoSettle
// after both were granted (so one leader, elected before, queued both).
// This holds whatever A waited for and whatever B is: a later try with
// room for it is answered held while an earlier waiter queues (a shared
// try behind a waiting exclusive acquire), so it is never granted before
// A. pairs counts the pairs judged.
func checkFIFO(key string, ops []Op, faults []Fault) (vs []Violation, pairs int) {
	var acqs []Op
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			acqs = append(acqs, o)
		}
	}
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].Since() < acqs[j].Since() })
	calm := func(from, to int64) bool {
		for _, f := range faults {
			if f.Start <= to && from <= f.End+int64(fifoSettle) {
				return false
			}
		}
		return true
	}
	for i, a := range acqs {
		for _, b := range acqs[i+1:] {
			if a.Since()+int64(fifoArrival) >= b.Call {
				continue
			}
			if !calm(a.Since()-int64(fifoArrival), max(a.Return, b.Return)) {
				continue
			}
			pairs++
			if b.Token < a.Token {
				vs = append(vs, Violation{Checker: "fifo", Key: key,
					Message: fmt.Sprintf("token %d (%s) was granted before token %d (%s), whose request reached the same leader at least %v earlier",
						b.Token, holdMode(b), a.Token, holdMode(a), fifoArrival),
					Ops: []Op{a, b}})
				if len(vs) >= 10 {
					return vs, pairs
				}
			}
		}
	}
	return vs, pairs
}

// splitWrites separates the resource uses of semaphore and read/write
// keys (kindKeys) from the fenced writes of mutex keys.
func splitWrites(writes []Write, kindKeys map[string]bool) (mutex, kinds []Write) {
	for _, w := range writes {
		if kindKeys[w.Key] {
			kinds = append(kinds, w)
		} else {
			mutex = append(mutex, w)
		}
	}
	return mutex, kinds
}

// checkUses: the guarded resource of semaphore and read/write keys
// (resource.use). A use is attempted only while the user's lock is valid
// by its SDK deadline, and refused when holders valid by theirs already
// fill what the key admits (Write.Blocking): an overlap that only a
// forward clock jump may explain, by cutting the user's lease short or
// enough of the blocking holders' that the rest leave room.
func checkUses(ops []Op, writes []Write, jt jumpTimeline, slack int64) ([]Violation, int, int) {
	grants, renews := grantsAndRenewals(ops)
	byKey := map[string][]Op{}
	for _, o := range ops {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	var vs []Violation
	refused, accepted := 0, 0
	reported := map[string]bool{}
	for _, w := range writes {
		if w.Accepted {
			accepted++
			continue
		}
		refused++
		blocking := w.Blocking
		if len(blocking) == 0 {
			blocking = []uint64{w.Highest} // a history from before Blocking
		}
		a, ok := grants[w.Key][w.Token]
		var live []Op // blocking holders no jump can have cut short
		for _, t := range blocking {
			b, okb := grants[w.Key][t]
			if !okb {
				ok = false
			} else if !cutShort(promisesOf(b, renews[w.Key][t]), w.At, jt, slack) {
				live = append(live, b)
			}
		}
		if !ok {
			vs = append(vs, Violation{Checker: "kinds-resource", Key: w.Key, Message: fmt.Sprintf("a use by token %d refused for tokens %v, one of which no acquire returned", w.Token, blocking)})
			continue
		}
		room := 1 // a read/write lock: no live blocker
		if kind, limit := keyKind(byKey[w.Key]); kind == LockSemaphore && len(w.Blocking) > 0 {
			room = limit
		}
		if cutShort(promisesOf(a, renews[w.Key][w.Token]), w.At, jt, slack) || len(live)+1 <= room {
			continue
		}
		id := fmt.Sprintf("%s/%d", w.Key, w.Token)
		if reported[id] {
			continue
		}
		reported[id] = true
		vs = append(vs, Violation{Checker: "kinds-resource", Key: w.Key,
			Message: fmt.Sprintf("the holder of token %d (%s), valid by its SDK deadline at %s, found the resource full: %d holders valid by their deadlines (no forward jump can have cut them short) were using it",
				w.Token, holdMode(a), ms(w.At), len(live)),
			Ops: append(live, a)})
	}
	return vs, refused, accepted
}
