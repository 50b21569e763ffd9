package faults

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one broken safety property, with the operations that show
// it.
type Violation struct {
	Checker string `json:"checker"`
	Round   int    `json:"round"`
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
	Ops     []Op   `json:"ops,omitempty"`
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] round %d", v.Checker, v.Round)
	if v.Key != "" {
		fmt.Fprintf(&b, " key %s", v.Key)
	}
	b.WriteString(": ")
	b.WriteString(v.Message)
	for _, o := range v.Ops {
		b.WriteString("\n      ")
		b.WriteString(o.String())
	}
	return b.String()
}

// CheckOptions tune the checkers.
type CheckOptions struct {
	// Slack is subtracted from every "cannot have expired before"
	// bound, for timestamp rounding (the SDK sends leases in whole ms).
	Slack time.Duration
	// LinearizabilityTimeout bounds porcupine per key; past it the
	// result is Unknown (inconclusive, not a violation).
	LinearizabilityTimeout time.Duration
	// VisualizeDir, when set, receives a porcupine visualization of every
	// key whose history is not linearizable (or of every key with
	// VisualizeAll).
	VisualizeDir string
	VisualizeAll bool
	// Faults are the round's faults: the FIFO check of semaphores and
	// read/write locks (kinds_check.go) only judges waiters queued while
	// no fault was under way.
	Faults []Fault
}

// CheckResult is the verdict on one round.
type CheckResult struct {
	Violations []Violation
	// Excused lists lease overlaps explained only by forward jumps of a
	// lease clock: the leader cut a lease short, and fencing (token
	// order) had to keep the resource safe.
	Excused []string
	// Linearizable is porcupine's verdict per key.
	Linearizable map[string]porcupine.CheckResult
	// Visualizations are the HTML files written.
	Visualizations []string
	// ReservedKeys lists the keys whose history is linearizable only
	// when held answers given while another client's acquire was in
	// flight are left out (see reservedHeld).
	ReservedKeys []string
	// Fenced counts resource writes by a holder whose lock was still
	// valid by its SDK deadline but that the resource rejected (a higher
	// token had written): each is an overlap, excused or not.
	Fenced, Accepted int
	// FIFOPairs counts the pairs of grants on semaphore and read/write
	// keys the FIFO check judged (kinds_check.go).
	FIFOPairs int
}

// Check runs every checker on one round's records.
func Check(round int, ops []Op, writes []Write, jumps []Jump, opt CheckOptions) CheckResult {
	res := CheckResult{Linearizable: map[string]porcupine.CheckResult{}}
	jt := newJumpTimeline(jumps)
	slack := int64(opt.Slack)
	byKey := map[string][]Op{}
	for _, o := range ops {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	add := func(v Violation) {
		v.Round = round
		res.Violations = append(res.Violations, v)
	}
	kindKeys := map[string]bool{}
	for _, key := range keys {
		kops := byKey[key]
		if kind, limit := keyKind(kops); kind != LockMutex {
			// Semaphores and read/write locks: kinds_check.go.
			kindKeys[key] = true
			res.checkKindsKey(round, key, kind, limit, kops, jt, slack, opt, add)
			continue
		}
		for _, v := range checkTokens(key, kops) {
			add(v)
		}
		for _, v := range checkAcks(key, kops, jt, slack) {
			add(v)
		}
		for _, v := range checkRenewals(key, kops, jt, slack) {
			add(v)
		}
		vs, excused := checkExclusion(key, kops, jt, slack)
		for _, v := range vs {
			add(v)
		}
		res.Excused = append(res.Excused, excused...)
		lin, reserved, file, err := checkLinearizable(round, key, kops, jt, slack, opt)
		if reserved {
			res.ReservedKeys = append(res.ReservedKeys, key)
		}
		res.Linearizable[key] = lin
		if file != "" {
			res.Visualizations = append(res.Visualizations, file)
		}
		if err != nil {
			add(Violation{Checker: "visualize", Key: key, Message: err.Error()})
		}
		if lin == porcupine.Illegal {
			n, excerpt := explainIllegal(kops, jt, slack)
			add(Violation{Checker: "linearizability", Key: key,
				Message: fmt.Sprintf("the history of this key is not linearizable under the lock model; the first %d operations (by call time) already are not, ending with #%d; its operations of the last 2s (and indeterminate ones of the last 10s) follow%s",
					n, excerpt[len(excerpt)-1].ID, seeFile(file)),
				Ops: excerpt})
		}
	}
	mutexWrites, kindWrites := splitWrites(writes, kindKeys)
	vs, fenced, accepted := checkWrites(ops, mutexWrites, jt, slack)
	for _, v := range vs {
		add(v)
	}
	res.Fenced, res.Accepted = fenced, accepted
	vs, fenced, accepted = checkUses(ops, kindWrites, jt, slack)
	for _, v := range vs {
		add(v)
	}
	res.Fenced, res.Accepted = res.Fenced+fenced, res.Accepted+accepted
	return res
}

func seeFile(f string) string {
	if f == "" {
		return ""
	}
	return " (see " + f + ")"
}

// checkLinearizable runs porcupine on one key: strictly first, and if
// that fails, leaving out the held answers a reservation may explain
// (reserved reports that only the lenient check passed).
func checkLinearizable(round int, key string, ops []Op, jt jumpTimeline, slack int64, opt CheckOptions) (_ porcupine.CheckResult, reserved bool, _ string, _ error) {
	lm := &lockModel{known: map[uint64]bool{}, jumps: jt, slack: slack}
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			lm.known[o.Token] = true
		}
	}
	model := lm.porcupine()
	timeout := opt.LinearizabilityTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	verdict, info := porcupine.CheckOperationsVerbose(model, porcupineOps(ops, false), timeout)
	if verdict == porcupine.Illegal && len(reservedHeld(ops)) > 0 {
		if v, i := porcupine.CheckOperationsVerbose(model, porcupineOps(ops, true), timeout); v != porcupine.Illegal {
			verdict, info, reserved = v, i, true
		}
	}
	if opt.VisualizeDir == "" || !(verdict == porcupine.Illegal || opt.VisualizeAll) {
		return verdict, reserved, "", nil
	}
	name := fmt.Sprintf("round%d-%s.html", round, sanitize(key))
	path := filepath.Join(opt.VisualizeDir, name)
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return verdict, reserved, "", fmt.Errorf("porcupine visualization %s: %w", path, err)
	}
	return verdict, reserved, path, nil
}

// explainIllegal finds a short non-linearizable prefix of a key's history
// (operations by call time; binary search, so the shortest one found, not
// necessarily the shortest there is) and returns its length and the
// operations of its last two seconds, the excerpt a reader needs.
func explainIllegal(ops []Op, jt jumpTimeline, slack int64) (int, []Op) {
	return shortestIllegal(ops, func(prefix []Op) bool {
		lm := &lockModel{known: map[uint64]bool{}, jumps: jt, slack: slack}
		for _, o := range ops {
			if o.Kind == OpAcquire && o.Result == OutOK {
				lm.known[o.Token] = true
			}
		}
		r, _ := porcupine.CheckOperationsVerbose(lm.porcupine(), porcupineOps(prefix, true), 10*time.Second)
		return r == porcupine.Illegal
	})
}

// shortestIllegal finds, by bisection, the shortest prefix of ops (by
// call time) that illegal refuses, and returns its length and its
// operations of the last 2s before its last call (and indeterminate ones
// of the last 10s), at most 80.
func shortestIllegal(ops []Op, illegal func(prefix []Op) bool) (int, []Op) {
	sorted := append([]Op(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	lo, hi := 1, len(sorted)
	for lo < hi {
		if m := (lo + hi) / 2; illegal(sorted[:m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	last := sorted[hi-1]
	var excerpt []Op
	for _, o := range sorted[:hi] {
		if o.Return >= last.Call-int64(2*time.Second) || (o.Result == OutUnknown && o.Call >= last.Call-int64(10*time.Second)) {
			excerpt = append(excerpt, o)
		}
	}
	if len(excerpt) > 80 {
		excerpt = excerpt[len(excerpt)-80:]
	}
	return hi, excerpt
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// checkTokens: tokens of granted acquires are unique per key, and every
// grant's token is above every token observed (granted or seen by a get)
// by operations that completed before the acquire was invoked; a get never
// shows a token older than one observed before it started, and no renewal
// of such an older token is confirmed (it would revive an ended lock).
func checkTokens(key string, ops []Op) []Violation {
	var vs []Violation
	byToken := map[uint64]Op{}
	var obs []Op // acquire ok and get held, by return time
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			if prev, dup := byToken[o.Token]; dup {
				vs = append(vs, Violation{Checker: "tokens", Key: key, Message: fmt.Sprintf("token %d granted twice", o.Token), Ops: []Op{prev, o}})
			}
			byToken[o.Token] = o
			obs = append(obs, o)
		}
		if o.Kind == OpGet && o.Result == OutOK && o.Held {
			obs = append(obs, o)
		}
	}
	done := append([]Op(nil), obs...)
	sort.Slice(done, func(i, j int) bool { return done[i].Return < done[j].Return })
	started := append([]Op(nil), obs...)
	for _, o := range ops {
		if o.Kind == OpRenew && o.Result == OutOK {
			started = append(started, o)
		}
	}
	sort.Slice(started, func(i, j int) bool { return started[i].Call < started[j].Call })
	var best Op // highest token among ops completed so far
	i := 0
	for _, o := range started {
		for i < len(done) && done[i].Return < o.Call {
			if done[i].Token > best.Token {
				best = done[i]
			}
			i++
		}
		if best.Token == 0 {
			continue
		}
		switch {
		case o.Kind == OpAcquire && o.Token <= best.Token:
			vs = append(vs, Violation{Checker: "tokens", Key: key,
				Message: fmt.Sprintf("grant of token %d after token %d was already observed: tokens must increase", o.Token, best.Token),
				Ops:     []Op{best, o}})
		case o.Kind == OpGet && o.Token < best.Token:
			vs = append(vs, Violation{Checker: "tokens", Key: key,
				Message: fmt.Sprintf("get shows token %d after token %d was observed: a stale lock reappeared", o.Token, best.Token),
				Ops:     []Op{best, o}})
		case o.Kind == OpRenew && o.Token < best.Token:
			vs = append(vs, Violation{Checker: "tokens", Key: key,
				Message: fmt.Sprintf("renewal of token %d confirmed after token %d was observed: an ended lock was renewed", o.Token, best.Token),
				Ops:     []Op{best, o}})
		}
	}
	return vs
}

// checkAcks: an acknowledged release is never undone (a get invoked after
// it never shows the token, no renewal invoked after it is confirmed), and
// an acknowledged grant is visible to every get invoked after the
// acknowledgement that completes before its lease can have ended (by the
// grant and the renewals confirmed before the get was invoked), unless a
// release of that token was invoked.
func checkAcks(key string, ops []Op, jt jumpTimeline, slack int64) []Violation {
	var vs []Violation
	var gets []Op
	releases := map[uint64][]Op{}
	renews := confirmedRenewals(ops)
	for _, o := range ops {
		switch {
		case o.Kind == OpGet && o.Result == OutOK:
			gets = append(gets, o)
		case o.Kind == OpRelease:
			releases[o.Token] = append(releases[o.Token], o)
		}
	}
	sort.Slice(gets, func(i, j int) bool { return gets[i].Call < gets[j].Call })
	for tok, rs := range releases {
		for _, r := range rs {
			if r.Result == OutOK {
				vs = append(vs, releaseUndone(key, r, gets, renews[tok])...)
			}
		}
	}
	for _, a := range ops {
		if a.Kind != OpAcquire || a.Result != OutOK {
			continue
		}
		releaseCalled := int64(math.MaxInt64)
		for _, r := range releases[a.Token] {
			releaseCalled = min(releaseCalled, r.Call)
		}
		last := a.Deadline
		for _, n := range renews[a.Token] {
			last = max(last, n.Deadline)
		}
		for _, g := range gets {
			if g.Call <= a.Return {
				continue
			}
			if g.Call >= last {
				break
			}
			if g.Return >= releaseCalled || g.Return >= holdsUntil(a, renews[a.Token], g.Call, g.Return, jt, slack) {
				continue
			}
			if !shows(g, a.Token) {
				what := "free"
				if g.Held {
					what = fmt.Sprintf("held by %v", shownHolders(g))
				}
				vs = append(vs, Violation{Checker: "acked-grant", Key: key,
					Message: fmt.Sprintf("token %d was granted (acknowledged) and its lease (renewed: %v) cannot have ended, but a get shows the key %s", a.Token, renewedBefore(renews[a.Token], g.Call), what),
					Ops:     []Op{a, g}})
				break
			}
		}
	}
	return vs
}

// releaseUndone: after release r was acknowledged, no get invoked later
// shows its token and no renewal invoked later is confirmed.
func releaseUndone(key string, r Op, gets, renews []Op) []Violation {
	var vs []Violation
	for _, g := range gets {
		if g.Call > r.Return && shows(g, r.Token) {
			vs = append(vs, Violation{Checker: "acked-release", Key: key,
				Message: fmt.Sprintf("token %d was released (acknowledged) but a later get still shows it", r.Token), Ops: []Op{r, g}})
			break
		}
	}
	for _, n := range renews {
		if n.Call > r.Return {
			vs = append(vs, Violation{Checker: "acked-release", Key: key,
				Message: fmt.Sprintf("token %d was released (acknowledged) but a later renewal of it was confirmed", r.Token), Ops: []Op{r, n}})
			break
		}
	}
	return vs
}

// validity is when a holder may act on its lock: from the acquire's
// acknowledgement to its latest deadline (the grant's or a confirmed
// renewal's), or to its release call if earlier. promises are the grant's
// and every confirmed renewal's, the grant's first.
type validity struct {
	op         Op
	start, end int64
	promises   []promise
}

func validities(ops []Op) []validity {
	releaseCall := map[uint64]int64{}
	for _, o := range ops {
		if o.Kind == OpRelease {
			if c, ok := releaseCall[o.Token]; !ok || o.Call < c {
				releaseCall[o.Token] = o.Call
			}
		}
	}
	renews := confirmedRenewals(ops)
	var vs []validity
	for _, o := range ops {
		if o.Kind != OpAcquire || o.Result != OutOK {
			continue
		}
		ps := promisesOf(o, renews[o.Token])
		end := o.Deadline
		for _, p := range ps {
			end = max(end, p.End)
		}
		if c, ok := releaseCall[o.Token]; ok && c < end {
			end = c
		}
		if end > o.Return {
			vs = append(vs, validity{op: o, start: o.Return, end: end, promises: ps})
		}
	}
	return vs
}

// cutShort reports whether forward clock jumps explain why a lock may
// already have ended at time t although its holder's deadline had not
// passed: every promise it was given (ps: the grant's first, then every
// confirmed renewal's), shortened by the forward jumps since it, ended by
// t. A renewal confirmed for a lock that had ended is a violation of its
// own, so every confirmed renewal counts, whenever it was invoked.
func cutShort(ps []promise, t int64, jt jumpTimeline, slack int64) bool {
	if len(ps) == 0 || jt.forward(ps[0].From, t) == 0 {
		return false
	}
	for _, p := range ps {
		if p.End-jt.forward(p.From, t)-slack > t {
			return false
		}
	}
	return true
}

// checkExclusion: no two holders of the same key are valid at once. The
// lock with the lower token was granted first; the other must have been
// granted after it was released or expired, and it cannot have expired
// before its SDK deadline (moved by confirmed renewals) unless a lease
// clock jumped forward (then the overlap is excused and only fencing
// protects the resource).
func checkExclusion(key string, ops []Op, jt jumpTimeline, slack int64) ([]Violation, []string) {
	vals := validities(ops)
	sort.Slice(vals, func(i, j int) bool { return vals[i].op.Token < vals[j].op.Token })
	var vs []Violation
	var excused []string
	for i := range vals {
		a := vals[i]
		for _, b := range vals[i+1:] {
			if !(b.start < a.end && a.start < b.end) {
				continue
			}
			if cutShort(a.promises, b.start, jt, slack) {
				excused = append(excused, fmt.Sprintf("key %s: token %d valid until %s overlapped token %d from %s (lease cut short by a forward clock jump of %v)",
					key, a.op.Token, ms(a.end), b.op.Token, ms(b.start), time.Duration(jt.forward(a.op.Since(), b.start))))
				continue
			}
			vs = append(vs, Violation{Checker: "mutual-exclusion", Key: key,
				Message: fmt.Sprintf("holders of tokens %d and %d were both valid by their SDK deadlines (renewed: %v) between %s and %s",
					a.op.Token, b.op.Token, len(a.promises) > 1, ms(max(a.start, b.start)), ms(min(a.end, b.end))),
				Ops: append([]Op{a.op, b.op}, lastRenewal(ops, a.op)...)})
		}
	}
	return vs, excused
}

// checkWrites: the fenced resource. A write is only attempted while the
// writer's lock is valid by its SDK deadline. A rejected write means a
// higher token had written first while this holder was still valid: an
// overlap that only a forward clock jump may explain. Accepted writes per
// key must carry non-decreasing tokens (the resource's own invariant).
func checkWrites(ops []Op, writes []Write, jt jumpTimeline, slack int64) ([]Violation, int, int) {
	grants, renews := grantsAndRenewals(ops)
	var vs []Violation
	fenced, accepted := 0, 0
	reported := map[string]bool{}
	last := map[string]uint64{}
	ws := append([]Write(nil), writes...)
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].At < ws[j].At })
	for _, w := range ws {
		if w.Accepted {
			accepted++
			if w.Token < last[w.Key] {
				vs = append(vs, Violation{Checker: "fencing", Key: w.Key, Message: fmt.Sprintf("the resource accepted token %d after token %d", w.Token, last[w.Key])})
			}
			last[w.Key] = max(last[w.Key], w.Token)
			continue
		}
		fenced++
		a, ok := grants[w.Key][w.Token]
		if !ok {
			vs = append(vs, Violation{Checker: "fencing", Key: w.Key, Message: fmt.Sprintf("a write with token %d that no acquire returned", w.Token)})
			continue
		}
		if cutShort(promisesOf(a, renews[w.Key][w.Token]), w.At, jt, slack) {
			continue
		}
		id := fmt.Sprintf("%s/%d", w.Key, w.Token)
		if reported[id] {
			continue
		}
		reported[id] = true
		higher := lastRenewal(ops, a)
		if b, ok := grants[w.Key][w.Highest]; ok {
			higher = append(higher, b)
		}
		vs = append(vs, Violation{Checker: "fenced-resource", Key: w.Key,
			Message: fmt.Sprintf("the holder of token %d, valid by its SDK deadline at %s, was fenced by token %d: two holders were valid at once",
				w.Token, ms(w.At), w.Highest),
			Ops: append([]Op{a}, higher...)})
	}
	return vs, fenced, accepted
}

// grantsAndRenewals indexes the granted acquires by key and token, and
// the confirmed renewals by key and token (confirmedRenewals).
func grantsAndRenewals(ops []Op) (map[string]map[uint64]Op, map[string]map[uint64][]Op) {
	grants := map[string]map[uint64]Op{}
	renewOps := map[string][]Op{}
	for _, o := range ops {
		if o.Kind == OpAcquire && o.Result == OutOK {
			if grants[o.Key] == nil {
				grants[o.Key] = map[uint64]Op{}
			}
			grants[o.Key][o.Token] = o
		}
		if o.Kind == OpRenew {
			renewOps[o.Key] = append(renewOps[o.Key], o)
		}
	}
	renews := map[string]map[uint64][]Op{}
	for k, kops := range renewOps {
		renews[k] = confirmedRenewals(kops)
	}
	return grants, renews
}
