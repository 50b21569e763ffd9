package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestMillionLocks is the measurement on real processes (opt-in:
// TICKETD_BIG=1; about 3 GB of memory and a few minutes; the number of
// locks is TICKETD_BIG_LOCKS, default 1,000,000):
//
//	TICKETD_BIG=1 go test -run TestMillionLocks -v -timeout 30m ./cmd/ticketd/
//
// Three nodes, the third stopped. The first two take the locks (24h
// leases, keys "lock/%07d", owner "owner-%d") through NATS requests, then
// it reports: the leader's RSS per held lock, the time of the leader's
// last snapshot (built in the background), the time for the third node,
// started on an empty directory, to catch up (it can only do so from a
// snapshot: the log is compacted), the time of its restore, and the time
// of a leader restart (loading the table from its store).
func TestMillionLocks(t *testing.T) {
	if os.Getenv("TICKETD_BIG") == "" {
		t.Skip("set TICKETD_BIG=1 to load a million locks into real processes")
	}
	locks := 1_000_000
	if v := os.Getenv("TICKETD_BIG_LOCKS"); v != "" {
		var err error
		if locks, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
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
			"--max-locks", "1048576", "--snapshot-entries", fmt.Sprint(max(1000, locks/20)), "--compact-keep", "5000",
			"--log-format", "json",
		}
	}
	env := []string{"TICKETD_PEER_SECRET=process-test-secret-0123"}
	nodeArgs := [][]string{args(0), args(1), args(2)}
	procs := []*proc{startServeEnv(t, bin, env, nodeArgs[0]...), startServeEnv(t, bin, env, nodeArgs[1]...), nil}
	leader := func() int {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for i := 0; i < 2; i++ {
				if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" {
					return i
				}
			}
		}
		t.Fatal("no leader")
		return -1
	}
	lead := leader()
	rssEmpty := rss(t, procs[lead].cmd.Process.Pid)

	// Load.
	nc := testkit.Connect(t, urls[lead])
	start := time.Now()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 128; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(locks) {
					return
				}
				body := fmt.Sprintf(`{"key":"lock/%07d","owner":"owner-%d","lease_ms":86400000,"timeout_ms":60000}`, i, i%1000)
				m, err := nc.Request(protocol.SubjectAcquire, []byte(body), 60*time.Second)
				if err != nil || m.Header.Get("Nats-Service-Error-Code") != "" {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	load := time.Since(start)
	st, err := nodeStatus(urls[lead], lead+1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d locks in %v (%.0f/s), %d failed; leader status: applied %d, locks %d",
		locks, load.Round(time.Millisecond), float64(locks)/load.Seconds(), failed.Load(), st.AppliedIndex, st.Locks)
	if st.Locks < locks*99/100 {
		t.Fatalf("only %d locks held", st.Locks)
	}
	// Acquire+release cycles on one more key until the leader took a
	// snapshot of the full table (every locks/20 entries), then measure.
	testkit.Eventually(t, 5*time.Minute, "a snapshot of the full table on the leader", func() bool {
		if _, ok := lastLog(t, procs[lead], "snapshot taken", "locks", st.Locks); ok {
			return true
		}
		for i := 0; i < 100; i++ {
			m, err := nc.Request(protocol.SubjectAcquire, []byte(`{"key":"tick","lease_ms":60000}`), 10*time.Second)
			if err != nil {
				continue
			}
			var ar protocol.AcquireReply
			if protocol.ParseReply(m.Data, &ar) == nil {
				_, _ = nc.Request(protocol.SubjectRelease, []byte(fmt.Sprintf(`{"key":"tick","token":%d}`, ar.Token)), 10*time.Second)
			}
		}
		return false
	})
	rssFull := rss(t, procs[lead].cmd.Process.Pid)
	snapLine, _ := lastLog(t, procs[lead], "snapshot taken", "locks", st.Locks)
	t.Logf("leader RSS: %d MiB empty, %d MiB with %d locks: %.0f bytes per held lock", rssEmpty>>20, rssFull>>20, st.Locks,
		float64(rssFull-rssEmpty)/float64(st.Locks))
	t.Logf("leader snapshot (background): %s", snapLine)

	// A new follower catches up from the snapshot.
	start = time.Now()
	procs[2] = startServeEnv(t, bin, env, nodeArgs[2]...)
	testkit.Eventually(t, 10*time.Minute, "the new node catches up", func() bool {
		s3, err := nodeStatus(urls[2], 3)
		return err == nil && s3.AppliedIndex >= st.AppliedIndex && s3.Locks == st.Locks
	})
	catchUp := time.Since(start)
	restored, _ := lastLog(t, procs[2], "snapshot restored", "", 0)
	installed, _ := lastLog(t, procs[2], "installed snapshot", "", 0)
	t.Logf("new follower caught up from a snapshot of %d locks in %v (process start included)\n  restore: %s\n  install: %s",
		st.Locks, catchUp.Round(time.Millisecond), restored, installed)

	// Restart of the leader: the table loads from its store.
	procs[lead].kill9(t)
	start = time.Now()
	procs[lead] = startServeEnv(t, bin, env, nodeArgs[lead]...)
	testkit.Eventually(t, 5*time.Minute, "the restarted node loads its table", func() bool {
		_, ok := lastLog(t, procs[lead], "state loaded", "locks", st.Locks)
		return ok
	})
	loaded, _ := lastLog(t, procs[lead], "state loaded", "locks", st.Locks)
	t.Logf("restart after kill -9: %s (in %v of process time)", loaded, time.Since(start).Round(time.Millisecond))
}

// rss is the resident set size of a process, from /proc.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// lastLog returns the last JSON log line of p with msg (and, if field is
// set, that numeric field at least min).
func lastLog(t *testing.T, p *proc, msg, field string, min int) (string, bool) {
	t.Helper()
	var found string
	for _, line := range strings.Split(p.logString(), "\n") {
		if !strings.Contains(line, `"msg":"`+msg+`"`) {
			continue
		}
		if field != "" {
			m := regexp.MustCompile(fmt.Sprintf(`"%s":(\d+)`, field)).FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if v, _ := strconv.Atoi(m[1]); v < min {
				continue
			}
		}
		found = line
	}
	return found, found != ""
}
