package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// nodeStatus asks one node, by id, for its own view.
func nodeStatus(url string, id int) (protocol.StatusReply, error) {
	var st protocol.StatusReply
	nc, err := nats.Connect(url, nats.Timeout(time.Second))
	if err != nil {
		return st, err
	}
	defer nc.Close()
	m, err := nc.Request(protocol.NodeStatusSubject(uint64(id)), []byte("{}"), time.Second)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(m.Data, &st)
}

// TestThreeProcessFailover runs three real `ticketd serve` processes:
// locks taken through a follower survive kill -9 of the leader with their
// tokens, clients continue within two election timeouts, and the killed
// node rejoins with an identical lock table.
func TestThreeProcessFailover(t *testing.T) {
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
	args := func(i int) []string {
		return []string{
			"--id", fmt.Sprint(i + 1), "--data", t.TempDir(),
			"--nats-listen", strings.TrimPrefix(urls[i], "nats://"),
			"--nats-cluster-listen", routes[i], "--nats-routes", strings.Join(routes, ","),
			"--peer-listen", peers[i], "--initial-cluster", strings.Join(members, ","), "--initial-cluster-state", "new",
			"--tick-ms", "50", "--election-ticks", "10",
		}
	}
	const electionTimeout = 500 * time.Millisecond
	procs := make([]*proc, n)
	nodeArgs := make([][]string, n)
	for i := 0; i < n; i++ {
		nodeArgs[i] = args(i)
		p := startServeEnv(t, bin, []string{"TICKETD_PEER_SECRET=process-test-secret-0123"}, nodeArgs[i]...)
		procs[i] = p
	}
	leaderOf := func() int {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for i := range urls {
				if procs[i] == nil {
					continue
				}
				if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" {
					return i
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("no leader among the processes")
		return -1
	}
	lead := leaderOf()
	fol := (lead + 1) % n
	tokens := map[string]uint64{}
	for i := 0; i < 3; i++ {
		key := fmt.Sprintf("p/%d", i)
		v, stderr, code := cli(t, bin, "lock", "acquire", key, "--lease", "1m", "--nats", urls[fol])
		if code != 0 {
			t.Fatalf("acquire via follower: %s", stderr)
		}
		tokens[key] = token(t, v)
	}
	procs[lead].kill9(t)
	procs[lead] = nil
	killedAt := time.Now()
	v, stderr, code := cli(t, bin, "lock", "acquire", "after", "--lease", "1m", "--nats", urls[fol], "--timeout", "20s")
	if code != 0 {
		t.Fatalf("acquire after kill -9: %s", stderr)
	}
	took := time.Since(killedAt)
	t.Logf("a client was served %v after kill -9 of the leader (election timeout %v)", took, electionTimeout)
	// Randomised timeouts reach 2× the base; allow the CLI's process start.
	if took > 2*2*electionTimeout+2*time.Second {
		t.Fatalf("clients resumed only after %v", took)
	}
	for key, tok := range tokens {
		if token(t, v) <= tok {
			t.Fatalf("token after failover %d not above %d", token(t, v), tok)
		}
		g, _, _ := cli(t, bin, "lock", "get", key, "--nats", urls[fol])
		if g["held"] != true || token(t, g) != tok {
			t.Fatalf("%s after kill -9: %v, want token %d", key, g, tok)
		}
	}
	procs[lead] = startServeEnv(t, bin, []string{"TICKETD_PEER_SECRET=process-test-secret-0123"}, nodeArgs[lead]...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var digests []string
		for i := range urls {
			st, err := nodeStatus(urls[i], i+1)
			if err == nil {
				digests = append(digests, fmt.Sprintf("%d/%s", st.AppliedIndex, st.Digest))
			}
		}
		if len(digests) == n && digests[0] == digests[1] && digests[1] == digests[2] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tables never converged: %v", digests)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A planned stop: SIGTERM makes the leader hand leadership over before
	// it exits, so another node leads well inside an election timeout.
	lead = leaderOf()
	stoppedAt := time.Now()
	if err := procs[lead].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next := -1
	testkit.Eventually(t, 10*time.Second, "another leader after SIGTERM of the leader", func() bool {
		for i := range urls {
			if i == lead {
				continue
			}
			if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" {
				next = i
				return true
			}
		}
		return false
	})
	took = time.Since(stoppedAt)
	if err := procs[lead].cmd.Wait(); err != nil {
		t.Fatalf("the old leader after SIGTERM: %v", err)
	}
	if !strings.Contains(procs[lead].logString(), "leadership handed over") {
		t.Fatalf("node %d stopped without handing leadership over", lead+1)
	}
	procs[lead] = nil
	t.Logf("node %d led %v after SIGTERM of leader %d (election timeout %v)", next+1, took, lead+1, electionTimeout)
	if took >= electionTimeout {
		t.Fatalf("a new leader only after %v: no faster than an election", took)
	}
}
