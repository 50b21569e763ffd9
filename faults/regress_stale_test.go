package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/sdk"
)

// TestStaleAttemptIsNotGrantedLater: an acquire attempt that sat in a
// paused node's NATS server must not be granted when that node resumes,
// after the acquire was answered by a later attempt.
//
// Found by the 10-minute process run with the semaphore and read/write
// keys (issue 25; seed 3420935398091713583: its 3 violations, on a mutex
// key after pause-leader and on the read/write key after pause-leader and
// pause-follower, are all this bug). A client connected to a node that is
// paused (SIGSTOP) sends a try-acquire; the request sits in that node's
// NATS server. The SDK's retry, after its NATS connection failed over,
// reaches the leader and is answered held, a definite answer: nothing
// granted. When the paused node resumes, its NATS server delivers the
// first attempt, and the leader takes it as a new request (its deadline
// counts from its arrival) and grants it: the owner is the client, but no
// Acquire call has the token, for the whole lease the dead request asked
// (20s here). The key or semaphore slot stays taken until that lease ends:
// gets show a token no acquire returned, tries are answered held, and the
// porcupine models call the history non-linearizable. Mutual exclusion
// and fencing hold (nobody uses the token); availability does not. Before
// the fix it was seen in 2 of 3 attempts once, in none of 4 another time
// (which node's NATS server holds the attempt and which routes survive
// the pause varies), so the test makes up to 8, pausing a follower or the
// leader in turn, with TICKETD_FAULTS_LONG=1; by default 2 (a follower,
// then the leader: about 8 s each on real processes), to keep the default
// suite short.
//
// Fixed (cluster version 6): the SDK settles a request whose later
// attempt was refused with a withdraw by request_id, which the leader
// applies as a Settle that leaves a tombstone; the stale attempt is then
// answered grant_ended and the key stays free.
//
//	TICKETD_FAULTS_LONG=1 go test -run TestStaleAttemptIsNotGrantedLater -v ./faults/
func TestStaleAttemptIsNotGrantedLater(t *testing.T) {
	rounds := 2
	if os.Getenv(envLong) == "1" {
		rounds = 8
	}
	c := mustStartProcesses(t, t.TempDir(), 3)
	t.Cleanup(c.close)
	// An attempt whose settle got no answer in time is indeterminate, as
	// the SDK promises, and shows nothing: it is made again, on a new key,
	// at most maxInconclusive times in all.
	const maxInconclusive = 2
	inconclusive := 0
	for attempt := 0; attempt < rounds; attempt++ {
		// Pause a follower, then the leader, in turn.
		key := fmt.Sprintf("stale/%d/%d", attempt, inconclusive)
		token, outcome := staleAttempt(t, c, key, attempt%2 == 1)
		switch outcome {
		case staleGranted:
			t.Fatalf("attempt %d: the try-acquire answered held was granted %v later, after the node holding its first attempt resumed: token %d",
				attempt, token.after, token.token)
		case staleInconclusive:
			if inconclusive++; inconclusive > maxInconclusive {
				t.Fatalf("attempt %d: the try-acquire was indeterminate %d times: the scenario never ran", attempt, inconclusive)
			}
			attempt--
		}
	}
}

type staleOutcome int

const (
	staleFree         staleOutcome = iota // the key stayed free: the fix works
	staleGranted                          // the stale attempt was granted
	staleInconclusive                     // the acquire was indeterminate
)

type lateGrant struct {
	token uint64
	after time.Duration
}

// staleAttempt runs the scenario once on key and reports a late grant to
// the late client (owner "late").
func staleAttempt(t *testing.T, c *procCluster, key string, pauseLeader bool) (lateGrant, staleOutcome) {
	t.Helper()
	if !waitLeader(c, 30*time.Second) {
		t.Fatal("no leader")
	}
	paused := (c.leader() + 1) % 3 // a follower
	if pauseLeader {
		paused = c.leader()
	}
	urls := c.clientURLs()
	var others []string
	for i, u := range urls {
		if i != paused {
			others = append(others, u)
		}
	}
	holder, err := connectClient(others)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	// The late client is connected to the follower to be paused, and
	// fails over to the others.
	late, err := sdk.Connect(strings.Join(append([]string{urls[paused]}, others...), ","),
		append(clientOptions(), sdk.WithNATSOptions(nats.DontRandomize()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := holder.Acquire(ctx, key, sdk.WithLease(20*time.Second), sdk.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.pause(paused); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = c.resume(paused)
		}
	}()
	start := time.Now()
	actx, acancel := context.WithTimeout(ctx, 8*time.Second)
	_, err = late.Acquire(actx, key, sdk.WithLease(20*time.Second), sdk.WithOwner("late"))
	acancel()
	if sdk.IsIndeterminate(err) {
		// Its settle was not answered in time (its withdrawals lost, or
		// the commit slow on a loaded machine): nothing is known.
		t.Logf("%s: indeterminate, made again: %v", key, err)
		resumed = true
		if err := c.resume(paused); err != nil {
			t.Fatal(err)
		}
		return lateGrant{}, staleInconclusive
	}
	if !errors.Is(err, sdk.ErrHeld) {
		t.Fatalf("try-acquire of a held key while the client's node is paused: %v, want held after failing over", err)
	}
	// A paused leader is replaced first (leader() skips paused nodes).
	if !waitLeader(c, 10*time.Second) {
		t.Fatal("no leader while one node is paused")
	}
	var rerr error
	for i := 0; i < 5; i++ {
		if rerr = l.Release(ctx); rerr == nil || errors.Is(rerr, sdk.ErrNotFound) {
			break
		}
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	if err := c.resume(paused); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// The key must stay free: poll it for a few seconds.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		h, err := holder.Get(ctx, key)
		if err == nil && h.Held && h.Owner == "late" {
			return lateGrant{token: h.Token, after: time.Since(start)}, staleGranted
		}
	}
	return lateGrant{}, staleFree
}
