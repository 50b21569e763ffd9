package raftstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// Errors returned by Node. Callers map them to client error codes.
var (
	// ErrNotLeader: this node is not the leader; the command was certainly
	// not proposed.
	ErrNotLeader = errors.New("raftstore: not the leader")
	// ErrIndeterminate: the command was handed to raft but its outcome is
	// unknown (leadership changed or the caller gave up before it applied).
	ErrIndeterminate = errors.New("raftstore: outcome unknown")
	// ErrStopped: the node is shutting down.
	ErrStopped = errors.New("raftstore: node stopped")
)

// Defaults of Config; tests shorten them.
const (
	TickIntervalDefault    = 100 * time.Millisecond
	ElectionTicksDefault   = 10
	HeartbeatTicksDefault  = 1
	SnapshotEntriesDefault = 10000
	CompactKeepDefault     = 5000
	MaxSizePerMsgDefault   = 1 << 20
	MaxInflightDefault     = 256
)

// Transport carries raft messages to peers. Send must not block.
type Transport interface {
	Send(msgs []raftpb.Message)
}

// Config configures a Node.
type Config struct {
	ID uint64
	// Peers are the initial voters, used only when the store is empty.
	Peers []uint64
	// Join starts an empty node with no membership of its own: it learns
	// the configuration from the leader that added it.
	Join  bool
	Store *Store
	// Transport may be nil for a single-voter node.
	Transport Transport
	// Observers hear every event; each event goes to them in list order.
	Observers []Observer
	// Logger receives the node's lifecycle events at Info and raft's own
	// chatter at Debug (logger.go); the caller's logger names the node.
	Logger          *slog.Logger
	TickInterval    time.Duration
	ElectionTicks   int
	HeartbeatTicks  int
	SnapshotEntries uint64
	CompactKeep     uint64
	// Metrics, if set, observes the time spent applying and persisting each
	// Ready's committed entries and how many there were.
	Metrics *Metrics
	// MaxEntryVersion, when not 0, is the newest entry format this node
	// applies: a committed entry of a newer one stops it as an entry it
	// cannot decode does (UndecodableEntryError). Only tests set it
	// (daemon.Options.MaxClusterVersion), to make a member act as an
	// older binary in an upgrade.
	MaxEntryVersion byte
}

func (c *Config) withDefaults() {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TickInterval <= 0 {
		c.TickInterval = TickIntervalDefault
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = ElectionTicksDefault
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = HeartbeatTicksDefault
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = SnapshotEntriesDefault
	}
	if c.CompactKeep == 0 {
		c.CompactKeep = CompactKeepDefault
	}
}

// Node is one raft member running ticketd's lock state machine.
type Node struct {
	cfg Config
	log *slog.Logger
	// rn is raft itself; only the node loop (loop.go) touches it once
	// Start has run, and other goroutines reach it through the queues
	// below or call.
	rn    *raft.RawNode
	propc chan queuedProposal
	recvc chan raftpb.Message
	callc chan func(*raft.RawNode)
	// heldCommit are the commit-only appends the leader held back, by
	// peer (commitonly.go). Loop only.
	heldCommit map[uint64]raftpb.Message
	// refuseProposals: a leadership transfer is about to start, and new
	// proposals get ErrNotLeader (handover.go). Loop only; cleared when
	// leadership is lost.
	refuseProposals bool
	// moving is held by the one leadership move that may run (handover.go).
	moving sync.Mutex
	// lastStatus is raft's status as the loop last saw it (Status).
	lastStatus atomic.Pointer[raft.Status]

	// machineMu guards machine. The Ready loop holds it for writing while
	// it applies and, unless the applied entries were already durable in
	// the log, until the batch is durable, so View never shows state that a
	// crash could lose (applyAndPersist).
	machineMu sync.RWMutex
	machine   *core.Machine
	// machineIndex is the index of the state machine holds, guarded by
	// machineMu: applied, or above it while the loop persists a Ready that
	// released machineMu before its write (ViewIndexed).
	machineIndex uint64

	// Written by the Ready loop, read by any goroutine.
	applied   atomic.Uint64 // applied and durable index
	leader    atomic.Uint64
	term      atomic.Uint64
	isLeader  atomic.Bool
	ready     atomic.Bool // leader of the current term and caught up
	confState atomic.Pointer[raftpb.ConfState]
	// summary is published by the Ready loop after each durable apply, so
	// status readers never take machineMu (which the loop may hold across
	// fsyncs) and never walk the table.
	summary atomic.Pointer[Summary]

	// Request ids (proposals, ReadIndex contexts) are reqBase plus a
	// sequence; the random base keeps them apart across restarts.
	reqBase uint64
	reqSeq  atomic.Uint64

	waiting waiting // callers blocked until the Ready loop answers them

	// reads batches ReadIndex callers into shared rounds (readindex.go);
	// readHooks are set only by tests.
	reads     readBatcher
	readHooks atomic.Pointer[readHooks]

	// snapIndex is the index of the latest snapshot, written by the
	// background snapshot (snapshot.go) and by the loop when it installs a
	// received one. snapping is set while a background snapshot runs;
	// snapForce (loop only) asks for the next one as soon as it ends.
	snapIndex atomic.Uint64
	snapping  atomic.Bool
	snapForce bool
	// snapRequested is set by RequestSnapshot.
	snapRequested atomic.Bool
	// bg tracks the background snapshot goroutine; bgErrc carries its
	// fatal error to the loop.
	bg     sync.WaitGroup
	bgErrc chan error

	// maxTickGap is the longest time between two ticks the loop handled
	// (nanoseconds): how late the loop ever was to tick and heartbeat.
	maxTickGap atomic.Int64

	stopc chan struct{}
	donec chan struct{}
	errc  chan error
	once  sync.Once

	startOnce sync.Once
	startMu   sync.Mutex // guards started
	started   bool       // the loop owns rn
}

// NewNode opens the raft node over an open Store. Call Start to run it.
func NewNode(cfg Config) (*Node, error) {
	cfg.withDefaults()
	if cfg.ID == 0 {
		return nil, fmt.Errorf("raftstore: node id must be non-zero")
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("raftstore: store is required")
	}
	loadStart := time.Now()
	applied, machine, cs, err := cfg.Store.LoadMachine()
	if err != nil {
		return nil, fmt.Errorf("raftstore: load state: %w", err)
	}
	cfg.Logger.Info("state loaded", "applied", applied, "locks", machine.Len(), "took", time.Since(loadStart))
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("raftstore: request id seed: %w", err)
	}
	n := &Node{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "raftstore"),
		machine: machine,
		reqBase: binary.LittleEndian.Uint64(seed[:]),
		waiting: waiting{
			proposals: make(map[uint64]chan proposalResult),
			stepped:   make(map[uint64]struct{}),
			reads:     make(map[string]chan readResult),
		},
		propc:      make(chan queuedProposal, maxQueuedProposals),
		recvc:      make(chan raftpb.Message, maxQueuedMessages),
		callc:      make(chan func(*raft.RawNode), maxQueuedCalls),
		heldCommit: make(map[uint64]raftpb.Message),
		stopc:      make(chan struct{}),
		donec:      make(chan struct{}),
		errc:       make(chan error, 1),
		bgErrc:     make(chan error, 1),
	}
	n.reads.init()
	n.applied.Store(applied)
	n.machineIndex = applied
	n.confState.Store(&cs)
	n.publishSummary(applied)
	// The index only: reading the snapshot itself (its data file, tens of
	// megabytes for a large table) here took half a second of a restart.
	n.snapIndex.Store(cfg.Store.SnapshotIndex())
	if err := n.startRaft(applied); err != nil {
		return nil, err
	}
	return n, nil
}

// startRaft creates the raft node: a fresh cluster member when the store is
// empty and the node does not join, otherwise a restart from the store.
func (n *Node) startRaft(applied uint64) error {
	cfg := n.cfg
	rc := &raft.Config{
		ID:                        cfg.ID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   cfg.Store,
		Applied:                   applied,
		MaxSizePerMsg:             MaxSizePerMsgDefault,
		MaxInflightMsgs:           MaxInflightDefault,
		MaxUncommittedEntriesSize: 64 << 20,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{l: n.log.With("subsystem", "raft")},
	}
	hs, _, err := cfg.Store.InitialState()
	if err != nil {
		return fmt.Errorf("raftstore: initial state: %w", err)
	}
	// The term raft restarts in: a restarted node's first Ready may name a
	// leader before any HardState change, and the term logged and
	// reported with it must not read 0.
	n.term.Store(hs.Term)
	last, err := cfg.Store.LastIndex()
	if err != nil {
		return fmt.Errorf("raftstore: last index: %w", err)
	}
	fresh := raft.IsEmptyHardState(hs) && last == 0 && !cfg.Join
	if fresh && len(cfg.Peers) == 0 {
		return fmt.Errorf("raftstore: empty store and no initial peers")
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return fmt.Errorf("raftstore: start raft: %w", err)
	}
	if fresh {
		// As raft.StartNode: the initial membership as the first entries.
		peers := make([]raft.Peer, len(cfg.Peers))
		for i, id := range cfg.Peers {
			peers[i] = raft.Peer{ID: id}
		}
		if err := rn.Bootstrap(peers); err != nil {
			return fmt.Errorf("raftstore: bootstrap raft: %w", err)
		}
	}
	n.rn = rn
	return nil
}

// Start runs the Ready loop. Observer calls begin only after Start, so an
// observer that needs the Node can be given it between NewNode and Start.
func (n *Node) Start() {
	n.startOnce.Do(func() {
		n.startMu.Lock()
		// A sole voter need not wait out an election timeout to lead.
		cs := n.ConfState()
		if len(cs.Voters) == 1 && cs.Voters[0] == n.cfg.ID || len(cs.Voters) == 0 && len(n.cfg.Peers) == 1 && n.cfg.Peers[0] == n.cfg.ID {
			if err := n.rn.Campaign(); err != nil {
				n.log.Warn("campaign as sole voter", "err", err)
			}
		} else {
			advanceElection(n.rn, n.cfg.ElectionTicks)
		}
		n.publishStatus()
		n.started = true
		n.startMu.Unlock()
		go n.run()
		n.bg.Add(1)
		go n.yieldLoop()
		n.bg.Add(1)
		go n.readLoop()
	})
}

// advanceElection fast-forwards a starting node's election clock to one
// tick short of the election timeout, as etcd does on boot
// (--initial-election-tick-advance). Raft draws each election timeout at
// random in [ElectionTicks, 2×ElectionTicks) ticks, so a node that would
// otherwise wait 1–2 s before its first campaign waits 1..ElectionTicks
// ticks: a cluster restarted after a power cut elects a leader about a
// second sooner, and the nodes still campaign at spread-out times.
//
// Timing never decides safety in raft; the only effect of an early
// campaign is a pre-vote round (PreVote is on). While a leader is alive
// its followers refuse it (CheckQuorum: they heard from the leader within
// the election timeout), so a node restarting into a healthy cluster
// cannot depose its leader this way; it learns of the leader from its
// next heartbeat.
func advanceElection(rn *raft.RawNode, electionTicks int) {
	for i := 1; i < electionTicks; i++ {
		rn.Tick()
	}
}

// Stop stops the loop and waits for it. It does not close the Store.
func (n *Node) Stop() {
	n.once.Do(func() {
		n.startOnce.Do(func() { close(n.donec) }) // never started: no loop to wait for
		close(n.stopc)
		<-n.donec
		n.bg.Wait() // a background snapshot sees stopc and ends
		// In-flight proposals may still have been committed by the others.
		n.waiting.failAll(fmt.Errorf("%w: %w", ErrIndeterminate, ErrStopped))
	})
}

// Done is closed when the loop has exited (after Stop or a fatal error).
func (n *Node) Done() <-chan struct{} { return n.donec }

// Err returns the fatal error that stopped the loop, if any.
func (n *Node) Err() error {
	select {
	case err := <-n.errc:
		n.errc <- err
		return err
	default:
		return nil
	}
}

// ID is this node's raft id.
func (n *Node) ID() uint64 { return n.cfg.ID }

// Leader is the raft id of the current leader (0 if unknown).
func (n *Node) Leader() uint64 { return n.leader.Load() }

// IsLeader reports whether this node is the leader.
func (n *Node) IsLeader() bool { return n.isLeader.Load() }

// LeaderReady reports whether this node is leader and has applied every
// entry of earlier terms.
func (n *Node) LeaderReady() bool { return n.ready.Load() }

// AppliedIndex is the highest applied (and durable) index. View may show
// a later state: read inside View, AppliedIndex may be below the state's
// index (ViewIndexed gives that one).
func (n *Node) AppliedIndex() uint64 { return n.applied.Load() }

// Term is the current raft term as last seen by the loop.
func (n *Node) Term() uint64 { return n.term.Load() }

// ConfState is the current membership.
func (n *Node) ConfState() raftpb.ConfState { return *n.confState.Load() }

// Status is raft's own status (progress of peers on a leader).
//
// It is raft's current status, or, when the loop cannot answer within
// statusWait (busy, stalled or stopped), the last one it published (at its
// latest tick or Status call).
func (n *Node) Status() raft.Status {
	ctx, cancel := context.WithTimeout(context.Background(), statusWait)
	defer cancel()
	stc := make(chan raft.Status, 1)
	if n.call(ctx, func(*raft.RawNode) { stc <- n.publishStatus() }) {
		return <-stc
	}
	if st := n.lastStatus.Load(); st != nil {
		return *st
	}
	return raft.Status{}
}

// Summary describes the applied state as of AppliedIndex: what status
// reports about it. It is computed once per applied Ready (O(1): the
// digest is incremental), never by the reader.
type Summary struct {
	Applied        uint64
	Locks          int
	LastToken      uint64
	ClusterVersion uint64
	Digest         [32]byte
}

// Summary returns the latest published summary of the applied state. It
// takes no lock and does no work proportional to the table.
func (n *Node) Summary() Summary { return *n.summary.Load() }

// ClusterVersion is the cluster version of the applied state.
func (n *Node) ClusterVersion() uint64 { return n.summary.Load().ClusterVersion }

// publishSummary publishes the summary of the machine at applied. The
// caller is the Ready loop (the machine's only writer), holds machineMu,
// or owns the machine exclusively.
func (n *Node) publishSummary(applied uint64) {
	m := n.machine
	n.summary.Store(&Summary{Applied: applied, Locks: m.Len(), LastToken: m.LastToken(),
		ClusterVersion: m.ClusterVersion(), Digest: m.Digest()})
}

// View runs f with read access to the applied state machine. f must not
// keep m.
func (n *Node) View(f func(m *core.Machine)) {
	n.machineMu.RLock()
	defer n.machineMu.RUnlock()
	f(n.machine)
}

// ViewIndexed is View with the log index of the state f reads. That index
// may be above AppliedIndex (read anywhere, inside View too): the loop
// shows the state of entries that were durable in its log before it writes
// their Ready's batch, and moves the applied index after that write
// (applyAndPersist). A reader that reports "the state at index N" (a
// backup) takes N from here.
func (n *Node) ViewIndexed(f func(m *core.Machine, index uint64)) {
	n.machineMu.RLock()
	defer n.machineMu.RUnlock()
	f(n.machine, n.machineIndex)
}

// Step delivers a message from a peer: it queues it for the loop, waiting
// while the queue is full.
func (n *Node) Step(ctx context.Context, m raftpb.Message) error {
	select {
	case n.recvc <- m:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("raftstore: step: %w", ctx.Err())
	case <-n.donec:
		return ErrStopped
	}
}

// ReportUnreachable tells raft a peer could not be reached.
func (n *Node) ReportUnreachable(id uint64) {
	n.post(func(rn *raft.RawNode) { rn.ReportUnreachable(id) })
}

// ReportSnapshot tells raft how sending a snapshot to a peer went.
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	n.post(func(rn *raft.RawNode) { rn.ReportSnapshot(id, status) })
}

// ProposeConfChange proposes a membership change. Like raft.Node's, it
// returns once raft has taken (or dropped) it, not when it applies.
func (n *Node) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeV2) error {
	errc := make(chan error, 1)
	if !n.call(ctx, func(rn *raft.RawNode) { errc <- rn.ProposeConfChange(cc) }) {
		// The change may still be taken by the loop after this returns.
		if ctx.Err() != nil {
			return fmt.Errorf("%w: propose conf change: %w", ErrIndeterminate, ctx.Err())
		}
		return fmt.Errorf("%w: %w", ErrIndeterminate, ErrStopped)
	}
	return <-errc
}

// observeTick records the time since the previous tick: a gap well above
// TickInterval means the loop was busy (or starved) and heartbeats were
// late by as much.
func (n *Node) observeTick(gap time.Duration) {
	if int64(gap) > n.maxTickGap.Load() {
		n.maxTickGap.Store(int64(gap))
	}
	n.cfg.Metrics.observeTickGap(gap)
}

// MaxTickGap is the longest time between two ticks the loop handled since
// it started (or since ResetMaxTickGap): how late heartbeats ever were.
func (n *Node) MaxTickGap() time.Duration { return time.Duration(n.maxTickGap.Load()) }

// ResetMaxTickGap starts MaxTickGap over.
func (n *Node) ResetMaxTickGap() { n.maxTickGap.Store(0) }

// fail ends the loop after a Ready could not be handled: the node can no
// longer lead or answer, so every waiting caller and observer hears that.
func (n *Node) fail(err error) {
	// The one line an operator needs: what stopped the node and where.
	n.log.Error("node stopped (fail-stop)", "err", err)
	n.errc <- err
	n.isLeader.Store(false)
	n.ready.Store(false)
	n.waiting.failAll(ErrIndeterminate)
	for _, o := range n.cfg.Observers {
		o.OnLeadershipLost()
	}
}

// UndecodableEntryError stops the node: a committed entry that this binary
// cannot decode (a newer entry version during a rolling upgrade, or
// damaged bytes). Skipping it would let replicas that can read it diverge
// from this one, so the node stops at that index instead, like etcd does
// on an entry it cannot apply.
type UndecodableEntryError struct {
	Index   uint64
	Term    uint64
	Version byte // the entry's first byte: its format version
	Err     error
}

func (e *UndecodableEntryError) Error() string {
	return fmt.Sprintf("raftstore: committed entry %d (term %d) has entry version %d, which this binary (entry versions up to %d, cluster version up to %d) cannot decode: %v; stopping so that replicas never diverge: run a binary that reads it",
		e.Index, e.Term, e.Version, core.MaxEntryVersion, core.MaxClusterVersion, e.Err)
}

func (e *UndecodableEntryError) Unwrap() error { return e.Err }
