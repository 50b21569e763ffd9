package daemon

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketd/ticketd/raftstore"
)

// Leader placement: leadership follows the clients.
//
// Only the leader serves the lock subjects, so a request from a client
// connected to a follower's NATS server crosses a route to the leader's
// server and its reply crosses back: measured on three local nodes, that
// is up to a third more CPU per lock cycle and 0.15–0.45 ms more per
// request than a client on the leader's own server (docs/benchmarks.md,
// "Where the client lands"). When most requests come through one other node's server, the
// leader hands leadership to that node, as CockroachDB moves a range's
// lease towards the region its requests come from.
//
// Where a request came from: its reply subject is the requester's inbox,
// which the requester's server has a subscription for; other servers know
// that subscription through their route to it. Each window the leader
// takes a sample of its requests' reply subjects (natsapi.TakeOrigins) and
// looks them up in its embedded server's route subscriptions (Routez): a
// sample found on the route to ticketd-<id> came through node id's server;
// one found on no route came from a client of the leader's own server.
//
// When it moves: one node's server is the origin of more than half of the
// sample and of at least twice as many samples as the leader's own server,
// in PlacementWindows windows in a row, each with at least
// PlacementMinRequests requests, and the leader has led for PlacementSettle.
// After a move the new leader's own server holds the majority, so no other
// node can meet the rule until the clients themselves move: leadership
// does not bounce. With clients spread evenly nothing moves.
//
// Why it is safe: it is the planned move of a SIGTERM stop
// (raftstore.TransferLeadership: drain, then raft's leadership transfer
// to a voter that is active and replicating). A request that meets the
// move was refused before anything was proposed and is forwarded to the
// new leader (natsapi replyLockErr); tokens and the lock table do not
// depend on who leads. What a move costs: a few milliseconds in which the
// leader proposes nothing, and the waiters queued on the old leader, which
// get not_leader and queue again on the new one (FIFO order among them is
// not kept, as in any change of leader).
//
// What bounds it: a move needs PlacementWindows windows in a row, and a
// node moves leadership to the same node at most once per
// PlacementRetargetAfter (a client choosing its reply subjects, or a node
// that yields leadership because its disk is full, cannot make it bounce).
//
// It needs the embedded server (an external one's routes are not this
// node's to read) without gateways, and the embedded servers' default
// names (ticketd-<id>); --leader-placement=off turns it off.

// Leader placement settings (config leader-placement).
const (
	PlacementFollowClients = "follow-clients"
	PlacementOff           = "off"
)

// Leader placement bounds.
const (
	// PlacementWindow is how often the leader looks at its sample.
	PlacementWindow = time.Second
	// PlacementWindows is how many windows in a row must name the same
	// node.
	PlacementWindows = 2
	// PlacementMinRequests is the fewest requests in a window that count:
	// below it, where the leader sits costs nobody much.
	PlacementMinRequests = 200
	// PlacementSettle is how long a node leads before it looks.
	PlacementSettle = 3 * time.Second
	// PlacementRetargetAfter is how long a node does not move leadership
	// to a node it moved it to, or failed to, before: a node that yields
	// leadership (a full disk) or a client that changes its reply
	// subjects on purpose gets at most one move per pair of nodes in that
	// time. (A node whose disk stays low gets leadership back that often
	// and yields it again, refusing grants meanwhile.)
	PlacementRetargetAfter = 5 * time.Minute
	// PlacementMaxRouteSubs bounds the route subscriptions the leader
	// copies (Routez) to place a sample; above it placement waits.
	PlacementMaxRouteSubs = 1 << 16
)

// serverNamePrefix is the embedded servers' default name without the id.
const serverNamePrefix = "ticketd-"

// originCounts is where one window's sampled requests came from.
type originCounts struct {
	local   int            // a client of the leader's own server
	remote  map[uint64]int // through node id's server
	unknown int            // through a server that is not a ticketd node's
}

// placementTarget is the node a window's sample says should lead, or 0:
// the one that is the origin of more than half of the sample and of at
// least twice as many as the leader's own server.
func placementTarget(c originCounts) uint64 {
	total := c.local + c.unknown
	ids := make([]uint64, 0, len(c.remote))
	for id, n := range c.remote {
		total += n
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		if n := c.remote[id]; 2*n > total && n >= 2*c.local {
			return id
		}
	}
	return 0
}

// sampleOrigins looks each reply subject up in the route subscriptions of
// routes, where a requester's server announced its inbox: exactly, as
// "parent.*" (nats.go's shared request inbox) or as "prefix.>" with at
// least two tokens before the ">" (a catch-all such as "_INBOX.>" says
// nothing of one requester). The most specific match wins.
func sampleOrigins(replies []string, routes []*natsserver.RouteInfo) originCounts {
	want := make(map[string][]int, 3*len(replies))
	for i, r := range replies {
		want[r] = append(want[r], i)
		first := strings.IndexByte(r, '.')
		for j := first + 1; first > 0 && j < len(r); j++ {
			if r[j] == '.' {
				want[r[:j]+".>"] = append(want[r[:j]+".>"], i)
			}
		}
		if j := strings.LastIndexByte(r, '.'); j > 0 {
			want[r[:j]+".*"] = append(want[r[:j]+".*"], i)
		}
	}
	type match struct {
		node  uint64 // 0: a server that is not a ticketd node's
		score int    // length of the matching subscription: longer is more specific
		tie   bool   // another node's server has an equally specific match
	}
	best := make([]match, len(replies))
	for _, ri := range routes {
		node, _ := nodeOfServer(ri.RemoteName)
		for _, sub := range ri.Subs {
			for _, i := range want[sub] {
				switch b := &best[i]; {
				case len(sub) > b.score:
					*b = match{node: node, score: len(sub)}
				case len(sub) == b.score && node != b.node:
					b.tie = true
				}
			}
		}
	}
	c := originCounts{remote: map[uint64]int{}}
	for _, m := range best {
		switch {
		case m.score == 0:
			c.local++
		case m.node == 0 || m.tie:
			c.unknown++ // Routez lists routes in no fixed order: never pick one of a tie
		default:
			c.remote[m.node]++
		}
	}
	return c
}

// nodeOfServer is the node id in an embedded server's default name.
func nodeOfServer(name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, serverNamePrefix)
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseUint(rest, 10, 64)
	return id, err == nil && id != 0
}

// placement is the leader-placement loop's state.
type placement struct {
	d         *Daemon
	transfers prometheus.Counter
	// leaderSince is when the loop first saw this node lead (zero: not
	// leading); streak counts windows in a row naming target; movedTo is
	// when this node last moved leadership to each node.
	leaderSince time.Time
	target      uint64
	streak      int
	movedTo     map[uint64]time.Time
}

// startPlacement runs the leader-placement loop until Close, when the
// embedded server allows it and the configuration does not turn it off.
func (d *Daemon) startPlacement() {
	p := &placement{d: d, movedTo: map[uint64]time.Time{}, transfers: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketd_leader_placement_transfers_total",
		Help: "Leadership moves to another node, done because most requests came through its NATS server.",
	})}
	d.reg.MustRegister(p.transfers)
	if d.cfg.LeaderPlacement == PlacementOff || d.ns == nil || d.ns.GatewayAddr() != nil || d.api == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var once sync.Once
	d.placementStop = func() { once.Do(func() { cancel(); <-done }) }
	go func() {
		defer close(done)
		p.run(ctx)
	}()
}

func (p *placement) run(ctx context.Context) {
	t := time.NewTicker(PlacementWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.window(ctx, now)
		}
	}
}

// window looks at one window's sample and moves leadership when the rule
// holds.
func (p *placement) window(ctx context.Context, now time.Time) {
	d := p.d
	requests, replies := d.api.TakeOrigins()
	if !d.node.IsLeader() {
		p.leaderSince, p.streak = time.Time{}, 0
		return
	}
	if p.leaderSince.IsZero() {
		p.leaderSince = now
	}
	if now.Sub(p.leaderSince) < PlacementSettle || requests < PlacementMinRequests || len(replies) == 0 {
		p.streak = 0
		return
	}
	rz, err := d.ns.Routez(nil)
	if err == nil {
		subs := 0
		for _, r := range rz.Routes {
			subs += int(r.NumSubs)
		}
		if subs > PlacementMaxRouteSubs {
			p.streak = 0
			return
		}
		rz, err = d.ns.Routez(&natsserver.RoutezOptions{Subscriptions: true})
	}
	if err != nil {
		d.log.Debug("leader placement: routes not readable", "err", err)
		p.streak = 0
		return
	}
	c := sampleOrigins(replies, rz.Routes)
	target := placementTarget(c)
	switch {
	case target == 0 || target == d.cfg.ID || now.Sub(p.movedTo[target]) < PlacementRetargetAfter:
		p.streak = 0
		return
	case target == p.target:
		p.streak++
	default:
		p.target, p.streak = target, 1
	}
	if p.streak < PlacementWindows {
		return
	}
	p.streak = 0
	p.leaderSince = now // whatever happens, do not try again at once
	d.log.Info("most requests come through another node's NATS server: handing leadership to it",
		"to", target, "requests", requests, "sample", len(replies), "through_it", c.remote[target], "local", c.local)
	tctx, cancel := context.WithTimeout(ctx, HandOverTimeout(d.cfg))
	defer cancel()
	err = d.node.TransferLeadership(tctx, target)
	if !errors.Is(err, raftstore.ErrNotLeader) {
		// Moved, or failed (perhaps after raft dropped proposals for an
		// election timeout): either way not to that node again soon.
		p.movedTo[target] = now
	}
	if err != nil {
		d.log.Info("leader placement: leadership not moved", "to", target, "err", err)
		return
	}
	p.transfers.Inc()
}
