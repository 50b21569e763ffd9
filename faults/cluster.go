package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketd/ticketd/sdk"
)

// linkMode is how a cut peer link fails.
type linkMode int

const (
	// linkDrop closes the link's connections and refuses new ones (the
	// in-process filter drops every message).
	linkDrop linkMode = iota
	// linkBlackhole keeps connections open but delivers nothing (process
	// level only; the in-process filter treats it as drop).
	linkBlackhole
)

var errUnsupported = errors.New("fault not supported by this cluster driver")

// cluster is what the nemesis and the run need from a cluster driver.
// Node indexes are 0-based; raft ids are index+1.
type cluster interface {
	size() int
	clientURLs() []string
	// leader is the index of the node that reports itself leader (the
	// highest term wins), or -1.
	leader() int
	running(i int) bool
	crash(i int) error
	// stop is a planned stop (SIGTERM; Daemon.Shutdown in process): a
	// leader hands leadership over first.
	stop(i int) error
	restart(i int) error
	// setLinks cuts every raft link from -> to for which allow is false;
	// nil heals every link.
	setLinks(allow func(from, to int) bool, mode linkMode)
	pause(i int) error
	resume(i int) error
	// jump moves node i's lease clock (Options.Now) by d.
	jump(i int, d time.Duration) error
	status(ctx context.Context, i int) (sdk.Status, error)
	// blackholes reports whether setLinks distinguishes linkBlackhole.
	blackholes() bool
	// electionTimeout is the configured base election timeout.
	electionTimeout() time.Duration
	// unexpectedExits lists nodes that stopped without being crashed.
	unexpectedExits() []string
	close()
}

// wiper is a cluster that can wipe a node and have it rejoin under a new
// identity through the control plane (the in-process driver in control
// mode).
type wiper interface {
	// wipe returns a description, violations found, and an operational
	// error.
	wipe(i int) (detail string, problems []string, err error)
}

// jumpClock is a lease clock that tests can step: time.Now plus an
// offset. Adding a duration keeps the monotonic reading, so the clock is
// still immune to wall-clock changes; only Jump moves it.
type jumpClock struct{ off atomic.Int64 }

func (c *jumpClock) Now() time.Time        { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) Jump(d time.Duration)  { c.off.Add(int64(d)) }
func (c *jumpClock) Offset() time.Duration { return time.Duration(c.off.Load()) }

// Fault kinds. Not every driver supports every kind (see kindsFor).
const (
	FaultCrashLeader       = "crash-leader"
	FaultStopLeader        = "stop-leader"
	FaultCrashFollower     = "crash-follower"
	FaultCrashMajority     = "crash-majority"
	FaultCrashAll          = "crash-all"
	FaultPartitionLeader   = "partition-leader"
	FaultPartitionFollower = "partition-follower"
	FaultPartitionSplit    = "partition-split"
	FaultPartitionOneWay   = "partition-oneway"
	FaultPartitionBridge   = "partition-bridge"
	FaultPartitionFlaky    = "partition-flaky"
	FaultPauseLeader       = "pause-leader"
	FaultPauseFollower     = "pause-follower"
	FaultClockForward      = "clock-jump-forward"
	FaultClockBackward     = "clock-jump-backward"
	FaultClockPartition    = "clock-jump-partition"
	FaultWipeNode          = "wipe-node"
)

// kindsFor is the fault mix of a driver mode.
func kindsFor(mode string, nodes int) []string {
	k := []string{
		FaultCrashLeader, FaultStopLeader, FaultCrashFollower, FaultCrashMajority,
		FaultPartitionLeader, FaultPartitionFollower, FaultPartitionSplit, FaultPartitionOneWay,
	}
	if nodes >= 5 {
		k = append(k, FaultPartitionBridge)
	}
	switch mode {
	case modeInProcess:
		k = append(k, FaultPartitionFlaky, FaultClockForward, FaultClockForward, FaultClockBackward, FaultClockPartition,
			FaultDiskSync, FaultDiskFull, FaultDiskFullRestart)
	case modeProcess:
		k = append(k, FaultCrashAll, FaultPauseLeader, FaultPauseFollower, FaultPauseLeader)
	}
	return k
}

// nemesis injects faults, one at a time, each healed before the next.
type nemesis struct {
	c   cluster
	h   *History
	rng *rand.Rand
	// kinds to draw from; base scales the hold times.
	kinds []string
	base  time.Duration
	logf  func(format string, args ...any)
	// leaseMax bounds forward clock jumps.
	leaseMax time.Duration
	// beforeLeaderCrash, if set, runs just before crash-leader kills the
	// leader (the sessions workload kills a holder's client there).
	beforeLeaderCrash func()

	mu         sync.Mutex
	violations []Violation
}

// takeViolations returns and forgets what the faults themselves found
// (the wipe-node checks).
func (n *nemesis) takeViolations() []Violation {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.violations
	n.violations = nil
	return out
}

func (n *nemesis) dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)))
}

// run injects up to maxFaults faults until the deadline, then heals.
func (n *nemesis) run(until time.Time, maxFaults int) {
	defer n.healAll()
	for k := 0; k < maxFaults; k++ {
		pace(n.dur(2*n.base, 6*n.base), until)
		if !time.Now().Before(until) {
			return
		}
		kind := n.kinds[n.rng.IntN(len(n.kinds))]
		if err := n.inject(kind, until); err != nil {
			n.logf("nemesis: %s: %v", kind, err)
		}
	}
}

// healAll restarts crashed nodes, resumes paused ones and heals links.
func (n *nemesis) healAll() {
	n.c.setLinks(nil, linkDrop)
	if df, ok := n.c.(diskFaulter); ok {
		df.healDisks()
	}
	for i := 0; i < n.c.size(); i++ {
		_ = n.c.resume(i)
		if !n.c.running(i) {
			if err := n.c.restart(i); err != nil {
				n.logf("nemesis: restart node %d: %v", i+1, err)
			}
		}
	}
}

func (n *nemesis) leaderOr(random bool) int {
	if l := n.c.leader(); l >= 0 {
		return l
	}
	if !random {
		return -1
	}
	return n.rng.IntN(n.c.size())
}

func (n *nemesis) follower() int {
	l := n.c.leader()
	var fs []int
	for i := 0; i < n.c.size(); i++ {
		if i != l {
			fs = append(fs, i)
		}
	}
	return fs[n.rng.IntN(len(fs))]
}

func ids(idx ...int) []int {
	out := make([]int, len(idx))
	for i, x := range idx {
		out[i] = x + 1
	}
	sort.Ints(out)
	return out
}

// hold keeps a fault for 2 to 8 election timeouts (pauses from 1: a
// leader that resumes just as its successor is elected is the interesting
// case).
func (n *nemesis) hold(until time.Time) { n.holdFrom(2, until) }

func (n *nemesis) holdFrom(lo time.Duration, until time.Time) {
	pace(n.dur(lo*n.base, 8*n.base), until.Add(2*n.base))
}

func (n *nemesis) record(kind string, targets []int, start int64, detail string) {
	f := Fault{Kind: kind, Targets: targets, Start: start, End: n.h.Now(), Detail: detail}
	n.h.addFault(f)
	n.logf("fault %-22s nodes %v %s [%s, %s]", kind, targets, detail, ms(f.Start), ms(f.End))
}

func (n *nemesis) mode() (linkMode, string) {
	if n.c.blackholes() && n.rng.IntN(2) == 0 {
		return linkBlackhole, "blackhole"
	}
	return linkDrop, "drop"
}

func (n *nemesis) inject(kind string, until time.Time) error {
	start := n.h.Now()
	size := n.c.size()
	switch kind {
	case FaultCrashLeader, FaultStopLeader, FaultCrashFollower:
		i := n.leaderOr(true)
		if kind == FaultCrashFollower {
			i = n.follower()
		}
		stop := n.c.crash
		if kind == FaultStopLeader {
			stop = n.c.stop
		}
		if kind == FaultCrashLeader && n.beforeLeaderCrash != nil {
			n.beforeLeaderCrash()
		}
		if err := stop(i); err != nil {
			return err
		}
		n.hold(until)
		err := n.c.restart(i)
		n.record(kind, ids(i), start, "")
		return err
	case FaultCrashMajority, FaultCrashAll:
		victims := []int{}
		if l := n.leaderOr(false); l >= 0 {
			victims = append(victims, l)
		}
		want := size/2 + 1
		if kind == FaultCrashAll {
			want = size
		}
		for _, i := range n.rng.Perm(size) {
			if len(victims) < want && !contains(victims, i) {
				victims = append(victims, i)
			}
		}
		var errs []error
		for _, i := range victims {
			errs = append(errs, n.c.crash(i))
		}
		n.hold(until)
		for _, i := range victims {
			errs = append(errs, n.c.restart(i))
		}
		n.record(kind, ids(victims...), start, "")
		return errors.Join(errs...)
	case FaultPartitionLeader, FaultPartitionFollower:
		i := n.leaderOr(true)
		if kind == FaultPartitionFollower {
			i = n.follower()
		}
		m, md := n.mode()
		n.c.setLinks(func(from, to int) bool { return from != i && to != i }, m)
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, ids(i), start, md)
	case FaultPartitionSplit:
		perm := n.rng.Perm(size)
		minority := perm[:1+n.rng.IntN((size-1)/2)]
		side := map[int]bool{}
		for _, i := range minority {
			side[i] = true
		}
		m, md := n.mode()
		n.c.setLinks(func(from, to int) bool { return side[from] == side[to] }, m)
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, ids(minority...), start, md+" (minority listed)")
	case FaultPartitionOneWay:
		i := n.leaderOr(true)
		m, md := n.mode()
		if n.rng.IntN(2) == 0 {
			n.c.setLinks(func(from, to int) bool { return from != i }, m)
			md += ", outbound of the node cut"
		} else {
			n.c.setLinks(func(from, to int) bool { return to != i }, m)
			md += ", inbound of the node cut"
		}
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, ids(i), start, md)
	case FaultPartitionBridge:
		perm := n.rng.Perm(size)
		bridge := perm[0]
		left := map[int]bool{}
		for _, i := range perm[1 : 1+(size-1)/2] {
			left[i] = true
		}
		m, md := n.mode()
		n.c.setLinks(func(from, to int) bool {
			return from == bridge || to == bridge || left[from] == left[to]
		}, m)
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, ids(bridge), start, md+" (bridge node listed)")
	case FaultPartitionFlaky:
		n.c.setLinks(func(from, to int) bool { return rand.IntN(100) >= 30 }, linkDrop)
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, nil, start, "each send and each receive of a raft message dropped with 30% probability")
	case FaultPauseLeader, FaultPauseFollower:
		i := n.leaderOr(true)
		if kind == FaultPauseFollower {
			i = n.follower()
		}
		if err := n.c.pause(i); err != nil {
			return err
		}
		n.holdFrom(1, until)
		err := n.c.resume(i)
		n.record(kind, ids(i), start, "SIGSTOP/SIGCONT")
		return err
	case FaultClockForward, FaultClockBackward:
		i := n.leaderOr(true)
		if n.rng.IntN(4) == 0 {
			i = n.rng.IntN(size)
		}
		d := n.dur(n.leaseMax/4, n.leaseMax*3/2)
		if kind == FaultClockBackward {
			d = -n.dur(n.leaseMax/8, n.leaseMax/2)
		}
		if err := n.c.jump(i, d); err != nil {
			return err
		}
		n.h.addJump(Jump{At: start, Node: i + 1, Delta: int64(d)})
		n.record(kind, ids(i), start, fmt.Sprintf("lease clock %+v", d))
	case FaultClockPartition:
		// The old leader's clock runs ahead while it is cut off: it may
		// believe leases ended that the new leader still times.
		i := n.leaderOr(true)
		d := n.dur(n.leaseMax/4, n.leaseMax)
		if err := n.c.jump(i, d); err != nil {
			return err
		}
		n.h.addJump(Jump{At: start, Node: i + 1, Delta: int64(d)})
		n.c.setLinks(func(from, to int) bool { return from != i && to != i }, linkDrop)
		n.hold(until)
		n.c.setLinks(nil, linkDrop)
		n.record(kind, ids(i), start, fmt.Sprintf("lease clock %+v, then isolated", d))
	case FaultDiskSync, FaultDiskFull, FaultDiskFullRestart:
		return n.injectDisk(kind, until)
	case FaultWipeNode:
		w, ok := n.c.(wiper)
		if !ok {
			return errUnsupported
		}
		i := n.leaderOr(true)
		if n.rng.IntN(2) == 0 {
			i = n.follower()
		}
		detail, problems, err := w.wipe(i)
		if err != nil {
			detail += " error: " + err.Error()
		}
		n.record(kind, ids(i), start, detail)
		n.mu.Lock()
		for _, p := range problems {
			n.violations = append(n.violations, Violation{Checker: "wipe-node", Message: fmt.Sprintf("node %d: %s", i+1, p)})
		}
		n.mu.Unlock()
		return err
	default:
		return fmt.Errorf("unknown fault kind %q", kind)
	}
	return nil
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// describeLinks renders a link filter for logs.
func describeLinks(n int, allow func(from, to int) bool) string {
	if allow == nil {
		return "all links up"
	}
	var cut []string
	for f := 0; f < n; f++ {
		for t := 0; t < n; t++ {
			if f != t && !allow(f, t) {
				cut = append(cut, fmt.Sprintf("%d->%d", f+1, t+1))
			}
		}
	}
	return "cut " + strings.Join(cut, " ")
}
