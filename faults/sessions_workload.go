package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// sessionWorkload runs beside the lock workload (Config.Sessions): holders
// each keep one key in a session and never release it; now and then one
// "dies" (its client closes, so its keepalives stop), and every kill -9
// of the leader by the nemesis (crash-leader) kills one holder's client
// first, so the session whose leader died has no client either; contenders
// try the same keys with leased locks and release at once. A status
// poller records every node's term and role ten times a second, which
// bounds when each leader took over. CheckSessions judges the history.
type sessionWorkload struct {
	c          cluster
	h          *History
	keys       []string
	ttl, delay time.Duration
	contenders int
	logf       func(format string, args ...any)

	mu     sync.Mutex
	hist   SessionHistory
	live   map[int]*liveSession // holder index -> its current session
	failed map[string]int       // session operations that failed, by code
}

// liveSession is a holder's current session, for the crash hook.
type liveSession struct {
	cl   *sdk.Client
	hold int // index into hist.Holds, -1 before the grant
	dead bool
}

// Session workload parameters: a TTL of 2s outlives an election (500ms
// base timeout here), a lock-delay of 1s is long against the contenders'
// pace (one try every 100ms), so a shortened delay is seen.
const (
	sessionTTL        = 2 * time.Second
	sessionLockDelay  = time.Second
	sessionHolders    = 2
	sessionContenders = 2
	statusPollEvery   = 100 * time.Millisecond
)

func newSessionWorkload(c cluster, h *History, name string, logf func(string, ...any)) *sessionWorkload {
	sw := &sessionWorkload{c: c, h: h, ttl: sessionTTL, delay: sessionLockDelay, contenders: sessionContenders, logf: logf,
		live: map[int]*liveSession{}, failed: map[string]int{}}
	for i := 0; i < sessionHolders; i++ {
		sw.keys = append(sw.keys, fmt.Sprintf("faults/%s/s%d", name, i))
	}
	return sw
}

func (sw *sessionWorkload) fail(what string, err error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	k := what + ":" + string(sdk.CodeOf(err))
	if sw.failed[k] == 0 {
		sw.logf("sessions: first %s at %s: %v", k, ms(sw.h.Now()), err)
	}
	sw.failed[k]++
}

// round runs holders, contenders and the status poller until until;
// holders still alive then close their sessions (a release: no delay).
func (sw *sessionWorkload) round(until time.Time, seed uint64) {
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	var wg sync.WaitGroup
	for i := range sw.keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sw.holder(ctx, i, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	for i := 0; i < sw.contenders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sw.contender(ctx, 100+i, rand.New(rand.NewPCG(seed, uint64(100+i))))
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); sw.pollStatus(ctx) }()
	wg.Wait()
}

// holder keeps key i in a session per cycle, bounded in count and time.
func (sw *sessionWorkload) holder(ctx context.Context, i int, rng *rand.Rand) {
	key := sw.keys[i]
	dl, _ := ctx.Deadline()
	// No cycle starts in the last 1.5s: its acquire's wait would be cut
	// to a try by the round's end.
	for cycle := 0; time.Until(dl) > 1500*time.Millisecond && cycle < 1000; cycle++ {
		cl, err := connectClient(sw.c.clientURLs())
		if err != nil {
			sw.fail("connect", err)
			pace(100*time.Millisecond, time.Now().Add(time.Second))
			continue
		}
		ls := &liveSession{cl: cl, hold: -1}
		sw.mu.Lock()
		sw.live[i] = ls
		sw.mu.Unlock()
		sw.holdOnce(ctx, i, key, ls, rng)
		sw.mu.Lock()
		delete(sw.live, i)
		sw.mu.Unlock()
		_ = cl.Close()
		// Off the key for a while, so that contenders get it too.
		pace(300*time.Millisecond+time.Duration(rng.Int64N(int64(time.Second))), dl)
	}
}

func (sw *sessionWorkload) holdOnce(ctx context.Context, i int, key string, ls *liveSession, rng *rand.Rand) {
	s, err := sdk.NewSession(ctx, ls.cl, sdk.WithSessionTTL(sw.ttl), sdk.WithSessionLockDelay(sw.delay))
	if err != nil {
		if ctx.Err() == nil {
			sw.fail("open", err)
			pace(100*time.Millisecond, time.Now().Add(time.Second))
		}
		return
	}
	call := sw.h.Now()
	l, err := s.Acquire(ctx, key, sdk.WithWait(5*time.Second))
	if err != nil {
		if ctx.Err() == nil {
			sw.fail("acquire", err)
		}
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = s.Close(cctx)
		cancel()
		return
	}
	got := sw.h.Now()
	sw.mu.Lock()
	dead := ls.dead
	ls.hold = len(sw.hist.Holds)
	sw.hist.Holds = append(sw.hist.Holds, SessionHold{Holder: i, Session: s.ID, Key: key, Token: l.Token,
		TTL: int64(s.TTL), Delay: int64(s.LockDelay), Got: got})
	sw.hist.Grants = append(sw.hist.Grants, SessionGrant{Client: i, Key: key, Call: call, Return: got, Token: l.Token, Session: s.ID})
	sw.mu.Unlock()
	if dead { // the crash hook closed the client during the acquire
		sw.died(ls, false)
	}
	// The holder keeps the lock 1-4s (across leader changes: the
	// keepalives must keep it), then closes the session, or one cycle in
	// three dies.
	holdFor := time.NewTimer(time.Second + time.Duration(rng.Int64N(int64(3*time.Second))))
	defer holdFor.Stop()
	select {
	case <-s.Done():
	case <-holdFor.C:
		if rng.IntN(3) == 0 {
			sw.died(ls, false)
			_ = ls.cl.Close() // keepalives stop: the server must expire the session
		}
	case <-ctx.Done():
	}
	sw.mu.Lock()
	dead = ls.dead
	sw.mu.Unlock()
	var closeCall int64
	if dead {
		// Wait for the SDK to give the session up (before its deadline):
		// from then on its deadline never moves.
		<-s.Done()
	} else if s.Err() == nil {
		closeCall = sw.h.Now()
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if _, err := s.Close(cctx); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			sw.fail("close", err)
		}
		cancel()
	}
	var refused int64
	if err := s.Err(); err != nil && strings.Contains(err.Error(), "keepalive refused") {
		refused = sw.h.Now() // the refusal came before this
	}
	sw.mu.Lock()
	hd := &sw.hist.Holds[ls.hold]
	hd.Deadline = sw.h.Rel(s.Deadline())
	hd.CloseCall, hd.Refused = closeCall, refused
	sw.mu.Unlock()
}

// died marks a holder's client as gone; withLeader says the leader is
// being killed -9 right after. A hold taken after the client was marked
// gets its time when it is recorded.
func (sw *sessionWorkload) died(ls *liveSession, withLeader bool) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	ls.dead = true
	if ls.hold >= 0 && sw.hist.Holds[ls.hold].Died == 0 {
		sw.hist.Holds[ls.hold].Died = sw.h.Now()
		sw.hist.Holds[ls.hold].DiedWithLeader = withLeader
	}
}

// beforeLeaderCrash is the nemesis hook of crash-leader: one holder's
// client dies just before the leader is killed -9, so that session is
// neither kept alive nor closed, and only the next leader can end it. It
// waits up to 1.5s for a holder that holds its key (they spend part of
// their time waiting for it or off it), then lets the kill go ahead.
func (sw *sessionWorkload) beforeLeaderCrash() {
	var victim *liveSession
	deadline := time.Now().Add(1500 * time.Millisecond)
	for victim == nil && time.Now().Before(deadline) {
		sw.mu.Lock()
		for i := range sw.keys {
			if ls := sw.live[i]; ls != nil && ls.hold >= 0 && !ls.dead {
				victim = ls
				break
			}
		}
		sw.mu.Unlock()
		if victim == nil {
			time.Sleep(20 * time.Millisecond) // poll period
		}
	}
	if victim == nil {
		return
	}
	sw.died(victim, true)
	_ = victim.cl.Close()
}

// contender tries the session keys with leased locks, released at once.
func (sw *sessionWorkload) contender(ctx context.Context, id int, rng *rand.Rand) {
	cl, err := connectClient(sw.c.clientURLs())
	if err != nil {
		sw.fail("connect", err)
		return
	}
	defer cl.Close()
	for n := 0; ctx.Err() == nil && n < 100000; n++ {
		key := sw.keys[rng.IntN(len(sw.keys))]
		opts := []sdk.AcquireOption{sdk.WithLease(time.Second)}
		if rng.IntN(4) == 0 {
			opts = append(opts, sdk.WithWait(time.Second)) // waiters wait through a delay
		}
		call := sw.h.Now()
		l, err := cl.Acquire(ctx, key, opts...)
		if err == nil {
			ret := sw.h.Now()
			sw.mu.Lock()
			sw.hist.Grants = append(sw.hist.Grants, SessionGrant{Client: id, Key: key, Call: call, Return: ret, Token: l.Token})
			sw.mu.Unlock()
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = l.Release(rctx)
			cancel()
		}
		pace(100*time.Millisecond, time.Now().Add(time.Second)) // the contenders' pace, not a wait for a condition
	}
}

// pollStatus records every node's term and role every statusPollEvery.
func (sw *sessionWorkload) pollStatus(ctx context.Context) {
	for n := 0; ctx.Err() == nil && n < 1_000_000; n++ {
		var wg sync.WaitGroup
		for i := 0; i < sw.c.size(); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				send := sw.h.Now()
				sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				st, err := sw.c.status(sctx, i)
				cancel()
				if err != nil {
					return
				}
				o := StatusObs{Node: i + 1, Send: send, Recv: sw.h.Now(), Term: st.Term, Leader: st.State == "StateLeader"}
				sw.mu.Lock()
				sw.hist.Status = append(sw.hist.Status, o)
				sw.mu.Unlock()
			}()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
		case <-time.After(statusPollEvery): // the poll period
		}
	}
}

// drain polls the session keys (unrecorded gets) until every one is free
// and returns those still held at the deadline: dead holders' sessions
// must end, and their lock-delays too.
func (sw *sessionWorkload) drain(cl *sdk.Client, within time.Duration) []string {
	deadline := time.Now().Add(within)
	pending := append([]string(nil), sw.keys...)
	for len(pending) > 0 && time.Now().Before(deadline) {
		var still []string
		for _, k := range pending {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			hd, err := cl.Get(ctx, k)
			cancel()
			if err != nil || hd.Held {
				still = append(still, k)
			}
		}
		pending = still
		if len(pending) > 0 {
			time.Sleep(100 * time.Millisecond) // the drain's poll period
		}
	}
	return pending
}

// history returns a copy of what was recorded; sessions not ended are
// marked Alive (none should be: holders close theirs at each round's
// end).
func (sw *sessionWorkload) history() SessionHistory {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	out := SessionHistory{
		Holds:  append([]SessionHold(nil), sw.hist.Holds...),
		Grants: append([]SessionGrant(nil), sw.hist.Grants...),
		Status: append([]StatusObs(nil), sw.hist.Status...),
	}
	for i := range out.Holds {
		if out.Holds[i].Deadline == 0 {
			out.Holds[i].Alive = true
		}
	}
	return out
}

// summary is the report's sessions line.
func (sw *sessionWorkload) summary(sh SessionHistory, res SessionCheck) string {
	var died, withLeader, refused, closed int
	for _, h := range sh.Holds {
		if h.Died != 0 {
			died++
		}
		if h.DiedWithLeader {
			withLeader++
		}
		if h.Refused != 0 {
			refused++
		}
		if h.CloseCall != 0 {
			closed++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sessions (ttl %v, lock-delay %v): %d holds (%d closed, %d holders died, %d of them just before a kill -9 of the leader, %d keepalives refused), %d grants, %d grant/hold pairs judged, %d holds whose end a leader change pushed past their deadline, %d leader terms seen",
		sw.ttl, sw.delay, len(sh.Holds), closed, died, withLeader, refused, len(sh.Grants), res.Judged, res.Rearmed, len(leaderTerms(sh.Status)))
	if len(res.Regrants) > 0 {
		lo, hi := res.Regrants[0], res.Regrants[0]
		for _, d := range res.Regrants {
			lo, hi = min(lo, d), max(hi, d)
		}
		fmt.Fprintf(&b, "; a dead holder's key regranted %v to %v after its bound (deadline or new-leader TTL, + lock-delay)", lo.Round(time.Millisecond), hi.Round(time.Millisecond))
	}
	sw.mu.Lock()
	if len(sw.failed) > 0 {
		fmt.Fprintf(&b, "; failed session ops %v", sw.failed)
	}
	sw.mu.Unlock()
	return b.String()
}
