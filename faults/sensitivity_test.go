package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/sdk"
)

// TestCheckersCatchAnUnrecordedClockJump proves the checkers are not
// vacuous on a real cluster: the leader's lease clock jumps 5s forward
// without the jump being recorded, so a 3s lease ends early on the
// leader, a second client takes the key while the first holder is still
// valid by its SDK deadline, and the first holder's next write is fenced.
// Unrecorded, that is a mutual-exclusion and linearizability violation;
// recorded, the checker excuses the overlap (the documented consequence
// of a forward jump on the leader's clock) and fencing alone keeps the
// resource consistent.
func TestCheckersCatchAnUnrecordedClockJump(t *testing.T) {
	js := newJumpScenario(t)
	a := js.ws[0].acquire("k", 3*time.Second, 0)
	if a == nil {
		t.Fatal("first acquire failed")
	}
	if ok, _ := js.res.write(0, a); !ok {
		t.Fatal("first holder could not write")
	}
	jumpAt := js.takeOverAfterJump(t, a, "the lease", "the first holder's SDK deadline")
	ops, writes, _, _ := js.h.snapshot(-1)
	got := Check(0, ops, writes, nil, jumpCheckOptions)
	wantCaught(t, got)
	wantExcused(t, ops, writes, jumpAt)
}

// TestCheckersCatchAnUnhonouredRenewal: the same on a renewed lock. A
// 300ms lock is renewed for 3s (Client.Renew, then Lock.Renew moves the
// holder's deadline), its grant's own deadline passes, and the leader's
// lease clock jumps 5s forward unrecorded: the leader expires the renewed
// lease early and a second client takes the key while the first holder is
// valid only by its renewal. The checkers must call that a violation, and
// only because of the renewal: without the renew operations in the
// history the grant came after the first lease ended. Recorded, the jump
// excuses the overlap and fencing holds.
func TestCheckersCatchAnUnhonouredRenewal(t *testing.T) {
	js := newJumpScenario(t)
	ws := js.ws
	a := ws[0].acquire("k", 300*time.Millisecond, 0)
	if a == nil {
		t.Fatal("first acquire failed")
	}
	granted := a.Deadline()
	if r := ws[0].renew(a, 3*time.Second); r != OutOK {
		t.Fatalf("renew with a 3s lease: %s", r)
	}
	if r := ws[0].renew(a, 0); r != OutOK || !a.Deadline().After(granted.Add(2*time.Second)) {
		t.Fatalf("Lock.Renew: %s, deadline %v after the grant's", r, a.Deadline().Sub(granted))
	}
	// Wait out the grant's own deadline (a fixed instant, not a
	// condition): from then on only the renewal makes the lock a's.
	time.Sleep(time.Until(granted))
	if ok, _ := js.res.write(0, a); !ok {
		t.Fatal("the renewed holder could not write")
	}
	jumpAt := js.takeOverAfterJump(t, a, "the renewed lease", "the first holder's renewed deadline")
	ops, writes, _, _ := js.h.snapshot(-1)
	wantCaught(t, Check(0, ops, writes, nil, jumpCheckOptions))
	var unrenewed []Op
	for _, o := range ops {
		if o.Kind != OpRenew {
			unrenewed = append(unrenewed, o)
		}
	}
	if names := checkers(Check(0, unrenewed, writes, nil, jumpCheckOptions)); strings.Contains(names, "mutual-exclusion") || strings.Contains(names, "linearizability") {
		t.Errorf("without the renewals the second grant came after the first lease, yet %q fired", names)
	}
	wantExcused(t, ops, writes, jumpAt)
}

// jumpScenario is one in-process node with two harness workers sharing
// a history and a fenced resource.
type jumpScenario struct {
	c   *inprocCluster
	h   *History
	res *resource
	ws  []*worker
}

func newJumpScenario(t *testing.T) *jumpScenario {
	t.Helper()
	c, err := startInProcess(t, 1, testkit.QuietLogger(), 20, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if !waitLeader(c, 10*time.Second) {
		t.Fatal("single node did not lead")
	}
	js := &jumpScenario{c: c, h: NewHistory()}
	js.res = newResource(js.h, nil)
	wl := &workload{h: js.h, res: js.res, opTimeout: 2 * time.Second}
	for i := 0; i < 2; i++ {
		cl, err := connectClient(c.clientURLs())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		js.ws = append(js.ws, &worker{id: i, cl: cl, w: wl})
	}
	return js
}

// takeOverAfterJump jumps the leader's lease clock 5s forward, unrecorded,
// has the second worker take "k" while a is still valid by its SDK
// deadline, and checks that the second holder writes and a's next write is
// fenced. It returns the history time of the jump. lease and deadline
// name what ended early and what was still valid, for the messages.
func (js *jumpScenario) takeOverAfterJump(t *testing.T, a *sdk.Lock, lease, deadline string) int64 {
	t.Helper()
	jumpAt := js.h.Now()
	if err := js.c.jump(0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Any grant wakes the leader's lease loop, which then finds the lease
	// of "k" due on its (jumped) clock.
	if l := js.ws[1].acquire("other", time.Second, 0); l == nil {
		t.Fatal("acquire of another key failed")
	}
	var b *sdk.Lock
	until := time.Now().Add(2 * time.Second)
	for b == nil && time.Now().Before(until) {
		b = js.ws[1].acquire("k", time.Second, 100*time.Millisecond)
	}
	if b == nil {
		t.Fatalf("%s did not end early: the jumped clock had no effect", lease)
	}
	if !a.Valid() {
		t.Fatalf("%s passed already (%v): the scenario needs it valid", deadline, a.Deadline())
	}
	if _, acc := js.res.write(1, b); !acc {
		t.Fatal("the second holder's write was rejected")
	}
	if _, acc := js.res.write(0, a); acc {
		t.Fatal("the resource accepted a stale token")
	}
	return jumpAt
}

var jumpCheckOptions = CheckOptions{Slack: time.Millisecond, LinearizabilityTimeout: 10 * time.Second}

// wantCaught: with the jump unrecorded, the overlap is a violation of
// mutual exclusion, linearizability and the fenced resource.
func wantCaught(t *testing.T, got CheckResult) {
	t.Helper()
	names := checkers(got)
	for _, want := range []string{"mutual-exclusion", "linearizability", "fenced-resource"} {
		if !strings.Contains(names, want) {
			for _, v := range got.Violations {
				t.Log(v.String())
			}
			t.Errorf("unrecorded jump: checker %s did not fire (got %q)", want, names)
		}
	}
}

// wantExcused: with the jump recorded, the overlap is excused and the one
// stale write fenced.
func wantExcused(t *testing.T, ops []Op, writes []Write, jumpAt int64) {
	t.Helper()
	recorded := Check(0, ops, writes, []Jump{{At: jumpAt, Node: 1, Delta: int64(5 * time.Second)}}, jumpCheckOptions)
	if len(recorded.Violations) > 0 {
		for _, v := range recorded.Violations {
			t.Log(v.String())
		}
		t.Errorf("recorded jump: %d violations, want none", len(recorded.Violations))
	}
	if len(recorded.Excused) == 0 || recorded.Fenced != 1 {
		t.Errorf("recorded jump: excused %v fenced %d, want an excused overlap and one fenced write", recorded.Excused, recorded.Fenced)
	}
}
