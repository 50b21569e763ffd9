package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestLockCommandsAcrossGroups: with --partitioned the lock commands
// reach each key's group through the NATS mapping (the grant names it),
// lock ls lists every group's locks in one key order with their groups,
// lock ls --group lists one group's alone, and status --group shows the
// group asked for; without --partitioned a
// partitioned deployment does not answer at all. Two one-node groups: the
// sdk's TestTwoGroupsBehindOneNATS runs three-node ones.
func TestLockCommandsAcrossGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process groups skipped in -short mode")
	}
	gs := testcluster.NewGroups(t, 1, 2, 1)
	url := gs.ClientURL(0)
	var keys []string
	groupOf := map[string]uint32{}
	for i := range 9 {
		key := fmt.Sprintf("cli/%d", i)
		code, out, errOut := runInProcess("lock", "acquire", key, "--lease", "1m", "--partitioned", "--nats", url)
		if code != 0 {
			t.Fatalf("acquire %s: exit %d %s", key, code, errOut)
		}
		var v struct {
			Token uint64  `json:"token"`
			Group *uint32 `json:"group"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil || v.Group == nil || *v.Group != protocol.GroupOf(key, 2) {
			t.Fatalf("acquire %s printed %s (%v): want group %d", key, out, err, protocol.GroupOf(key, 2))
		}
		keys = append(keys, key)
		groupOf[key] = *v.Group
	}

	code, out, errOut := runInProcess("lock", "ls", "cli/", "--limit", "2", "--partitioned", "--nats", url)
	if code != 0 {
		t.Fatalf("ls: exit %d %s", code, errOut)
	}
	var listed []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var v struct {
			Key   string  `json:"key"`
			Group *uint32 `json:"group"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil || v.Group == nil || *v.Group != groupOf[v.Key] {
			t.Fatalf("ls line %s (%v): want group %d", sc.Text(), err, groupOf[v.Key])
		}
		listed = append(listed, v.Key)
	}
	if fmt.Sprint(listed) != fmt.Sprint(keys) {
		t.Fatalf("ls across groups listed %v, want %v", listed, keys)
	}

	code, out, errOut = runInProcess("lock", "ls", "", "--group", "1", "--nats", url)
	if code != 0 {
		t.Fatalf("ls --group 1: exit %d %s", code, errOut)
	}
	for line := range strings.Lines(out) {
		var v struct {
			Key   string  `json:"key"`
			Group *uint32 `json:"group"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil || v.Group == nil || *v.Group != 1 || groupOf[v.Key] != 1 {
			t.Fatalf("ls --group 1 line %s (%v)", line, err)
		}
	}
	want := 0
	for _, g := range groupOf {
		if g == 1 {
			want++
		}
	}
	if strings.Count(out, "\n") != want {
		t.Fatalf("ls --group 1 listed %d locks, want %d:\n%s", strings.Count(out, "\n"), want, out)
	}

	code, out, errOut = runInProcess("status", "--group", "1", "--partitioned", "--nats", url)
	var st protocol.StatusReply
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Group == nil || *st.Group != 1 || st.Groups != 2 {
		t.Fatalf("status --group 1: exit %d %s %s", code, out, errOut)
	}

	code, _, errOut = runInProcess("lock", "get", keys[0], "--timeout", "500ms", "--nats", url)
	if code == 0 || !strings.Contains(errOut, "unavailable") || !strings.Contains(errOut, "--partitioned") {
		t.Fatalf("get without --partitioned: exit %d %s, want unavailable", code, errOut)
	}
}
