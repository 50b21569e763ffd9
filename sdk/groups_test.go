package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"
	"github.com/ticketd/ticketd/transports/protocol"
)

// heldIn reports whether group c's leader holds key.
func heldIn(t *testing.T, c *testcluster.Cluster, key string) bool {
	t.Helper()
	d := c.Node(c.Leader(10 * time.Second))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	h, err := d.Locks().Get(ctx, key)
	if err != nil {
		t.Fatalf("get %q on its group's leader: %v", key, err)
	}
	return h.Held
}

// TestTwoGroupsBehindOneNATS is issue 27's working proof: two 3-node
// ticketd clusters (groups 0 and 1 of 2) behind one 2-server NATS
// cluster whose configuration holds the partition mapping, and clients
// on either server configured WithPartitioned. Every key is always
// served by the group it hashes to (the grant names it, and only that
// group's leader holds the key), tokens rise per key, a request sent on
// another key's subject is refused with wrong_group, the classic subjects
// are not served, a list across groups returns every lock exactly once
// in key order, and with group 1 killed entirely group 0 keeps serving
// its keys while group 1's keys fail with unavailable naming the group.
func TestTwoGroupsBehindOneNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("two in-process groups skipped in -short mode")
	}
	const groups = 2
	gs := testcluster.NewGroups(t, 2, groups, 3)
	cluster := gs.Clusters
	var clients []*sdk.Client
	for _, s := range gs.NATS {
		cl, err := sdk.Connect(s.ClientURL(), sdk.WithPartitioned(), sdk.WithRequestTimeout(2*time.Second),
			sdk.WithRetryBackoff(5*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		clients = append(clients, cl)
	}
	ctx := t.Context()

	// Every key, through either NATS server, is granted by its group
	// alone, with tokens rising per key.
	const keys, rounds = 24, 3
	keyGroup := map[string]uint32{}
	last := map[string]uint64{}
	perGroup := [groups]int{}
	for r := range rounds {
		for k := range keys {
			key := fmt.Sprintf("tenant-%d/orders/%d", k%3, k)
			want := protocol.GroupOf(key, groups)
			keyGroup[key] = want
			l, err := clients[(r+k)%len(clients)].Acquire(ctx, key, sdk.WithLease(30*time.Second))
			if err != nil {
				t.Fatalf("round %d: acquire %q: %v", r, key, err)
			}
			if l.Group == nil || *l.Group != want {
				t.Fatalf("key %q of group %d granted by group %v", key, want, l.Group)
			}
			if l.Token <= last[key] {
				t.Fatalf("key %q: token %d after %d", key, l.Token, last[key])
			}
			last[key] = l.Token
			if !heldIn(t, cluster[want], key) || heldIn(t, cluster[1-want], key) {
				t.Fatalf("key %q of group %d: held in group %d %v, in group %d %v", key, want,
					want, heldIn(t, cluster[want], key), 1-want, heldIn(t, cluster[1-want], key))
			}
			if r < rounds-1 {
				if err := l.Release(ctx); err != nil {
					t.Fatalf("release %q: %v", key, err)
				}
			}
			if r == 0 {
				perGroup[want]++
			}
		}
	}
	if perGroup[0] == 0 || perGroup[1] == 0 {
		t.Fatalf("keys per group %v: the test needs keys in both", perGroup)
	}

	// List across groups: every held lock once, in key order, with its
	// group, through pages smaller than either group's share.
	var listed []string
	for h, err := range clients[0].ListAll(ctx, "tenant-", 5) {
		if err != nil {
			t.Fatalf("list across groups: %v", err)
		}
		if h.Group == nil || *h.Group != keyGroup[h.Key] || h.Token != last[h.Key] {
			t.Fatalf("listed %+v: want group %d, token %d", h, keyGroup[h.Key], last[h.Key])
		}
		if len(listed) > 0 && h.Key <= listed[len(listed)-1] {
			t.Fatalf("listed %q after %q", h.Key, listed[len(listed)-1])
		}
		listed = append(listed, h.Key)
	}
	if len(listed) != keys {
		t.Fatalf("listed %d locks across groups, want %d: %v", len(listed), keys, listed)
	}

	// A key's request sent on another key's subject lands in the other
	// key's group, which refuses it: a sender cannot pick the group.
	var own, foreign string // a key of group 0, and one of group 1
	for key, g := range keyGroup {
		if g == 0 {
			own = key
		} else {
			foreign = key
		}
	}
	nc := clients[1].Conn()
	m, err := nc.RequestWithContext(ctx, protocol.KeyedSubject(own, "get"), fmt.Appendf(nil, `{"key":%q}`, foreign))
	if err != nil {
		t.Fatal(err)
	}
	var pe *protocol.Error
	if err := protocol.ParseReply(m.Data, nil); !errors.As(err, &pe) || pe.Code != protocol.CodeWrongGroup {
		t.Fatalf("get of a group-1 key on a group-0 key's subject: %v, want wrong_group", err)
	}
	// The classic subjects of a single cluster are not served here.
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = nc.RequestWithContext(rctx, protocol.SubjectGet, fmt.Appendf(nil, `{"key":%q}`, own))
	cancel()
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a request on %s: %v, want no responders", protocol.SubjectGet, err)
	}

	// Group 1 dies entirely; group 0 keeps serving its keys.
	cluster[1].Close()
	for key, g := range keyGroup {
		if g != 0 {
			continue
		}
		for _, cl := range clients {
			if err := cl.Release(ctx, key, last[key]); err != nil && !errors.Is(err, sdk.ErrNotFound) {
				t.Fatalf("release %q with group 1 down: %v", key, err)
			}
			l, err := cl.Acquire(ctx, key, sdk.WithLease(30*time.Second))
			if err != nil {
				t.Fatalf("acquire %q of group 0 with group 1 down: %v", key, err)
			}
			if *l.Group != 0 || l.Token <= last[key] {
				t.Fatalf("key %q with group 1 down: group %d token %d after %d", key, *l.Group, l.Token, last[key])
			}
			last[key] = l.Token
		}
	}
	fctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	_, err = clients[0].Acquire(fctx, foreign, sdk.WithLease(30*time.Second))
	if !errors.Is(err, sdk.ErrUnavailable) || !strings.Contains(err.Error(), "group 1") {
		t.Fatalf("acquire of a group-1 key with group 1 down: %v, want unavailable naming group 1", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if _, err := clients[0].List(lctx, "", "", 0); !errors.Is(err, sdk.ErrUnavailable) || !strings.Contains(err.Error(), "group 1") {
		t.Fatalf("list with group 1 down: %v, want unavailable naming group 1", err)
	}
}
