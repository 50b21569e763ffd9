package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ticketd/ticketd/transports/protocol"
)

// threeViews is a cluster of a leader (1), a learner (2) with its disk
// alarm raised, and a member that does not answer (3).
func threeViews() (first *protocol.StatusReply, ask askMember) {
	members := []protocol.Member{{ID: 1, Voter: true}, {ID: 2}, {ID: 3, Voter: true}}
	views := map[uint64]*protocol.StatusReply{
		1: {ID: 1, Leader: 1, Term: 4, State: "StateLeader", Role: "leader", Version: "v1.2.0 abcdef012345", MaxClusterVersion: 2, CommitIndex: 90, AppliedIndex: 90, Members: members},
		// An older binary: no role, version or max cluster version.
		2: {ID: 2, Leader: 1, Term: 4, State: "StateFollower", CommitIndex: 90, AppliedIndex: 88, Alarms: []string{"nospace"}, Members: members},
	}
	return views[1], func(_ context.Context, id uint64) (*protocol.StatusReply, error) {
		if v, ok := views[id]; ok {
			return v, nil
		}
		return nil, errors.New("nats: no responders available for request")
	}
}

// `status --watch` shows a learner as a learner (even from a binary that
// does not say so itself), a member that does not answer as unreachable,
// and each member's cluster format, alarms and binary version.
func TestWatchViewRolesAndColumns(t *testing.T) {
	first, ask := threeViews()
	views, errs := askMembers(context.Background(), ask, memberIDs(first), first)
	out := renderView(time.Now(), first, views, errs, map[uint64]sample{})
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 {
			rows[f[0]] = f
		}
	}
	if h := rows["ID"]; strings.Join(h, " ") != "ID ROLE TERM COMMIT APPLIED LAG LOCKS LAST_TOKEN APPLIED/s GRANTS/s FORMAT ALARMS VERSION" {
		t.Fatalf("header %v", h)
	}
	want := map[string]string{
		"1": "1 leader 4 90 90 0 0 0 - - 2 - v1.2.0@abcdef012345",
		"2": "2 learner 4 90 88 2 0 0 - - 1 nospace -",
		"3": "3 unreachable - - - - - - - - - - -",
	}
	for id, w := range want {
		if got := strings.Join(rows[id], " "); got != w {
			t.Errorf("row %s: %q, want %q\n%s", id, got, w, out)
		}
	}
	if !strings.Contains(out, "node 3: nats: no responders") {
		t.Errorf("no reason for the unreachable member:\n%s", out)
	}
}

// `status` lists every member's own answer and names the unreachable ones;
// a member that does not answer is not a plugin mismatch.
func TestStatusReportMembers(t *testing.T) {
	first, ask := threeViews()
	b, err := json.Marshal(statusReport(context.Background(), ask, first))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID             uint64         `json:"id"`
		MemberStatus   []memberStatus `json:"member_status"`
		Unreachable    []uint64       `json:"unreachable"`
		PluginMismatch []any          `json:"plugin_mismatch"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != 1 || len(got.MemberStatus) != 3 || len(got.Unreachable) != 1 || got.Unreachable[0] != 3 || got.PluginMismatch != nil {
		t.Fatalf("report %s", b)
	}
	m1, m2, m3 := got.MemberStatus[0], got.MemberStatus[1], got.MemberStatus[2]
	if !m1.Reachable || m1.Role != "leader" || m1.Version != "v1.2.0 abcdef012345" || m1.MaxClusterVersion != 2 {
		t.Errorf("member 1: %+v", m1)
	}
	if !m2.Reachable || m2.Role != "learner" || len(m2.Alarms) != 1 || m2.MaxClusterVersion != 1 {
		t.Errorf("member 2: %+v", m2)
	}
	if m3.Reachable || !strings.Contains(m3.Error, "no responders") {
		t.Errorf("member 3: %+v", m3)
	}
}
