package protocol

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestGroupOfMatchesNATSMapping: the group a node computes for a key is
// the one nats-server's own transform of PartitionMapping sends the key's
// request to, for every group count tried, so a node never refuses a key
// the mapping gives it, nor serves one the mapping gives another group.
func TestGroupOfMatchesNATSMapping(t *testing.T) {
	keys := []string{"a", "orders/42", "with space", "ünïcödé", "dots.in.key", "*", ">", strings.Repeat("k", 512), "\x01ctl"}
	for i := 0; i < 200; i++ {
		keys = append(keys, fmt.Sprintf("tenant-%d/job/%d", i%7, i))
	}
	for _, groups := range []uint32{1, 2, 3, 8, 32, MaxGroups} {
		src, dest := PartitionMapping(groups)
		tr, err := server.NewSubjectTransform(src, dest)
		if err != nil {
			t.Fatalf("groups %d: nats-server refuses the mapping %q -> %q: %v", groups, src, dest, err)
		}
		for _, key := range keys {
			for _, op := range KeyedOps {
				got, err := tr.Match(KeyedSubject(key, op))
				if err != nil {
					t.Fatalf("groups %d: the mapping does not match %s: %v", groups, KeyedSubject(key, op), err)
				}
				want := GroupSubject(GroupOf(key, groups), op)
				if got != want {
					t.Fatalf("groups %d, key %q: nats-server maps to %s, GroupOf says %s", groups, key, got, want)
				}
			}
		}
	}
}

// TestGroupOfSplitsOnlyToNewGroups: multiplying the group count moves a
// key only to a new group, never from one existing group to another
// (docs/scaling.md, adding groups).
func TestGroupOfSplitsOnlyToNewGroups(t *testing.T) {
	for i := 0; i < 2000; i++ {
		key := fmt.Sprintf("k%d", i)
		for _, n := range []uint32{1, 2, 3, 4, 8} {
			for _, k := range []uint32{2, 3, 4} {
				before, after := GroupOf(key, n), GroupOf(key, n*k)
				if after%n != before {
					t.Fatalf("key %q: group %d of %d became group %d of %d, an existing group", key, before, n, after, n*k)
				}
			}
		}
	}
}

// TestGroupOfSpreads: keys spread over the groups about evenly.
func TestGroupOfSpreads(t *testing.T) {
	const groups, keys = 8, 8000
	var count [groups]int
	for i := 0; i < keys; i++ {
		count[GroupOf(fmt.Sprintf("orders/%d", i), groups)]++
	}
	for g, c := range count {
		if c < keys/groups*8/10 || c > keys/groups*12/10 {
			t.Fatalf("group %d has %d of %d keys: %v", g, c, keys, count)
		}
	}
}

func TestPartitionSubjects(t *testing.T) {
	var none Partition
	if none.Partitioned() || none.LockSubject("acquire") != SubjectAcquire || none.ForwardSubject(3, "get") != ForwardSubject(3, "get") ||
		none.NodeStatusSubject(2) != NodeStatusSubject(2) || !none.Owns("anything") {
		t.Fatal("the zero Partition must keep the classic subjects and serve every key")
	}
	p := Partition{Group: 1, Groups: 4}
	for _, c := range []struct{ got, want string }{
		{p.LockSubject("acquire"), "ticketd.v1.g.1.lock.acquire"},
		{p.ForwardSubject(3, "get"), "ticketd.v1.fwd.g.1.3.get"},
		{p.NodeStatusSubject(2), "ticketd.v1.g.1.node.2.status"},
		{GroupStatusSubject(1), "ticketd.v1.g.1.status"},
		{KeyedSubject("orders/42", "renew"), "ticketd.v1.p." + KeyHash("orders/42") + ".lock.renew"},
		{strings.TrimPrefix(WatchSubject("with space"), SubjectWatchPrefix+".h."), KeyHash("with space")},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	if p.Owns("k") != (GroupOf("k", 4) == 1) {
		t.Fatal("Owns disagrees with GroupOf")
	}
}

func TestPartitionValidate(t *testing.T) {
	for _, c := range []struct {
		p  Partition
		ok bool
	}{
		{Partition{}, true},
		{Partition{Group: 0, Groups: 1}, true},
		{Partition{Group: 3, Groups: 4}, true},
		{Partition{Group: MaxGroups - 1, Groups: MaxGroups}, true},
		{Partition{Group: 1}, false},
		{Partition{Group: 4, Groups: 4}, false},
		{Partition{Group: 0, Groups: MaxGroups + 1}, false},
	} {
		if err := c.p.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: Validate() = %v", c.p, err)
		}
	}
}

func BenchmarkGroupOf(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = GroupOf("orders/42", 8)
	}
}
