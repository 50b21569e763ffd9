package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestRequestIDRetryAfterKill9 runs three real `ticketd serve` processes.
// An acquire with a request_id is granted by the leader, but its reply
// goes to an inbox nobody reads (the client never saw it); the leader is
// killed with SIGKILL; `ticketd lock acquire --request-id` with the same
// id, sent to a surviving node, prints the same token ("repeated"), not a
// second grant and not held. After the release, the same id fails with
// grant_ended naming that token.
func TestRequestIDRetryAfterKill9(t *testing.T) {
	bin := binary(t)
	const n = 3
	var peers, routes, members []string
	urls := make([]string, n)
	for i := 0; i < n; i++ {
		peers = append(peers, testkit.FreeAddr(t))
		routes = append(routes, testkit.FreeAddr(t))
		urls[i] = "nats://" + testkit.FreeAddr(t)
		members = append(members, fmt.Sprintf("%d=%s", i+1, peers[i]))
	}
	procs := make([]*proc, n)
	for i := 0; i < n; i++ {
		procs[i] = startServeEnv(t, bin, []string{"TICKETD_PEER_SECRET=process-test-secret-0123"},
			"--id", fmt.Sprint(i+1), "--data", t.TempDir(),
			"--nats-listen", strings.TrimPrefix(urls[i], "nats://"),
			"--nats-cluster-listen", routes[i], "--nats-routes", strings.Join(routes, ","),
			"--peer-listen", peers[i], "--initial-cluster", strings.Join(members, ","), "--initial-cluster-state", "new",
			"--tick-ms", "50", "--election-ticks", "10")
	}
	lead := -1
	testkit.Eventually(t, 20*time.Second, "a leader at cluster version 3", func() bool {
		for i := range urls {
			if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" && st.ClusterVersion >= 3 {
				lead = i
				return true
			}
		}
		return false
	})
	fol := (lead + 1) % n

	// The first attempt: granted, its reply lost.
	nc, err := nats.Connect(urls[fol])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body, _ := json.Marshal(protocol.AcquireRequest{Key: "jobs/nightly", LeaseMS: 60000, RequestID: "nightly-2026-12-04"})
	if err := nc.PublishRequest(protocol.SubjectAcquire, nc.NewInbox(), body); err != nil {
		t.Fatal(err)
	}
	var granted uint64
	testkit.Eventually(t, 10*time.Second, "the lost-reply grant applied", func() bool {
		v, _, code := cli(t, bin, "lock", "get", "jobs/nightly", "--nats", urls[fol])
		if code == 0 && v["held"] == true {
			granted = token(t, v)
			return true
		}
		return false
	})
	procs[lead].kill9(t)

	v, stderr, code := cli(t, bin, "lock", "acquire", "jobs/nightly", "--lease", "1m", "--request-id", "nightly-2026-12-04",
		"--nats", urls[fol], "--timeout", "20s")
	if code != 0 {
		t.Fatalf("retry after kill -9: exit %d %q", code, stderr)
	}
	if token(t, v) != granted || v["repeated"] != true || v["request_id"] != "nightly-2026-12-04" {
		t.Fatalf("retry after kill -9: %v, want token %d repeated", v, granted)
	}
	if r := runCLI(t, bin, "lock", "release", "jobs/nightly", "--token", fmt.Sprint(granted), "--nats", urls[fol]); r.code != 0 {
		t.Fatalf("release: exit %d %q", r.code, r.stderr)
	}
	_, stderr, code = cli(t, bin, "lock", "acquire", "jobs/nightly", "--request-id", "nightly-2026-12-04", "--nats", urls[fol])
	if code != exitFailure || !strings.Contains(stderr, "grant_ended") || !strings.Contains(stderr, fmt.Sprintf("token %d", granted)) {
		t.Fatalf("the same id after the release: exit %d %q, want grant_ended naming token %d", code, stderr, granted)
	}
}
