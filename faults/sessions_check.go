package faults

import (
	"fmt"
	"sort"
	"time"
)

// SessionHold is one holder's session and the lock it took in it, as the
// sessions workload recorded it. Times are on the harness clock
// (History.Now).
type SessionHold struct {
	Holder  int    `json:"holder"`
	Session string `json:"session"`
	Key     string `json:"key"`
	Token   uint64 `json:"token"`
	TTL     int64  `json:"ttl_ns"`
	Delay   int64  `json:"lock_delay_ns"`
	// Got is when the holder's acquire in the session returned.
	Got int64 `json:"got_ns"`
	// Deadline is the session's last local deadline (sdk
	// Session.Deadline: the send of the open or of the last acknowledged
	// keepalive, plus the TTL); it never moves back.
	Deadline int64 `json:"deadline_ns"`
	// CloseCall is when the holder called Session.Close (0: never). A
	// close releases at once, without the lock-delay.
	CloseCall int64 `json:"close_call_ns,omitempty"`
	// Refused is when a keepalive answered not_found (the session ended
	// on the server) was seen (0: never).
	Refused int64 `json:"refused_ns,omitempty"`
	// Died is when the holder's client was closed, so its keepalives
	// stopped (0: never); DiedWithLeader says the leader was killed -9
	// right after.
	Died           int64 `json:"died_ns,omitempty"`
	DiedWithLeader bool  `json:"died_with_leader,omitempty"`
	// Alive: the session was still kept alive when the run ended (its
	// holder neither closed it nor lost it).
	Alive bool `json:"alive,omitempty"`
}

// SessionGrant is a granted acquire of a session key: a contender's
// (with a lease) or a holder's (in its session).
type SessionGrant struct {
	Client  int    `json:"client"`
	Key     string `json:"key"`
	Call    int64  `json:"call_ns"`
	Return  int64  `json:"return_ns"`
	Token   uint64 `json:"token"`
	Session string `json:"session,omitempty"`
}

// StatusObs is one node's answer to a status request: sent at Send,
// answered by Recv, the node's term and whether it led.
type StatusObs struct {
	Node   int    `json:"node"`
	Send   int64  `json:"send_ns"`
	Recv   int64  `json:"recv_ns"`
	Term   uint64 `json:"term"`
	Leader bool   `json:"leader"`
}

// SessionHistory is everything the sessions workload recorded.
type SessionHistory struct {
	Holds  []SessionHold  `json:"holds"`
	Grants []SessionGrant `json:"grants"`
	Status []StatusObs    `json:"status"`
}

// leaderTerm is what the status answers bound about one term's
// election: its leader took over after Since (the last send of a status
// request answered by that node with an older term) and by Seen (the
// first answer showing it lead the term).
type leaderTerm struct {
	Term        uint64
	Node        int
	Since, Seen int64
	HasSince    bool
}

// leaderTerms derives, for every term some node was seen to lead, the
// window its election fell in.
func leaderTerms(obs []StatusObs) []leaderTerm {
	byTerm := map[uint64]*leaderTerm{}
	for _, o := range obs {
		if !o.Leader {
			continue
		}
		lt := byTerm[o.Term]
		if lt == nil {
			lt = &leaderTerm{Term: o.Term, Node: o.Node, Seen: o.Recv}
			byTerm[o.Term] = lt
		}
		lt.Seen = min(lt.Seen, o.Recv)
	}
	out := make([]leaderTerm, 0, len(byTerm))
	for _, lt := range byTerm {
		for _, o := range obs {
			// The node answered from an older term at some moment after
			// the request's send, so it took over later than that send.
			if o.Node == lt.Node && o.Term < lt.Term && (!lt.HasSince || o.Send > lt.Since) {
				lt.Since, lt.HasSince = o.Send, true
			}
		}
		out = append(out, *lt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Term < out[j].Term })
	return out
}

// rearmed is the earliest the server may end the session of h according
// to the new-leader rule (docs/protocol.md §11: a new leader arms every
// session with its full TTL once it takes over): for each term whose
// leader certainly took over while the session certainly lived (seen
// leading before the session's local deadline), its lower bound plus the
// TTL. It returns 0 and no term when no such election is known.
func rearmed(h SessionHold, terms []leaderTerm) (int64, uint64) {
	var at int64
	var term uint64
	for _, lt := range terms {
		if lt.HasSince && lt.Seen < h.Deadline && lt.Since+h.TTL > at {
			at, term = lt.Since+h.TTL, lt.Term
		}
	}
	return at, term
}

// SessionCheck is the outcome of CheckSessions.
type SessionCheck struct {
	Violations []Violation
	// Judged counts the grants compared against an earlier hold of
	// their key; Rearmed the holds whose bound a leader change raised
	// past their own deadline; Regrants the delays from a dead holder's
	// deadline plus lock-delay to the next grant of its key.
	Judged, Rearmed int
	Regrants        []time.Duration
}

// CheckSessions checks a sessions history (sessions_workload.go). Every
// time is on the harness's one monotonic clock; the servers' clocks are
// other processes' monotonic clocks, which the checks only assume run at
// the real rate (no clock jumps: the process driver has none). They hold
// the server to what it promised, and can only find it ending something
// too early, never too late (beyond the drain's liveness bound):
//
//   - session-lost: a keepalive answered not_found before the session's
//     local deadline, or before the new-leader bound (rearmed);
//   - session-exclusion: a grant of a held key, called after the
//     holder's grant returned, returned before the holder's session can
//     have ended plus its lock-delay (the local deadline + lock-delay;
//     or before the holder's Close call when it closed the session: a
//     close releases without delay);
//   - session-rearm: the same with the new-leader bound in place of the
//     deadline: a leader that took over while the session lived must
//     give it its full TTL from then on.
func CheckSessions(sh SessionHistory) SessionCheck {
	var res SessionCheck
	terms := leaderTerms(sh.Status)
	for _, h := range sh.Holds {
		rearm, term := rearmed(h, terms)
		end := max(h.Deadline, rearm)
		if rearm > h.Deadline {
			res.Rearmed++
		}
		if h.Refused != 0 && h.Refused < end {
			why := fmt.Sprintf("its local deadline %s", ms(h.Deadline))
			if h.Refused >= h.Deadline {
				why = fmt.Sprintf("%s, the term-%d leader's full TTL (took over after %s)", ms(rearm), term, ms(rearm-h.TTL))
			}
			res.Violations = append(res.Violations, Violation{Checker: "session-lost", Key: h.Key,
				Message: fmt.Sprintf("session %s (holder %d, token %d) was refused a keepalive (not_found) at %s, before %s",
					h.Session, h.Holder, h.Token, ms(h.Refused), why)})
		}
		if h.Alive {
			end = 1<<63 - 1 - h.Delay
		}
		until := end + h.Delay
		if h.CloseCall != 0 {
			until = min(until, h.CloseCall)
		}
		var first int64
		for _, g := range sh.Grants {
			if g.Key != h.Key || g.Call <= h.Got || g.Token == h.Token {
				continue
			}
			res.Judged++
			if first == 0 || g.Return < first {
				first = g.Return
			}
			if g.Return >= until {
				continue
			}
			checker, bound := "session-exclusion", fmt.Sprintf("its local deadline %s + lock-delay %v", ms(h.Deadline), time.Duration(h.Delay))
			if h.Deadline+h.Delay <= g.Return && !h.Alive {
				checker = "session-rearm"
				bound = fmt.Sprintf("the term-%d leader's full TTL from its takeover (after %s) = %s, + lock-delay %v", term, ms(rearm-h.TTL), ms(rearm), time.Duration(h.Delay))
			}
			if h.Alive {
				bound = "the end of the run (still kept alive)"
			}
			if h.CloseCall != 0 && h.CloseCall == until {
				bound = fmt.Sprintf("its Close call at %s", ms(h.CloseCall))
			}
			res.Violations = append(res.Violations, Violation{Checker: checker, Key: h.Key,
				Message: fmt.Sprintf("token %d granted (called %s, returned %s) while session %s (holder %d, token %d, granted by %s) held the key or its lock-delay ran: until %s",
					g.Token, ms(g.Call), ms(g.Return), h.Session, h.Holder, h.Token, ms(h.Got), bound)})
		}
		if h.Died != 0 && first != 0 && h.CloseCall == 0 {
			res.Regrants = append(res.Regrants, time.Duration(first-(end+h.Delay)))
		}
	}
	return res
}
