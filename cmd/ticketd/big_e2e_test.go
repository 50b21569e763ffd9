package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/transports/protocol"
)

// TestMillionLocks is the issue-26 measurement on real processes (opt-in:
// TICKETD_BIG=1; about 3 GB of memory and a few minutes; the number of
// locks is TICKETD_BIG_LOCKS, default 1,000,000):
//
//	TICKETD_BIG=1 go test -run TestMillionLocks -v -timeout 30m ./cmd/ticketd/
//
// Three nodes, the third stopped. The first two take the locks (24h
// leases, keys "lock/%07d", owner "owner-%d") through NATS requests, then
// it reports, each line starting "FIGURE":
//
//  1. memory: the leader's RSS and live Go heap (after a forced GC) per
//     held lock;
//  2. snapshot: the leader's last background snapshot of the full table,
//     with the longest raft tick gap and the leader changes while it ran;
//  3. catch-up: the third node, started on an empty directory, catching
//     up (it can only do so from a snapshot: the log is compacted);
//  4. restart: kill -9 of the leader and its restart (its table loaded,
//     and it caught up again), and the time until the other two serve
//     again (an election timeout and the new leader's re-arm); then the
//     same for a follower, which needs no election;
//  5. power cut: kill -9 of all three and their restart, until a new lock
//     is granted.
//
// TICKETD_BIG_PROFILES=DIR also saves Go profiles there: the leader's heap
// after the load (heap.pb.gz), the new follower's after its catch-up
// (follower-heap.pb.gz), the new node's CPU during its catch-up
// (catchup-cpu.pb.gz, its first 3 s), and every process's log.
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
	profiles := os.Getenv("TICKETD_BIG_PROFILES")
	bin := binary(t)
	const n = 3
	addrs := newProcessAddrs(t, n)
	urls, metrics := addrs.urls, addrs.metrics
	args := func(i int) []string {
		return addrs.serveArgs(i, t.TempDir(),
			"--max-locks", "1048576", "--snapshot-entries", fmt.Sprint(max(1000, locks/20)), "--compact-keep", "5000",
			"--metrics-listen", metrics[i], "--pprof",
			"--log-format", "json",
		)
	}
	env := []string{"TICKETD_PEER_SECRET=process-test-secret-0123"}
	nodeArgs := [][]string{args(0), args(1), args(2)}
	var all []*proc // every process started, in order
	if profiles != "" {
		// Each process's log, for the timeline of every step.
		t.Cleanup(func() {
			for i, p := range all {
				_ = os.WriteFile(filepath.Join(profiles, fmt.Sprintf("process-%d.log", i+1)), []byte(p.logString()), 0o644)
			}
		})
	}
	startNode := func(i int) *proc {
		p := startServeEnv(t, bin, env, nodeArgs[i]...)
		all = append(all, p)
		return p
	}
	procs := []*proc{startNode(0), startNode(1), nil}
	leader := func(among ...int) int {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for _, i := range among {
				if st, err := nodeStatus(urls[i], i+1); err == nil && st.State == "StateLeader" {
					return i
				}
			}
		}
		t.Fatal("no leader")
		return -1
	}
	lead := leader(0, 1)
	rssEmpty := rss(t, procs[lead].cmd.Process.Pid)
	heapEmpty := liveHeap(t, metrics[lead], "")

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
	before := scrape(t, metrics[lead])
	testkit.Eventually(t, 5*time.Minute, "a snapshot of the full table on the leader", func() bool {
		if _, ok := lastLog(t, procs[lead], "snapshot taken", "locks", st.Locks); ok {
			return true
		}
		for i := 0; i < 100; i++ {
			bigCycle(nc, "tick")
		}
		return false
	})
	after := scrape(t, metrics[lead])
	heapFull := liveHeap(t, metrics[lead], filepath.Join(profiles, "heap.pb.gz"))
	rssFull := rss(t, procs[lead].cmd.Process.Pid)
	ms := scrape(t, metrics[lead])
	snapLine, _ := lastLog(t, procs[lead], "snapshot taken", "locks", st.Locks)
	t.Logf("FIGURE memory: leader RSS %d MiB empty, %d MiB with %d locks: %.0f B per held lock; live Go heap %d MiB -> %d MiB: %.0f B per held lock",
		rssEmpty>>20, rssFull>>20, st.Locks, float64(rssFull-rssEmpty)/float64(st.Locks),
		heapEmpty>>20, heapFull>>20, float64(heapFull-heapEmpty)/float64(st.Locks))
	t.Logf("  the leader's Go memory (MiB): heap in use %.0f, idle not yet returned to the OS %.0f, next GC at %.0f, stacks %.0f, other runtime %.0f",
		ms["go_memstats_heap_inuse_bytes"]/(1<<20), (ms["go_memstats_heap_idle_bytes"]-ms["go_memstats_heap_released_bytes"])/(1<<20),
		ms["go_memstats_next_gc_bytes"]/(1<<20), ms["go_memstats_stack_sys_bytes"]/(1<<20),
		(ms["go_memstats_sys_bytes"]-ms["go_memstats_heap_sys_bytes"]-ms["go_memstats_stack_sys_bytes"])/(1<<20))
	t.Logf("FIGURE snapshot (background, on the leader): %s; while the cycles ran: longest tick gap <= %v, %v leader changes",
		snapLine, tickGapBound(before, after), after["ticketd_raft_leader_changes_total"]-before["ticketd_raft_leader_changes_total"])

	// A new follower catches up from the snapshot.
	start = time.Now()
	procs[2] = startNode(2)
	if profiles != "" {
		go cpuProfile(t, metrics[2], 3, filepath.Join(profiles, "catchup-cpu.pb.gz"))
	}
	testkit.Eventually(t, 10*time.Minute, "the new node catches up", func() bool {
		s3, err := nodeStatus(urls[2], 3)
		return err == nil && s3.AppliedIndex >= st.AppliedIndex && s3.Locks == st.Locks
	})
	catchUp := time.Since(start)
	restored, _ := lastLog(t, procs[2], "snapshot restored", "locks", st.Locks)
	t.Logf("FIGURE catch-up: new follower caught up from a snapshot of %d locks in %v (process start included); restore: %s",
		st.Locks, catchUp.Round(time.Millisecond), restored)
	t.Logf("FIGURE memory of a follower (no lease timers): RSS %d MiB, live Go heap %d MiB with %d locks",
		rss(t, procs[2].cmd.Process.Pid)>>20, liveHeap(t, metrics[2], filepath.Join(profiles, "follower-heap.pb.gz"))>>20, st.Locks)

	// Restart of the leader: the table loads from its store; the other
	// two elect a leader and serve meanwhile.
	others := []int{}
	for i := 0; i < n; i++ {
		if i != lead {
			others = append(others, i)
		}
	}
	// restart kills node i with kill -9 and starts it again, runs
	// meanwhile (given the kill's time), and returns the node's "state
	// loaded" line and how long after the kill it served status with the
	// applied index of want (a status read before the kill) and at least
	// minLocks locks.
	restart := func(i int, want protocol.StatusReply, minLocks int, meanwhile func(killed time.Time)) (string, time.Duration) {
		procs[i].kill9(t)
		killed := time.Now()
		procs[i] = startNode(i)
		meanwhile(killed)
		testkit.Eventually(t, 5*time.Minute, fmt.Sprintf("the restarted node %d catches up", i+1), func() bool {
			s, err := nodeStatus(urls[i], i+1)
			return err == nil && s.AppliedIndex >= want.AppliedIndex && s.Locks >= minLocks
		})
		rejoined := time.Since(killed)
		loaded, _ := lastLog(t, procs[i], "state loaded", "locks", want.Locks-1)
		return loaded, rejoined
	}
	st, err = nodeStatus(urls[lead], lead+1)
	if err != nil {
		t.Fatal(err)
	}
	var failover time.Duration
	loaded, rejoined := restart(lead, st, st.Locks-1, func(killed time.Time) {
		ncOther := testkit.Connect(t, urls[others[0]])
		testkit.Eventually(t, 5*time.Minute, "the other two grant a lock", func() bool { return bigCycle(ncOther, "failover") })
		failover = time.Since(killed)
	})
	t.Logf("FIGURE restart after kill -9 of the leader: %s; the node serves status caught up %v after the kill, the other two granted a lock after %v",
		loaded, rejoined.Round(time.Millisecond), failover.Round(time.Millisecond))

	// Restart of a follower: the same load, but the cluster keeps its
	// leader, so this is the node's own restart without an election.
	lead = leader(0, 1, 2)
	if st, err = nodeStatus(urls[lead], lead+1); err != nil {
		t.Fatal(err)
	}
	loaded, rejoined = restart((lead+1)%n, st, st.Locks, func(time.Time) {})
	t.Logf("FIGURE restart after kill -9 of a follower: %s; the node serves status caught up %v after the kill",
		loaded, rejoined.Round(time.Millisecond))

	// Power cut: all three die and come back.
	for i := range procs {
		procs[i].kill9(t)
	}
	start = time.Now()
	for i := range procs {
		procs[i] = startNode(i)
	}
	var ncAll *nats.Conn
	testkit.Eventually(t, 5*time.Minute, "the restarted cluster grants a lock", func() bool {
		if ncAll == nil {
			if ncAll, err = nats.Connect(strings.Join(urls, ","), nats.Timeout(time.Second)); err != nil {
				ncAll = nil
				return false
			}
			t.Cleanup(ncAll.Close)
		}
		return bigCycle(ncAll, "powercut")
	})
	served := time.Since(start)
	var loads []string
	for i := range procs {
		l, _ := lastLog(t, procs[i], "state loaded", "locks", st.Locks-1)
		loads = append(loads, l)
	}
	t.Logf("FIGURE power cut: kill -9 of all three, restart, first lock granted after %v\n  %s",
		served.Round(time.Millisecond), strings.Join(loads, "\n  "))
}

// bigCycle takes and releases key once; it reports whether the acquire was
// granted.
func bigCycle(nc *nats.Conn, key string) bool {
	m, err := nc.Request(protocol.SubjectAcquire, []byte(`{"key":"`+key+`","lease_ms":60000}`), 10*time.Second)
	if err != nil {
		return false
	}
	var ar protocol.AcquireReply
	if protocol.ParseReply(m.Data, &ar) != nil {
		return false
	}
	_, _ = nc.Request(protocol.SubjectRelease, []byte(fmt.Sprintf(`{"key":"%s","token":%d}`, key, ar.Token)), 10*time.Second)
	return true
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

// httpGet reads a URL of a node's metrics listener.
func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test on loopback, bounded by the client default
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

// liveHeap forces a GC in the node (through its heap profile, saved to
// save unless that is empty or names no directory) and returns the Go heap
// in use after it.
func liveHeap(t *testing.T, addr, save string) int64 {
	t.Helper()
	prof := httpGet(t, "http://"+addr+"/debug/pprof/heap?gc=1")
	if save != "" && filepath.Dir(save) != "." {
		if err := os.WriteFile(save, prof, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return int64(scrape(t, addr)["go_memstats_heap_alloc_bytes"])
}

// cpuProfile saves the node's CPU profile over the next secs seconds,
// once its metrics listener answers.
func cpuProfile(t *testing.T, addr string, secs int, save string) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)) //nolint:noctx
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			_ = os.WriteFile(save, b, 0o644)
		}
		return
	}
}

// scrape reads a node's metrics: every sample without labels, and the
// buckets of ticketd_raft_tick_gap_seconds under their "le" bound.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	re := regexp.MustCompile(`^([a-z_]+)(\{le="([^"]+)"\})? (\S+)$`)
	for _, line := range strings.Split(string(httpGet(t, "http://"+addr+"/metrics")), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			continue
		}
		if m[2] != "" {
			out[m[1]+"@"+m[3]] = v
		} else {
			out[m[1]] = v
		}
	}
	return out
}

// tickGapBound is the upper bound of the highest tick-gap bucket that
// grew between two scrapes.
func tickGapBound(before, after map[string]float64) time.Duration {
	bound := 0.0
	for k, v := range after {
		le, ok := strings.CutPrefix(k, "ticketd_raft_tick_gap_seconds_bucket@")
		if !ok || le == "+Inf" {
			continue
		}
		below, _ := strconv.ParseFloat(le, 64)
		// A bucket counts every gap up to its bound: the smallest bound
		// whose count grew as much as the total holds the longest gap.
		if v-before[k] == after["ticketd_raft_tick_gap_seconds_count"]-before["ticketd_raft_tick_gap_seconds_count"] {
			if bound == 0 || below < bound {
				bound = below
			}
		}
	}
	if bound == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(bound * float64(time.Second))
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
