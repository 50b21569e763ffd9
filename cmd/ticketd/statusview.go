package main

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// memberStatusTimeout bounds the wait for one member's own status: a
// stopped member answers "no responders" at once, a hung one must not hold
// the whole command for its --timeout.
const memberStatusTimeout = 2 * time.Second

// askMember asks member id, on its own status subject, for its view.
type askMember func(ctx context.Context, id uint64) (*protocol.StatusReply, error)

// askMembers asks every member in ids at once; self, the view already in
// hand, is not asked again. A member that does not answer is in errs.
func askMembers(ctx context.Context, ask askMember, ids []uint64, self *protocol.StatusReply) (views map[uint64]*protocol.StatusReply, errs map[uint64]error) {
	views = make(map[uint64]*protocol.StatusReply, len(ids))
	errs = make(map[uint64]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range ids {
		if self != nil && id == self.ID {
			views[id] = self
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
			defer cancel()
			st, err := ask(mctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[id] = err
			} else {
				views[id] = st
			}
		}()
	}
	wg.Wait()
	return views, errs
}

// memberIDs are the ids of st's members, sorted.
func memberIDs(st *protocol.StatusReply) []uint64 {
	ids := make([]uint64, 0, len(st.Members))
	for _, m := range st.Members {
		ids = append(ids, m.ID)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// memberStatus is one member's own answer in `ticketd status`, or why
// there is none.
type memberStatus struct {
	ID                uint64   `json:"id"`
	Reachable         bool     `json:"reachable"`
	Role              string   `json:"role,omitempty"`
	Version           string   `json:"version,omitempty"`
	MaxClusterVersion uint64   `json:"max_cluster_version,omitempty"`
	AppliedIndex      uint64   `json:"applied_index,omitempty"`
	Alarms            []string `json:"alarms,omitempty"`
	DiskFreeBytes     uint64   `json:"disk_free_bytes,omitempty"`
	Error             string   `json:"error,omitempty"`
}

// pluginMismatch is a member whose plugin modules differ from the
// answering node's.
type pluginMismatch struct {
	ID      uint64                `json:"id"`
	Plugins []protocol.PluginInfo `json:"plugins"`
}

// statusReport is what `ticketd status` prints: st (the leader's view when
// there is one) with every member's own answer: its role (a learner as a
// learner), binary version, highest cluster version and alarms; the
// members that did not answer, as unreachable; and the members whose
// plugin modules differ from st's node's (different modules can give
// different Grant verdicts on different leaders).
func statusReport(ctx context.Context, ask askMember, st *protocol.StatusReply) any {
	ids := memberIDs(st)
	views, errs := askMembers(ctx, ask, ids, st)
	want := pluginSet(st.Plugins)
	report := struct {
		*protocol.StatusReply
		MemberStatus   []memberStatus   `json:"member_status"`
		Unreachable    []uint64         `json:"unreachable,omitempty"`
		PluginMismatch []pluginMismatch `json:"plugin_mismatch,omitempty"`
	}{StatusReply: st}
	for _, id := range ids {
		v := views[id]
		if v == nil {
			report.Unreachable = append(report.Unreachable, id)
			why := "no answer"
			if err := errs[id]; err != nil {
				why = err.Error()
			}
			report.MemberStatus = append(report.MemberStatus, memberStatus{ID: id, Error: why})
			continue
		}
		report.MemberStatus = append(report.MemberStatus, memberStatus{ID: id, Reachable: true, Role: roleOf(v, st),
			Version: v.Version, MaxClusterVersion: max(1, v.MaxClusterVersion), AppliedIndex: v.AppliedIndex,
			Alarms: v.Alarms, DiskFreeBytes: v.DiskFreeBytes})
		if pluginSet(v.Plugins) != want {
			report.PluginMismatch = append(report.PluginMismatch, pluginMismatch{ID: id, Plugins: v.Plugins})
		}
	}
	return report
}

// roleOf is a member's role from its own answer v; for a node too old to
// say, from its raft state, and a learner as membership (from any view)
// shows it.
func roleOf(v, membership *protocol.StatusReply) string {
	if v.Role != "" {
		return v.Role
	}
	r := strings.ToLower(strings.TrimPrefix(v.State, "State"))
	if r == "follower" {
		for _, m := range membership.Members {
			if m.ID == v.ID && !m.Voter {
				return "learner"
			}
		}
	}
	if r == "precandidate" {
		return "pre-candidate"
	}
	return r
}

func pluginSet(ps []protocol.PluginInfo) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p.Name+"="+p.SHA256)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
