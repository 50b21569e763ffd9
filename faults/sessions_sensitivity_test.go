package faults

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
)

const sec = int64(time.Second)

// TestCheckSessionsHistories holds hand-made session histories: each
// broken one must be reported by exactly the checkers it names, each
// legal one by none.
func TestCheckSessionsHistories(t *testing.T) {
	// A session (TTL 2s, lock-delay 1s) whose holder's grant returned at
	// 1s and whose last acknowledged keepalive promised it until 10s.
	hold := func(mod func(*SessionHold)) SessionHold {
		h := SessionHold{Holder: 0, Session: "7", Key: "s", Token: 3, TTL: 2 * sec, Delay: sec, Got: sec, Deadline: 10 * sec}
		if mod != nil {
			mod(&h)
		}
		return h
	}
	grant := func(call, ret int64) SessionGrant {
		return SessionGrant{Client: 100, Key: "s", Call: call, Return: ret, Token: 9}
	}
	// Node 2 answered from term 4 at 9s and was seen leading term 5 at
	// 9.5s: it took over in (9s, 9.5s], while the session lived, so the
	// session may not end before 9s + 2s.
	newLeader := []StatusObs{
		{Node: 2, Send: 9 * sec, Recv: 9*sec + 5e6, Term: 4},
		{Node: 2, Send: 9*sec + 4e8, Recv: 9*sec + 5e8, Term: 5, Leader: true},
	}
	lateLeader := []StatusObs{ // took over after the session's deadline: owes it nothing
		{Node: 2, Send: 10 * sec, Recv: 10*sec + 5e6, Term: 4},
		{Node: 2, Send: 10*sec + 4e8, Recv: 10*sec + 5e8, Term: 5, Leader: true},
	}
	for _, tc := range []struct {
		name string
		sh   SessionHistory
		want string // checkers, comma-separated; "" legal
	}{
		{"grant after deadline + lock-delay", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 11*sec+1)}}, ""},
		{"ended session's lock granted without the delay", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 10*sec+5e8)}}, "session-exclusion"},
		{"kept-alive session's lock granted to another", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 6*sec)}}, "session-exclusion"},
		{"grant called before the holder's grant returned is not judged", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(sec-1, 2*sec)}}, ""},
		{"grant after the Close call: no delay", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.CloseCall = 6 * sec })}, Grants: []SessionGrant{grant(5*sec, 6*sec+1)}}, ""},
		{"grant before the Close call", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.CloseCall = 6 * sec })}, Grants: []SessionGrant{grant(5*sec, 6*sec-1)}}, "session-exclusion"},
		{"still alive at the end: any later grant", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.Alive = true })}, Grants: []SessionGrant{grant(5*sec, 60*sec)}}, "session-exclusion"},
		{"kept-alive session lost", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.Refused = 9 * sec })}}, "session-lost"},
		{"keepalive refused after the deadline", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.Refused = 10*sec + 1 })}}, ""},
		{"new leader cut the re-armed TTL short (grant)", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 11*sec+5e8)}, Status: newLeader}, "session-rearm"},
		{"new leader gave the full TTL", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 12*sec+1)}, Status: newLeader}, ""},
		{"new leader ended a session it owed a full TTL (keepalive)", SessionHistory{Holds: []SessionHold{hold(func(h *SessionHold) { h.Refused = 10*sec + 5e8 })}, Status: newLeader}, "session-lost"},
		{"leader that took over after the deadline owes nothing", SessionHistory{Holds: []SessionHold{hold(nil)}, Grants: []SessionGrant{grant(5*sec, 11*sec+5e8)}, Status: lateLeader}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := CheckSessions(tc.sh)
			var got []string
			for _, v := range res.Violations {
				got = append(got, v.Checker)
			}
			if strings.Join(got, ",") != tc.want {
				for _, v := range res.Violations {
					t.Log(v.String())
				}
				t.Errorf("checkers %q, want %q", strings.Join(got, ","), tc.want)
			}
		})
	}
}

// TestSessionChecksCatchAnEarlyExpiry: the checks on a real node's
// history. A session (TTL 3s, lock-delay 2s) holds a key and is kept
// alive; the leader's lease clock jumps 10s forward, unrecorded, so the
// leader expires the session at once, and a waiting contender gets the
// key after the lock-delay, long before the holder's deadline plus the
// delay; the holder's next keepalive is refused before its deadline.
// CheckSessions must report both (TestCheckSessionsHistories holds the
// legal counterparts).
func TestSessionChecksCatchAnEarlyExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process node with sessions skipped in -short mode")
	}
	js := newJumpScenario(t)
	h := js.h
	ctx := t.Context()
	a, b := js.ws[0].cl, js.ws[1].cl
	waitSettled(t, js)
	s, err := sdk.NewSession(ctx, a, sdk.WithSessionTTL(3*time.Second), sdk.WithSessionLockDelay(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	hd := SessionHold{Session: s.ID, Key: "s", Token: l.Token, TTL: int64(s.TTL), Delay: int64(s.LockDelay), Got: h.Now()}
	if err := js.c.jump(0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Opening a session wakes the leader's session loop, which finds the
	// first one due on its jumped clock.
	other, err := sdk.NewSession(ctx, b, sdk.WithSessionTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.WithoutCancel(ctx))
	call := h.Now()
	lb, err := b.Acquire(ctx, "s", sdk.WithLease(time.Second), sdk.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("the contender did not get the key of the session expired early: %v", err)
	}
	g := SessionGrant{Client: 1, Key: "s", Call: call, Return: h.Now(), Token: lb.Token}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's session did not end 5s after its key was granted to another")
	}
	hd.Deadline = h.Rel(s.Deadline())
	if err := s.Err(); err != nil && strings.Contains(err.Error(), "keepalive refused") {
		hd.Refused = h.Now()
	}
	if hd.Refused == 0 {
		t.Fatalf("the holder's keepalive was not refused (%v): the scenario needs the session ended early", s.Err())
	}
	res := CheckSessions(SessionHistory{Holds: []SessionHold{hd}, Grants: []SessionGrant{g}})
	names := map[string]bool{}
	for _, v := range res.Violations {
		names[v.Checker] = true
		t.Log(v.String())
	}
	if !names["session-exclusion"] || !names["session-lost"] {
		t.Errorf("an unrecorded 10s jump of the leader's lease clock: got checkers %v, want session-exclusion and session-lost", names)
	}
}

// waitSettled waits until the single node leads at the newest cluster
// version (sessions need 4).
func waitSettled(t *testing.T, js *jumpScenario) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "a settled leader", func() bool {
		d := js.c.node(0)
		return d != nil && testcluster.Settled(d)
	})
}
