package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Hand-made histories of semaphore and read/write keys: every legal one
// must pass every checker, every illegal one must be refused by the
// checkers named (so a model or checker made too lax fails here).

// kb builds a history of one key of a kind (times in ms, as hb).
type kb struct {
	hb
	kind  LockKind
	limit int
}

func sem(limit int) *kb { return &kb{kind: LockSemaphore, limit: limit} }
func rw() *kb           { return &kb{kind: LockRW} }

func (b *kb) acquire(o Op) *kb {
	o.Kind, o.Lock = OpAcquire, b.kind
	if b.kind == LockSemaphore {
		o.Limit = b.limit
	}
	b.add(o)
	return b
}

// acq: a granted acquire (exclusive on a read/write key).
func (b *kb) acq(client int, call, ret int64, token uint64, lease int64) *kb {
	return b.acquire(Op{Client: client, Call: call * msec, Return: ret * msec, Result: OutOK, Token: token,
		Lease: lease * msec, Granted: lease * msec, Deadline: (call + lease) * msec})
}

// shared: a granted shared acquire.
func (b *kb) shared(client int, call, ret int64, token uint64, lease int64) *kb {
	return b.acquire(Op{Client: client, Call: call * msec, Return: ret * msec, Result: OutOK, Token: token, Shared: true,
		Lease: lease * msec, Granted: lease * msec, Deadline: (call + lease) * msec})
}

// grantSent is a grant (shared if sh) whose successful attempt was sent at send.
func (b *kb) grantSent(client int, call, send, ret int64, token uint64, lease int64, sh bool) *kb {
	return b.acquire(Op{Client: client, Call: call * msec, Return: ret * msec, Result: OutOK, Token: token, Shared: sh, Wait: 1000 * msec,
		Lease: lease * msec, Granted: lease * msec, Deadline: (send + lease) * msec})
}

func (b *kb) acqOut(client int, call, ret int64, out Outcome, sh bool) *kb {
	return b.acquire(Op{Client: client, Call: call * msec, Return: ret * msec, Result: out, Shared: sh, Lease: 1000 * msec})
}

func (b *kb) rel(client int, call, ret int64, token uint64, out Outcome) *kb {
	b.hb.rel(client, call, ret, token, out)
	return b
}

func (b *kb) renew(client int, call, ret int64, token uint64, deadline int64) *kb {
	b.add(Op{Client: client, Kind: OpRenew, Call: call * msec, Return: ret * msec, Token: token, Result: OutOK, Deadline: deadline * msec})
	return b
}

// get shows holders (none: free); sh: held shared.
func (b *kb) get(client int, call, ret int64, sh bool, holders ...uint64) *kb {
	o := Op{Client: client, Kind: OpGet, Call: call * msec, Return: ret * msec, Result: OutOK, Held: len(holders) > 0}
	if len(holders) > 0 {
		o.Token, o.Shared = holders[0], sh
		if b.kind == LockSemaphore || sh {
			o.Holders = holders
		}
	}
	b.add(o)
	return b
}

func checkKinds(b *kb, faults []Fault, writes []Write, jumps ...Jump) CheckResult {
	return Check(0, b.ops, writes, jumps, CheckOptions{LinearizabilityTimeout: 10 * time.Second, Faults: faults})
}

func TestKindsLegalHistories(t *testing.T) {
	cases := map[string]*kb{
		"semaphore: two holders, a third is held, then granted after a release": sem(2).
			acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).acqOut(2, 40, 50, OutHeld, false).
			get(3, 60, 70, false, 1, 2).rel(0, 80, 90, 1, OutOK).acq(2, 100, 110, 3, 5000).get(3, 120, 130, false, 2, 3),
		"semaphore: one holder expires, the other stays": sem(2).
			acq(0, 0, 10, 1, 300).acq(1, 20, 30, 2, 5000).acq(2, 400, 410, 3, 5000).get(3, 420, 430, false, 2, 3).
			rel(0, 440, 450, 1, OutNotFound),
		"semaphore: a renewal keeps one holder past its grant's deadline": sem(2).
			acq(0, 0, 10, 1, 300).acq(1, 20, 30, 2, 300).renew(0, 100, 110, 1, 1100).
			get(3, 500, 510, false, 1).acq(2, 520, 530, 3, 300).acqOut(3, 540, 550, OutHeld, false),
		"semaphore: an indeterminate acquire explains an unknown holder": sem(3).
			acq(0, 0, 10, 1, 5000).acqOut(1, 20, 100, OutUnknown, false).get(2, 200, 210, false, 1, 7).
			acq(3, 220, 230, 8, 5000).acqOut(4, 240, 250, OutHeld, false).get(2, 300, 310, false, 1, 8),
		"semaphore: a timed-out waiter's grant may come and go": sem(1+1).
			acq(0, 0, 10, 1, 5000).acqOut(1, 20, 500, OutTimeout, false).get(2, 100, 110, false, 1, 4).get(2, 600, 610, false, 1),
		"semaphore: waiters granted in arrival order": sem(2).
			acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).
			grantSent(2, 100, 100, 1050, 3, 5000, false).grantSent(3, 400, 400, 1150, 4, 5000, false).
			rel(0, 1000, 1010, 1, OutOK).rel(1, 1100, 1110, 2, OutOK),
		"rw: shared holders together, the exclusive waiter after both": rw().
			shared(0, 0, 10, 1, 5000).shared(1, 20, 30, 2, 5000).get(3, 40, 50, true, 1, 2).
			grantSent(2, 60, 60, 300, 3, 5000, false).rel(0, 100, 110, 1, OutOK).rel(1, 200, 210, 2, OutOK).
			get(3, 400, 410, false, 3),
		"rw: exclusive, then shared after its release": rw().
			acq(0, 0, 10, 1, 5000).acqOut(1, 20, 30, OutHeld, true).get(3, 40, 50, false, 1).rel(0, 60, 70, 1, OutOK).
			shared(1, 80, 90, 2, 5000).shared(2, 100, 110, 3, 5000).get(3, 120, 130, true, 2, 3),
		"rw: a shared try behind a waiting exclusive acquire is held (FIFO across modes)": rw().
			shared(0, 0, 10, 1, 5000).grantSent(1, 20, 20, 400, 2, 5000, false).acqOut(2, 100, 110, OutHeld, true).
			rel(0, 300, 310, 1, OutOK).get(3, 500, 510, false, 2),
		// The long run's round 18 (seed 1425803044203758985): the
		// exclusive waiter queued behind the shared holder; its wait ran
		// out over the SDK's retries, whose last attempt is a try,
		// answered held. While it queued, a shared try was held (FIFO).
		"rw: a shared try held behind an exclusive waiter answered held": rw().
			get(3, 0, 1, false).
			add2(Op{Client: 2, Kind: OpAcquire, Lock: LockRW, Call: 0, Return: 2088 * msec, Result: OutHeld, Lease: 1808 * msec, Wait: 1937 * msec}).
			shared(0, 0, 3, 1, 1394).acqOut(1, 189, 190, OutHeld, true),
		"rw: a shared holder expires beside another": rw().
			shared(0, 0, 10, 1, 300).shared(1, 20, 30, 2, 5000).get(3, 400, 410, true, 2).
			rel(0, 420, 430, 1, OutNotFound),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			res := checkKinds(b, nil, nil)
			for _, v := range res.Violations {
				t.Log(v.String())
			}
			if len(res.Violations) > 0 {
				t.Fatalf("legal history rejected")
			}
			if v := res.Linearizable["k"]; v != porcupine.Ok {
				t.Fatalf("porcupine: %v", v)
			}
		})
	}
}

func TestKindsCatchesViolations(t *testing.T) {
	cases := map[string]struct {
		b    *kb
		want string // checkers that must all fire
	}{
		"semaphore: three holders of a semaphore of two": {
			sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).acq(2, 40, 50, 3, 5000),
			"kinds-exclusion,linearizability",
		},
		"semaphore: a get misses a holder whose lease cannot have ended": {
			sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).get(2, 40, 50, false, 2),
			"acked-grant,linearizability",
		},
		"semaphore: a released holder reappears": {
			sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).rel(0, 40, 50, 1, OutOK).get(2, 60, 70, false, 1, 2),
			"acked-release,linearizability",
		},
		"semaphore: held with a free slot": {
			sem(2).acq(0, 0, 10, 1, 5000).acqOut(1, 20, 30, OutHeld, false),
			"linearizability",
		},
		"semaphore: a get shows more holders than the limit": {
			sem(2).acq(0, 0, 10, 1, 5000).acqOut(1, 20, 30, OutUnknown, false).acqOut(2, 20, 30, OutUnknown, false).
				get(3, 40, 50, false, 1, 7, 8),
			"linearizability",
		},
		"semaphore: tokens go backwards": {
			sem(2).acq(0, 0, 10, 5, 5000).acq(1, 20, 30, 3, 5000),
			"tokens,linearizability",
		},
		"semaphore: a token granted twice": {
			sem(3).acq(0, 0, 10, 4, 5000).acq(1, 20, 30, 4, 5000),
			"tokens,linearizability",
		},
		"semaphore: a concurrent grant with a lower token than one linearized before it": {
			// 3 was acquired concurrently with 5, but it can only have
			// linearized after 5 (the key was full until 1 was released).
			sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 5, 5000).
				add2(Op{Client: 2, Kind: OpAcquire, Lock: LockSemaphore, Limit: 2, Call: 15 * msec, Return: 200 * msec, Result: OutOK, Token: 3,
					Lease: 5000 * msec, Granted: 5000 * msec, Deadline: 5015 * msec}).rel(0, 100, 110, 1, OutOK),
			"linearizability",
		},
		"rw: shared beside exclusive": {
			rw().acq(0, 0, 10, 1, 5000).shared(1, 20, 30, 2, 5000),
			"kinds-exclusion,linearizability",
		},
		"rw: exclusive beside shared": {
			rw().shared(0, 0, 10, 1, 5000).shared(1, 20, 30, 2, 5000).acq(2, 40, 50, 3, 5000),
			"kinds-exclusion,linearizability",
		},
		"rw: two exclusive holders": {
			rw().acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000),
			"kinds-exclusion,linearizability",
		},
		"rw: an exclusive grant's token below a shared token granted before it": {
			rw().shared(0, 0, 10, 5, 5000).
				add2(Op{Client: 1, Kind: OpAcquire, Lock: LockRW, Call: 5 * msec, Return: 200 * msec, Result: OutOK, Token: 3,
					Lease: 5000 * msec, Granted: 5000 * msec, Deadline: 5005 * msec}).rel(0, 100, 110, 5, OutOK),
			"linearizability",
		},
		"rw: a get shows an exclusive holder as shared": {
			rw().acq(0, 0, 10, 1, 5000).get(1, 20, 30, true, 1),
			"linearizability",
		},
		"rw: a get shows two holders held exclusively": {
			rw().shared(0, 0, 10, 1, 5000).shared(1, 20, 30, 2, 5000).add2(Op{Client: 2, Kind: OpGet, Call: 40 * msec, Return: 50 * msec,
				Result: OutOK, Held: true, Token: 1, Holders: []uint64{1, 2}}),
			"linearizability",
		},
		"rw: shared held while only shared holders": {
			rw().shared(0, 0, 10, 1, 5000).acqOut(1, 20, 30, OutHeld, true),
			"linearizability",
		},
		"fifo: a later request granted before an earlier waiter": {
			sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).
				grantSent(2, 100, 100, 1150, 4, 5000, false).grantSent(3, 400, 400, 1050, 3, 5000, false).
				rel(0, 1000, 1010, 1, OutOK).rel(1, 1100, 1110, 2, OutOK),
			"fifo",
		},
		"fifo: a shared request granted before an earlier exclusive waiter": {
			rw().shared(0, 0, 10, 1, 5000).grantSent(1, 100, 100, 1100, 3, 5000, false).grantSent(2, 400, 400, 410, 2, 5000, true).
				rel(0, 1000, 1010, 1, OutOK).rel(2, 1020, 1030, 2, OutOK),
			"fifo",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			res := checkKinds(c.b, nil, nil)
			got := checkers(res)
			for _, w := range strings.Split(c.want, ",") {
				if !strings.Contains(got, w) {
					for _, v := range res.Violations {
						t.Log(v.String())
					}
					t.Fatalf("checker %s did not fire (got %q)", w, got)
				}
			}
		})
	}
}

func (b *kb) add2(o Op) *kb {
	b.add(o)
	return b
}

// The FIFO check judges only pairs queued while no fault was under way:
// the same out-of-order grants pass when a fault (a new leader, a new
// queue) overlaps them, and it counts the pairs it judged.
func TestKindsFIFOOnlyUnderOneLeader(t *testing.T) {
	b := sem(2).acq(0, 0, 10, 1, 5000).acq(1, 20, 30, 2, 5000).
		grantSent(2, 100, 100, 1150, 4, 5000, false).grantSent(3, 400, 400, 1050, 3, 5000, false).
		rel(0, 1000, 1010, 1, OutOK).rel(1, 1100, 1110, 2, OutOK)
	res := checkKinds(b, []Fault{{Kind: "crash-leader", Start: 500 * msec, End: 700 * msec}}, nil)
	if got := checkers(res); strings.Contains(got, "fifo") {
		t.Fatalf("fifo judged a pair across a fault: %s", got)
	}
	res = checkKinds(b, nil, nil)
	if res.FIFOPairs == 0 || !strings.Contains(checkers(res), "fifo") {
		t.Fatalf("fifo judged %d pairs: %s", res.FIFOPairs, checkers(res))
	}
}

// The guarded resource of a multi-holder key: a use refused while the
// holders valid by their deadlines fill the key is a violation, unless a
// forward clock jump cut the other holder's lease short.
func TestKindsResourceUses(t *testing.T) {
	b := sem(2).acq(0, 0, 10, 1, 1000).acq(1, 20, 30, 2, 5000).acq(2, 1100, 1110, 3, 5000)
	writes := []Write{
		{Key: "k", Token: 1, At: 50 * msec, Accepted: true},
		{Key: "k", Token: 2, At: 60 * msec, Accepted: true},
		{Key: "k", Token: 3, At: 1200 * msec, Accepted: true},
		// 3 found 1 and 2 still using the key: 1 valid by its
		// deadline when 3 was granted.
		{Key: "k", Token: 3, At: 1150 * msec, Accepted: false, Highest: 1},
	}
	res := checkKinds(b, nil, writes)
	if !strings.Contains(checkers(res), "kinds-resource") {
		t.Fatalf("refused use not reported: %s", checkers(res))
	}
	if res.Fenced != 1 || res.Accepted != 3 {
		t.Fatalf("uses counted %d refused, %d accepted", res.Fenced, res.Accepted)
	}
	res = checkKinds(b, nil, writes, Jump{At: 40 * msec, Node: 1, Delta: 2000 * msec})
	if strings.Contains(checkers(res), "kinds-resource") {
		t.Fatalf("a refusal explained by a forward jump reported: %s", checkers(res))
	}
}

// The long run's round 0 (seed 1425803044203758985): a semaphore of 3
// held by 9 (renewed), 13 (renewed) and 16; the leader's lease clock
// jumps 2.36s forward, which can have ended 13 and 16 but not 9, and 25
// is granted beside them and refused by the resource for all three. The
// refusal is excused: the holders no jump can have cut short (9) leave
// room. Without the jump it is reported; with 9 alone named in the way
// (a history from before Write.Blocking) it was reported too.
func TestKindsResourceRefusalCountsEveryBlocker(t *testing.T) {
	b := sem(3).acq(6, 75, 77, 9, 1707).acq(4, 1314, 1315, 13, 1033).acq(0, 2580, 2581, 16, 1644).
		renew(6, 1788, 2731, 9, 6060).renew(4, 2938, 2939, 13, 4856).acq(7, 3186, 3188, 25, 1039)
	writes := []Write{{Key: "k", Token: 25, At: 3188 * msec, Highest: 9, Blocking: []uint64{9, 13, 16}}}
	jump := Jump{At: 3159 * msec, Node: 3, Delta: 2362 * msec}
	if got := checkers(checkKinds(b, nil, writes, jump)); strings.Contains(got, "kinds-resource") {
		t.Fatalf("a refusal the jump explains reported: %s", got)
	}
	if got := checkers(checkKinds(b, nil, writes)); !strings.Contains(got, "kinds-resource") {
		t.Fatalf("a refusal no jump explains not reported: %s", got)
	}
	// Renewed past the jump's cut, 13 and 16 are live again: with 9
	// they fill the key.
	b.renew(4, 3000, 3001, 13, 6000).renew(0, 3002, 3003, 16, 6000)
	if got := checkers(checkKinds(b, nil, writes, jump)); !strings.Contains(got, "kinds-resource") {
		t.Fatalf("a refusal by three holders no jump can have cut short not reported: %s", got)
	}
}
