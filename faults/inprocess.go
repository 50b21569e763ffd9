package faults

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketd/ticketd/control"
	"github.com/ticketd/ticketd/core"
	"github.com/ticketd/ticketd/internal/testkit"
	"github.com/ticketd/ticketd/internal/testkit/testcluster"
	"github.com/ticketd/ticketd/sdk"

	"github.com/ticketd/ticketd/daemon"
)

const (
	modeInProcess = "inprocess"
	modeProcess   = "process"
)

// inprocCluster runs daemon.Start nodes in this process. Crashes are
// Close and restart on the same data (a clean stop, not a power cut: the
// process-level driver does kill -9); partitions are peer.Transport
// filters; every node's lease clock is a jumpClock given as Options.Now.
//
// In control mode (startInProcessControl) the cluster is formed through
// the control plane (bootstrap of node 1, then joins with one-time
// credentials), raft ids are issued by it, and the wipe-node fault is
// available: raft ids then differ from slot+1, so the peer filters map
// ids to slots through ids.
type inprocCluster struct {
	// kit starts and stops the nodes and holds their configs.
	kit     *testcluster.Cluster
	control bool
	clocks  []*jumpClock       // node i's lease clock, for the life of the cluster
	disks   []*testkit.FaultFS // node i's filesystem, for the life of the cluster (disk.go)

	idMu sync.RWMutex
	ids  []uint64 // raft id of each slot's current node

	// mu guards what the harness adds to the kit's nodes.
	mu      sync.Mutex
	closing []bool // node i is being stopped on purpose
	filter  func(from, to uint64) bool
	exits   []string
	wipes   int
}

func startInProcess(t testing.TB, n int, logger *slog.Logger, tickMS, electionTicks int) (*inprocCluster, error) {
	return startInProcessMode(t, n, logger, tickMS, electionTicks, false)
}

// Control-plane credentials of the in-process cluster in control mode.
const (
	faultsAdminCredential = "faults-harness-admin-credential-0123"
	faultsBootCredential  = "faults-harness-bootstrap-credential-0123"
)

// startInProcessControl forms the cluster through the control plane.
func startInProcessControl(t testing.TB, n int, logger *slog.Logger, tickMS, electionTicks int) (*inprocCluster, error) {
	return startInProcessMode(t, n, logger, tickMS, electionTicks, true)
}

func startInProcessMode(t testing.TB, n int, logger *slog.Logger, tickMS, electionTicks int, controlMode bool) (*inprocCluster, error) {
	var controls []string
	if controlMode {
		controls = testkit.FreeAddrs(t, n)
	}
	c := &inprocCluster{
		control: controlMode,
		ids:     make([]uint64, n),
		closing: make([]bool, n),
		clocks:  make([]*jumpClock, n),
		disks:   make([]*testkit.FaultFS, n),
	}
	for i := 0; i < n; i++ {
		c.clocks[i] = &jumpClock{}
		c.disks[i] = testkit.NewFaultFS()
		c.ids[i] = uint64(i + 1)
	}
	c.kit = testcluster.New(t, n, testcluster.Unstarted(), testcluster.WithTicks(tickMS, electionTicks),
		testcluster.WithConfig(func(i int, cfg *daemon.Config) {
			// Small snapshot intervals: a node that was down catches up
			// from a snapshot, not only from the log.
			cfg.SnapshotEntries = 300
			cfg.CompactKeep = 50
			cfg.LogLevel = "warn"
			if controlMode {
				cfg.InitialCluster = ""
				cfg.ControlListen = controls[i]
				cfg.ControlCredential = faultsAdminCredential
				if i == 0 {
					cfg.BootstrapCredential = faultsBootCredential
				}
			}
		}),
		testcluster.WithOptions(func(i int, o *daemon.Options) { o.Logger, o.Now, o.FS = logger, c.clocks[i].Now, c.disks[i] }))
	if controlMode {
		if err := c.formByControl(); err != nil {
			c.close()
			return nil, err
		}
		return c, nil
	}
	for i := 0; i < n; i++ {
		if err := c.restart(i); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func (c *inprocCluster) size() int                      { return c.kit.Size() }
func (c *inprocCluster) electionTimeout() time.Duration { return c.kit.ElectionTimeout() }

func (c *inprocCluster) clientURLs() []string {
	out := make([]string, c.size())
	for i := range out {
		out[i] = c.kit.ClientURL(i)
	}
	return out
}

// slot maps a raft id to the slot of the node that has it now (-1 for a
// retired or unknown id).
func (c *inprocCluster) slot(id uint64) int {
	c.idMu.RLock()
	defer c.idMu.RUnlock()
	for i, x := range c.ids {
		if x == id {
			return i
		}
	}
	return -1
}

func (c *inprocCluster) raftIDs() []uint64 {
	c.idMu.RLock()
	defer c.idMu.RUnlock()
	out := append([]uint64(nil), c.ids...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// controlURLs are the control listeners of the running nodes.
func (c *inprocCluster) controlURLs() []string {
	var out []string
	for _, d := range c.kit.Nodes() {
		if d != nil && d.ControlAddr() != "" {
			out = append(out, "http://"+d.ControlAddr())
		}
	}
	return out
}

func (c *inprocCluster) callControl(within time.Duration, path string, req control.Request) (control.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return control.Call(ctx, c.controlURLs(), path, faultsAdminCredential, req)
}

// formByControl starts node 1 with a bootstrap credential, bootstraps it,
// then starts every other node with a freshly minted join credential.
func (c *inprocCluster) formByControl() error {
	if err := c.restart(0); err != nil {
		return err
	}
	if !waitLeader(c, 20*time.Second) {
		return errors.New("control mode: node 1 did not lead")
	}
	if _, err := c.callControl(20*time.Second, "/v1/bootstrap", control.Request{Credential: faultsBootCredential}); err != nil {
		return fmt.Errorf("control mode: bootstrap: %w", err)
	}
	for i := 1; i < c.size(); i++ {
		mint, err := c.callControl(20*time.Second, "/v1/join-credentials", control.Request{})
		if err != nil {
			return fmt.Errorf("control mode: mint join credential: %w", err)
		}
		join := strings.Join(c.controlURLs(), ",")
		c.kit.UpdateConfig(i, func(cfg *daemon.Config) { cfg.Join, cfg.JoinCredential = join, mint.Credential })
		if err := c.restart(i); err != nil {
			return fmt.Errorf("control mode: join: %w", err)
		}
	}
	c.refreshJoin()
	return c.waitVoters(30 * time.Second)
}

// refreshJoin points every joined node's Join at the control
// listeners of all slots (as an operator would update the config), so a
// restarted node's identity check reaches the leader at once.
func (c *inprocCluster) refreshJoin() {
	var urls []string
	for i := 0; i < c.size(); i++ {
		urls = append(urls, "http://"+c.kit.Config(i).ControlListen)
	}
	for i := 0; i < c.size(); i++ {
		c.kit.UpdateConfig(i, func(cfg *daemon.Config) {
			if cfg.Join != "" {
				cfg.Join = strings.Join(urls, ",")
			}
		})
	}
}

// waitVoters waits until the leader's raft membership is exactly the
// current nodes' ids as voters, with no learner and no joint config.
func (c *inprocCluster) waitVoters(within time.Duration) error {
	want := fmt.Sprint(c.raftIDs())
	var last string
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if l := c.leader(); l >= 0 {
			if d := c.node(l); d != nil {
				cs := d.Node().ConfState()
				last = fmt.Sprintf("voters %v learners %v outgoing %v", cs.Voters, cs.Learners, cs.VotersOutgoing)
				if fmt.Sprint(cs.Voters) == want && len(cs.Learners) == 0 && len(cs.VotersOutgoing) == 0 {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("raft membership is not voters %s within %v (last: %s)", want, within, last)
}

// readIncarnation reads the identity file daemon keeps in a data dir.
func readIncarnation(dataDir string) (uint64, uint64, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "identity.json"))
	if err != nil {
		return 0, 0, err
	}
	var id struct {
		NodeID      uint64 `json:"node_id"`
		Incarnation uint64 `json:"incarnation"`
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return 0, 0, err
	}
	return id.NodeID, id.Incarnation, nil
}

// wipe closes node i, deletes its data directory, starts a fresh node in
// its slot (new data dir, new peer and control addresses; the same NATS
// addresses, so the clients' URL lists stay valid) that joins with
// Replace=<old id> and so gets a new identity, completes the replacement
// once the learner caught up, and checks the old identity is refused.
// It returns a description, the problems found (violations) and an
// operational error.
func (c *inprocCluster) wipe(i int) (string, []string, error) {
	if !c.control {
		return "", nil, errUnsupported
	}
	old := c.kit.Config(i)
	oldID, oldInc, err := readIncarnation(old.Data)
	if err != nil {
		return "", nil, fmt.Errorf("read identity of node %d: %w", i+1, err)
	}
	if err := c.crash(i); err != nil {
		return "", nil, err
	}
	if err := os.RemoveAll(old.Data); err != nil {
		return "", nil, fmt.Errorf("wipe %s: %w", old.Data, err)
	}
	// The nemesis goroutine cannot fail the test: errors, not testing.TB.
	peerAddr, err1 := testkit.PickFreeAddr()
	ctlAddr, err2 := testkit.PickFreeAddr()
	if err := errors.Join(err1, err2); err != nil {
		return "", nil, err
	}
	c.mu.Lock()
	c.wipes++
	wipes := c.wipes
	c.mu.Unlock()
	cfg := old
	cfg.Data = filepath.Join(c.kit.Dir(), fmt.Sprintf("node%d-wipe%d", i+1, wipes))
	cfg.PeerListen = peerAddr
	cfg.ControlListen = ctlAddr
	cfg.BootstrapCredential = ""
	cfg.JoinCredential = ""
	cfg.Join = strings.Join(c.controlURLs(), ",")
	cfg.Replace = oldID
	// Later restarts of the slot start the new node on its own data.
	c.kit.UpdateConfig(i, func(slot *daemon.Config) { *slot = cfg })
	// restart also records the slot's new raft id.
	if err := c.restart(i); err != nil {
		return "", nil, fmt.Errorf("start the replacement of node id %d: %w", oldID, err)
	}
	c.refreshJoin()
	newID, newInc, err := readIncarnation(cfg.Data)
	if err != nil {
		return "", nil, fmt.Errorf("read the replacement's identity: %w", err)
	}
	detail := fmt.Sprintf("id %d/%d wiped, replaced by id %d/%d (peer %s)", oldID, oldInc, newID, newInc, peerAddr)
	// Completion waits for the learner to catch up: poll.
	var problems []string
	deadline := time.Now().Add(30 * time.Second)
	var last error
	done := false
	for !done && time.Now().Before(deadline) {
		_, last = c.callControl(5*time.Second, "/v1/replacements/complete", control.Request{OldNodeID: oldID, NodeID: newID, Incarnation: newInc})
		if last == nil {
			done = true
			break
		}
		// An indeterminate answer may have completed it: a retry is then
		// refused; the replicated state tells.
		if c.identityState(oldID, oldInc) != nil && c.identityState(newID, newInc) == nil && c.isVoterMember(newID) {
			done = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !done {
		problems = append(problems, fmt.Sprintf("replacement of id %d by id %d did not complete within 30s: %v", oldID, newID, last))
		return detail, problems, nil
	}
	if err := c.waitVoters(30 * time.Second); err != nil {
		problems = append(problems, "after the replacement of id "+fmt.Sprint(oldID)+": "+err.Error())
	}
	if err := c.identityState(oldID, oldInc); err == nil {
		problems = append(problems, fmt.Sprintf("the leader's state still accepts the wiped identity %d/%d", oldID, oldInc))
	} else {
		detail += "; old identity refused (" + err.Error() + ")"
	}
	if err := c.identityState(newID, newInc); err != nil {
		problems = append(problems, fmt.Sprintf("the leader's state refuses the replacement's identity %d/%d: %v", newID, newInc, err))
	}
	return detail, problems, nil
}

// identityState is CheckIdentity on the leader's state machine.
func (c *inprocCluster) identityState(id, inc uint64) error {
	l := c.leader()
	if l < 0 {
		return nil // unknown: callers treat nil as "not refused"
	}
	d := c.node(l)
	if d == nil {
		return nil
	}
	var err error
	d.Node().View(func(m *core.Machine) { err = m.CheckIdentity(id, inc) })
	return err
}

func (c *inprocCluster) isVoterMember(id uint64) bool {
	rep, err := c.callControl(5*time.Second, "/v1/members", control.Request{})
	if err != nil {
		return false
	}
	for _, m := range rep.Members {
		if m.NodeID == id {
			return m.Role == "voter"
		}
	}
	return false
}

func (c *inprocCluster) node(i int) *daemon.Daemon { return c.kit.Node(i) }

func (c *inprocCluster) running(i int) bool { return c.node(i) != nil }

func (c *inprocCluster) leader() int {
	best, term := -1, uint64(0)
	for i, d := range c.kit.Nodes() {
		if d == nil || !d.Locks().IsLeader() {
			continue
		}
		if t := d.Node().Term(); best < 0 || t > term {
			best, term = i, t
		}
	}
	return best
}

func (c *inprocCluster) crash(i int) error {
	c.mu.Lock()
	c.closing[i] = true
	c.mu.Unlock()
	return c.kit.Stop(i)
}

// stop is the planned stop, Daemon.Shutdown: a leader hands leadership
// over first (a hand-over that cannot happen, under a partition, only
// logs), then the slot is stopped as by crash (Close again is a no-op).
func (c *inprocCluster) stop(i int) error {
	c.mu.Lock()
	c.closing[i] = true // before the loop stops: an expected exit
	c.mu.Unlock()
	if d := c.kit.Node(i); d != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*c.electionTimeout())
		d.Shutdown(ctx)
		cancel()
	}
	return c.crash(i)
}

func (c *inprocCluster) restart(i int) error {
	if c.running(i) {
		return nil
	}
	if err := c.kit.Start(i); err != nil {
		return err
	}
	d := c.kit.Node(i)
	// In control mode the raft id is issued by the cluster.
	if id := d.Node().ID(); id != 0 {
		c.idMu.Lock()
		c.ids[i] = id
		c.idMu.Unlock()
	}
	c.mu.Lock()
	c.closing[i] = false
	f := c.filter
	c.mu.Unlock()
	if f != nil {
		d.Peers().SetFilter(f)
	}
	go func() {
		<-d.Done()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.kit.Node(i) == d && !c.closing[i] {
			c.exits = append(c.exits, fmt.Sprintf("node %d: raft loop stopped: %v", i+1, d.Node().Err()))
		}
	}()
	return nil
}

func (c *inprocCluster) setLinks(allow func(from, to int) bool, _ linkMode) {
	var f func(from, to uint64) bool
	if allow != nil {
		f = func(from, to uint64) bool { return allow(c.slot(from), c.slot(to)) }
	}
	c.mu.Lock()
	c.filter = f
	c.mu.Unlock()
	for _, d := range c.kit.Nodes() {
		if d != nil {
			d.Peers().SetFilter(f)
		}
	}
}

func (c *inprocCluster) pause(int) error  { return errUnsupported }
func (c *inprocCluster) resume(int) error { return nil }

func (c *inprocCluster) blackholes() bool { return false }

func (c *inprocCluster) jump(i int, d time.Duration) error {
	c.clocks[i].Jump(d)
	return nil
}

func (c *inprocCluster) status(ctx context.Context, i int) (sdk.Status, error) {
	d := c.node(i)
	if d == nil {
		return sdk.Status{}, fmt.Errorf("node %d is down", i+1)
	}
	return nodeStatus(d), nil
}

// nodeStatus reads what the harness compares across replicas straight
// from an in-process node.
func nodeStatus(d *daemon.Daemon) sdk.Status {
	n := d.Node()
	rs := n.Status()
	st := sdk.Status{ID: n.ID(), Leader: rs.Lead, Term: rs.Term, State: rs.RaftState.String(), CommitIndex: rs.Commit}
	n.ViewIndexed(func(m *core.Machine, index uint64) {
		// The state's own index: AppliedIndex may lag it while a Ready's
		// write is in flight.
		st.AppliedIndex, st.Locks, st.LastToken = index, m.Len(), m.LastToken()
		sum := m.Digest()
		st.Digest = hex.EncodeToString(sum[:])
	})
	return st
}

func (c *inprocCluster) unexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.exits...)
}

func (c *inprocCluster) close() {
	c.mu.Lock()
	for i := range c.closing {
		c.closing[i] = true
	}
	c.mu.Unlock()
	c.kit.Close()
}
