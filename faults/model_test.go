package faults

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Hand-made histories: each checker must accept the legal ones and catch
// the broken ones. Times are in milliseconds for readability.

const msec = int64(time.Millisecond)

type hb struct {
	ops []Op
}

func (b *hb) add(o Op) *hb {
	o.ID = len(b.ops)
	if o.Key == "" {
		o.Key = "k"
	}
	b.ops = append(b.ops, o)
	return b
}

// acq: a granted acquire [call, ret] with the SDK send time at call and
// the given lease (all ms).
func (b *hb) acq(client int, call, ret int64, token uint64, lease int64) *hb {
	return b.add(Op{Client: client, Kind: OpAcquire, Call: call * msec, Return: ret * msec, Result: OutOK, Token: token,
		Lease: lease * msec, Granted: lease * msec, Deadline: (call + lease) * msec})
}

func (b *hb) acqOut(client int, call, ret int64, out Outcome) *hb {
	return b.add(Op{Client: client, Kind: OpAcquire, Call: call * msec, Return: ret * msec, Result: out, Lease: 1000 * msec})
}

func (b *hb) rel(client int, call, ret int64, token uint64, out Outcome) *hb {
	return b.add(Op{Client: client, Kind: OpRelease, Call: call * msec, Return: ret * msec, Token: token, Result: out})
}

func (b *hb) get(client int, call, ret int64, token uint64) *hb {
	return b.add(Op{Client: client, Kind: OpGet, Call: call * msec, Return: ret * msec, Result: OutOK, Held: token != 0, Token: token})
}

func check(b *hb, jumps ...Jump) CheckResult {
	return Check(0, b.ops, nil, jumps, CheckOptions{LinearizabilityTimeout: 10 * time.Second})
}

func checkers(res CheckResult) string {
	var names []string
	for _, v := range res.Violations {
		names = append(names, v.Checker)
	}
	return strings.Join(names, ",")
}

func TestModelLegalHistories(t *testing.T) {
	cases := map[string]*hb{
		"acquire release get": new(hb).
			acq(0, 0, 10, 1, 1000).get(1, 20, 30, 1).rel(0, 40, 50, 1, OutOK).get(1, 60, 70, 0),
		"held while held, then expiry after the deadline": new(hb).
			acq(0, 0, 10, 1, 500).acqOut(1, 20, 30, OutHeld).get(1, 400, 410, 1).
			get(1, 600, 610, 0).acq(1, 620, 630, 2, 500),
		"concurrent acquires, one wins": new(hb).
			acq(0, 0, 50, 1, 1000).acqOut(1, 10, 40, OutHeld),
		"release after expiry finds nothing": new(hb).
			acq(0, 0, 10, 1, 300).rel(0, 400, 410, 1, OutNotFound),
		"an indeterminate acquire explains an unknown token": new(hb).
			acqOut(0, 0, 100, OutUnknown).get(1, 200, 210, 7).acqOut(2, 220, 230, OutHeld).get(1, 300, 310, 0),
		"a timed-out acquire may have granted and released": new(hb).
			acqOut(0, 0, 100, OutTimeout).get(1, 50, 60, 9).get(1, 70, 80, 0),
		"an indeterminate release may have released": new(hb).
			acq(0, 0, 10, 1, 5000).rel(0, 20, 30, 1, OutUnknown).get(1, 40, 50, 0).acq(1, 60, 70, 2, 100),
		"an indeterminate release may have done nothing": new(hb).
			acq(0, 0, 10, 1, 5000).rel(0, 20, 30, 1, OutUnknown).get(1, 40, 50, 1),
		"waiting acquire granted after release": new(hb).
			acq(0, 0, 10, 1, 5000).add(Op{Client: 1, Kind: OpAcquire, Call: 20 * msec, Return: 200 * msec, Result: OutOK, Token: 2,
			Lease: 1000 * msec, Granted: 1000 * msec, Deadline: 1020 * msec}).rel(0, 100, 110, 1, OutOK),
		// Seen in a run under 30% message loss: the Grant of the waiter
		// for token 44 took ~400ms to commit; meanwhile the leader
		// answered try-acquires with held (the key was reserved) and a
		// linearizable get with free.
		"held while another client's grant is pending, free to a get": new(hb).
			acq(0, 0, 10, 41, 5000).rel(0, 20, 30, 41, OutOK).
			add(Op{Client: 1, Kind: OpAcquire, Call: 15 * msec, Return: 500 * msec, Result: OutOK, Token: 44,
				Lease: 2000 * msec, Granted: 2000 * msec, Deadline: 2015 * msec}).
			acqOut(2, 40, 41, OutHeld).get(3, 300, 310, 0).get(3, 520, 530, 44),
		"failed operations are ignored": new(hb).
			acq(0, 0, 10, 1, 1000).add(Op{Client: 1, Kind: OpAcquire, Call: 20 * msec, Return: 30 * msec, Result: OutFail}).get(1, 40, 50, 1),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			res := check(b)
			if len(res.Violations) > 0 {
				for _, v := range res.Violations {
					t.Log(v.String())
				}
				t.Fatalf("legal history rejected")
			}
		})
	}
}

func TestModelCatchesViolations(t *testing.T) {
	cases := map[string]struct {
		b    *hb
		want string // checkers that must fire (all of them)
	}{
		"a get shows a granted lock free before its deadline": {
			new(hb).acq(0, 0, 10, 1, 1000).get(1, 100, 110, 0),
			"acked-grant,linearizability",
		},
		"two holders at once": {
			new(hb).acq(0, 0, 10, 1, 1000).acq(1, 100, 110, 2, 1000),
			"mutual-exclusion,linearizability",
		},
		"a released token reappears": {
			new(hb).acq(0, 0, 10, 1, 5000).rel(0, 20, 30, 1, OutOK).get(1, 40, 50, 1),
			"acked-release,linearizability",
		},
		"tokens go backwards": {
			new(hb).acq(0, 0, 10, 5, 100).get(1, 200, 210, 0).acq(1, 300, 310, 3, 100),
			"tokens",
		},
		"a token granted twice": {
			new(hb).acq(0, 0, 10, 4, 100).get(1, 200, 210, 0).acq(1, 300, 310, 4, 100),
			"tokens", // the lock model itself does not track uniqueness
		},
		"a token from nowhere": {
			new(hb).get(1, 0, 10, 42),
			"linearizability",
		},
		"held when free": {
			new(hb).acq(0, 0, 10, 1, 100).rel(0, 20, 30, 1, OutOK).acqOut(1, 40, 50, OutHeld),
			"linearizability",
		},
		"release of a live lock finds nothing": {
			new(hb).acq(0, 0, 10, 1, 5000).rel(0, 20, 30, 1, OutNotFound),
			"linearizability",
		},
		// An indeterminate op returns at infinity; it must not let a
		// known lock expire before its deadline.
		"an indeterminate op does not shorten a lease": {
			new(hb).acq(0, 0, 10, 1, 5000).acqOut(1, 20, 30, OutUnknown).get(2, 100, 110, 0),
			"acked-grant,linearizability",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res := check(c.b)
			got := checkers(res)
			for _, w := range strings.Split(c.want, ",") {
				if !strings.Contains(","+got+",", ","+w+",") {
					for _, v := range res.Violations {
						t.Log(v.String())
					}
					t.Fatalf("checker %s did not fire (got %q)", w, got)
				}
			}
		})
	}
}

// A forward jump of a lease clock may end a lease before its SDK
// deadline: the model accepts the early expiry only when a jump explains
// it, and the overlap is then excused, not a violation.
func TestModelClockJumpAllowance(t *testing.T) {
	b := new(hb).acq(0, 0, 10, 1, 2000).get(1, 500, 510, 0).acq(1, 520, 530, 2, 1000)
	res := check(b)
	if len(res.Violations) == 0 {
		t.Fatal("an early expiry without a clock jump was accepted")
	}
	res = check(b, Jump{At: 100 * msec, Node: 1, Delta: 1600 * msec})
	if len(res.Violations) > 0 {
		for _, v := range res.Violations {
			t.Log(v.String())
		}
		t.Fatal("an early expiry explained by a forward jump was rejected")
	}
	if len(res.Excused) != 1 {
		t.Fatalf("excused overlaps: %v, want one", res.Excused)
	}
	// A jump too small to explain the expiry does not excuse it.
	res = check(b, Jump{At: 100 * msec, Node: 1, Delta: 200 * msec})
	if len(res.Violations) == 0 {
		t.Fatal("a jump of 200ms excused an expiry 1.5s early")
	}
	// Backward jumps never excuse anything.
	res = check(b, Jump{At: 100 * msec, Node: 1, Delta: -1600 * msec})
	if len(res.Violations) == 0 {
		t.Fatal("a backward jump excused an early expiry")
	}
}

func TestFencedResourceChecker(t *testing.T) {
	b := new(hb).acq(0, 0, 10, 1, 2000).acq(1, 500, 510, 2, 1000)
	writes := []Write{
		{Client: 0, Key: "k", Token: 1, At: 100 * msec, Accepted: true},
		{Client: 1, Key: "k", Token: 2, At: 600 * msec, Accepted: true, Highest: 1},
		{Client: 0, Key: "k", Token: 1, At: 700 * msec, Accepted: false, Highest: 2},
	}
	res := Check(0, b.ops, writes, nil, CheckOptions{LinearizabilityTimeout: 10 * time.Second})
	if !strings.Contains(checkers(res), "fenced-resource") || res.Fenced != 1 || res.Accepted != 2 {
		t.Fatalf("fenced write of a valid holder not reported: %q fenced %d accepted %d", checkers(res), res.Fenced, res.Accepted)
	}
	res = Check(0, b.ops, writes, []Jump{{At: 100 * msec, Node: 1, Delta: 1600 * msec}}, CheckOptions{LinearizabilityTimeout: 10 * time.Second})
	if len(res.Violations) > 0 {
		t.Fatalf("a fenced write explained by a clock jump was reported: %q", checkers(res))
	}
	if res.Fenced != 1 {
		t.Fatalf("fenced = %d, want 1", res.Fenced)
	}
}

func TestJumpTimeline(t *testing.T) {
	jt := newJumpTimeline([]Jump{{At: 10, Delta: 5}, {At: 20, Delta: -3}, {At: 30, Delta: 7}})
	for _, c := range []struct{ a, b, want int64 }{
		{0, 100, 12}, {10, 10, 5}, {11, 29, 0}, {11, 30, 7}, {31, math.MaxInt64, 0}, {50, 0, 0},
	} {
		if got := jt.forward(c.a, c.b); got != c.want {
			t.Errorf("forward(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestPorcupineOpsUnknownReturnAtInfinity(t *testing.T) {
	ops := porcupineOps([]Op{
		{Kind: OpAcquire, Result: OutUnknown, Call: 1, Return: 2},
		{Kind: OpGet, Result: OutFail, Call: 1, Return: 2},
	}, true)
	if len(ops) != 1 || ops[0].Return != math.MaxInt64 {
		t.Fatalf("ops = %+v", ops)
	}
	m := (&lockModel{known: map[uint64]bool{}}).porcupine()
	if r := porcupine.CheckOperations(m, ops); !r {
		t.Fatal("a lone indeterminate acquire is not linearizable")
	}
}

func TestVisualizationOfAnIllegalKey(t *testing.T) {
	dir := t.TempDir()
	b := new(hb).acq(0, 0, 10, 1, 1000).get(1, 100, 110, 0)
	res := Check(3, b.ops, nil, nil, CheckOptions{LinearizabilityTimeout: 10 * time.Second, VisualizeDir: dir})
	if res.Linearizable["k"] != porcupine.Illegal || len(res.Visualizations) != 1 {
		t.Fatalf("verdict %v, files %v", res.Linearizable, res.Visualizations)
	}
	if fi, err := os.Stat(res.Visualizations[0]); err != nil || fi.Size() == 0 {
		t.Fatalf("visualization %s: %v", res.Visualizations[0], err)
	}
}

// The held answer of the reservation history above is not linearizable
// as an observation of the lock: only leaving it out makes the history
// legal, and a held answer with no other acquire in flight stays in.
func TestReservedHeldIsLeftOut(t *testing.T) {
	b := new(hb).
		acq(0, 0, 10, 41, 5000).rel(0, 20, 30, 41, OutOK).
		add(Op{Client: 1, Kind: OpAcquire, Call: 15 * msec, Return: 500 * msec, Result: OutOK, Token: 44,
			Lease: 2000 * msec, Granted: 2000 * msec, Deadline: 2015 * msec}).
		acqOut(2, 40, 41, OutHeld).get(3, 300, 310, 0).get(3, 520, 530, 44).
		acqOut(2, 3000, 3001, OutHeld)
	skip := reservedHeld(b.ops)
	if !skip[3] || skip[6] || len(skip) != 1 {
		t.Fatalf("reservedHeld = %v, want only op 3", skip)
	}
	lm := &lockModel{known: map[uint64]bool{41: true, 44: true}}
	if porcupine.CheckOperations(lm.porcupine(), porcupineOps(b.ops, false)) {
		t.Fatal("with the reserved held answer the history should not be linearizable")
	}
	if !porcupine.CheckOperations(lm.porcupine(), porcupineOps(b.ops, true)) {
		t.Fatal("without the reserved held answer the history should be linearizable")
	}
	res := check(b)
	if len(res.Violations) > 0 || len(res.ReservedKeys) != 1 {
		t.Fatalf("violations %q, reserved keys %v", checkers(res), res.ReservedKeys)
	}
}

// ren: a renewal of token [call, ret] with outcome out; on ok the
// holder's new deadline is call+lease (all ms).
func (b *hb) ren(client int, call, ret int64, token uint64, lease int64, out Outcome) *hb {
	o := Op{Client: client, Kind: OpRenew, Call: call * msec, Return: ret * msec, Token: token, Result: out}
	if out == OutOK {
		o.Deadline = (call + lease) * msec
	}
	return b.add(o)
}

// Renewals: a confirmed renewal extends what the holder may assume to
// (renew call + lease) minus forward jumps; an unknown one extends
// nothing; a refused one while the lock cannot have ended, or a confirmed
// one after the lock ended, is a violation.
func TestModelRenewals(t *testing.T) {
	jump := func(at, d int64) []Jump { return []Jump{{At: at * msec, Node: 1, Delta: d * msec}} }
	cases := map[string]struct {
		b     *hb
		jumps []Jump
		want  string // checkers that must fire; "" for a legal history
	}{
		"renewed lock held past the grant's deadline": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).
				get(1, 1500, 1510, 1).acqOut(2, 1600, 1610, OutHeld).get(1, 1900, 1910, 0).acq(2, 1920, 1930, 2, 500),
		},
		"grant to another token after the renewed deadline": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).acq(1, 1850, 1860, 2, 500),
		},
		"grant to another token before the renewed deadline": {
			b:    new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).acq(1, 1500, 1510, 2, 500),
			want: "mutual-exclusion,linearizability",
		},
		"grant before the renewed deadline excused by a forward jump after the renewal": {
			b:     new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).acq(1, 1500, 1510, 2, 500),
			jumps: jump(900, 400),
		},
		// Jumps before the renewal do not cut the renewed lease: it was
		// re-armed after them.
		"a forward jump before the renewal excuses nothing": {
			b:     new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).acq(1, 1500, 1510, 2, 500),
			jumps: jump(100, 900),
			want:  "mutual-exclusion,linearizability",
		},
		"a get shows a renewed lock free before its deadline": {
			b:    new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).get(1, 1200, 1210, 0),
			want: "acked-grant,linearizability",
		},
		"an unknown renewal extends nothing": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 0, OutUnknown).acq(1, 1100, 1110, 2, 500),
		},
		"an unknown renewal may have extended the lease": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 0, OutUnknown).get(1, 1500, 1510, 1).get(1, 2000, 2010, 0),
		},
		"renewal refused after the lease ran out": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 1100, 1110, 1, 0, OutNotFound),
		},
		// The leader refuses a lease that ran out on its clock before its
		// Expire applied; a new leader may re-arm it in full.
		"renewal refused after the lease ran out, the lock still there": {
			b: new(hb).acq(0, 0, 10, 1, 1000).ren(0, 1100, 1110, 1, 0, OutNotFound).get(1, 1150, 1160, 1).
				ren(0, 1200, 1210, 1, 1000, OutOK).get(1, 2000, 2010, 1),
		},
		// Seen in the process driver: a leader paused (SIGSTOP) while a
		// new leader granted token 15 and renewed it answered a renewal
		// of 15 from its stale lease timers when it resumed.
		"renewal refused while the lock was renewed and a get shows it": {
			b: new(hb).acq(4, 9360, 9491, 15, 1589).ren(4, 10022, 10050, 15, 1590, OutOK).
				get(2, 10540, 10913, 15).ren(4, 10581, 10892, 15, 0, OutNotFound),
			want: "renew-refused,linearizability",
		},
		"renewal refused while the lock cannot have ended": {
			b:    new(hb).acq(0, 0, 10, 1, 1000).ren(0, 500, 510, 1, 0, OutNotFound),
			want: "renew-refused,linearizability",
		},
		"renewal refused before the renewed deadline": {
			b:    new(hb).acq(0, 0, 10, 1, 1000).ren(0, 800, 810, 1, 1000, OutOK).ren(0, 1200, 1210, 1, 0, OutNotFound),
			want: "renew-refused,linearizability",
		},
		"renewal refused early, explained by a forward jump": {
			b:     new(hb).acq(0, 0, 10, 1, 1000).ren(0, 500, 510, 1, 0, OutNotFound),
			jumps: jump(100, 600),
		},
		"renewal confirmed after a release": {
			b:    new(hb).acq(0, 0, 10, 1, 5000).rel(0, 100, 110, 1, OutOK).ren(0, 200, 210, 1, 5000, OutOK),
			want: "acked-release,linearizability",
		},
		"renewal confirmed after a get saw the lock expired": {
			b:    new(hb).acq(0, 0, 10, 1, 1000).get(1, 1100, 1110, 0).ren(0, 1200, 1210, 1, 1000, OutOK),
			want: "renew-after-end,linearizability",
		},
		"renewal confirmed after another token was granted": {
			b:    new(hb).acq(0, 0, 10, 1, 300).acq(1, 400, 410, 2, 1000).ren(0, 500, 510, 1, 1000, OutOK),
			want: "tokens,mutual-exclusion,linearizability",
		},
		"renewal confirmed after the holder's deadline, lock still held": {
			b: new(hb).acq(0, 0, 10, 1, 300).ren(0, 280, 400, 1, 300, OutOK).get(1, 450, 460, 1).acq(1, 700, 710, 2, 300),
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res := check(c.b, c.jumps...)
			got := checkers(res)
			if c.want == "" {
				if got != "" {
					for _, v := range res.Violations {
						t.Log(v.String())
					}
					t.Fatalf("legal history rejected: %q", got)
				}
				return
			}
			for _, w := range strings.Split(c.want, ",") {
				if !strings.Contains(","+got+",", ","+w+",") {
					for _, v := range res.Violations {
						t.Log(v.String())
					}
					t.Fatalf("checker %s did not fire (got %q)", w, got)
				}
			}
		})
	}
}
