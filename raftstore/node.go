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
	Observers       []Observer
	Logger          *slog.Logger
	TickInterval    time.Duration
	ElectionTicks   int
	HeartbeatTicks  int
	SnapshotEntries uint64
	CompactKeep     uint64
	// Metrics, if set, observes the time spent applying and persisting each
	// Ready's committed entries and how many there were.
	Metrics *Metrics
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

type proposalResult struct {
	applied Applied
	err     error
}

// Node is one raft member running ticketd's lock state machine.
type Node struct {
	cfg  Config
	log  *slog.Logger
	raft raft.Node

	// mu guards machine; the Ready loop holds it for writing from apply
	// until the batch is durable, so readers never see undurable state.
	mu      sync.RWMutex
	machine *core.Machine

	applied   atomic.Uint64
	leader    atomic.Uint64
	term      atomic.Uint64
	isLeader  atomic.Bool
	ready     atomic.Bool // leader of the current term and caught up
	confState atomic.Pointer[raftpb.ConfState]

	reqBase uint64
	reqSeq  atomic.Uint64

	pmu       sync.Mutex
	proposals map[uint64]chan proposalResult
	reads     map[string]chan readResult
	appliedW  []appliedWaiter

	snapIndex uint64

	stopc chan struct{}
	donec chan struct{}
	errc  chan error
	once  sync.Once

	startOnce sync.Once
}

type readResult struct {
	index uint64
	err   error
}

type appliedWaiter struct {
	index uint64
	ch    chan struct{}
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
	applied, machine, cs, err := cfg.Store.LoadMachine()
	if err != nil {
		return nil, fmt.Errorf("raftstore: load state: %w", err)
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("raftstore: request id seed: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger.With("node", cfg.ID),
		machine:   machine,
		reqBase:   binary.LittleEndian.Uint64(seed[:]),
		proposals: make(map[uint64]chan proposalResult),
		reads:     make(map[string]chan readResult),
		stopc:     make(chan struct{}),
		donec:     make(chan struct{}),
		errc:      make(chan error, 1),
	}
	n.applied.Store(applied)
	n.confState.Store(&cs)
	snap, err := cfg.Store.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftstore: read snapshot: %w", err)
	}
	n.snapIndex = snap.Metadata.Index

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
		Logger:                    raftLogger{l: n.log.With("component", "raft")},
	}
	hs, _, err := cfg.Store.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftstore: initial state: %w", err)
	}
	last, err := cfg.Store.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raftstore: last index: %w", err)
	}
	if raft.IsEmptyHardState(hs) && last == 0 && !cfg.Join {
		if len(cfg.Peers) == 0 {
			return nil, fmt.Errorf("raftstore: empty store and no initial peers")
		}
		peers := make([]raft.Peer, len(cfg.Peers))
		for i, id := range cfg.Peers {
			peers[i] = raft.Peer{ID: id}
		}
		n.raft = raft.StartNode(rc, peers)
	} else {
		n.raft = raft.RestartNode(rc)
	}
	return n, nil
}

// Start runs the Ready loop. Observer calls begin only after Start, so an
// observer that needs the Node can be given it between NewNode and Start.
func (n *Node) Start() {
	n.startOnce.Do(func() {
		go n.run()
		// A sole voter need not wait out an election timeout to lead.
		cs := n.ConfState()
		if len(cs.Voters) == 1 && cs.Voters[0] == n.cfg.ID || len(cs.Voters) == 0 && len(n.cfg.Peers) == 1 && n.cfg.Peers[0] == n.cfg.ID {
			if err := n.raft.Campaign(context.Background()); err != nil {
				n.log.Warn("campaign as sole voter", "err", err)
			}
		}
	})
}

// Stop stops the loop and waits for it. It does not close the Store.
func (n *Node) Stop() {
	n.once.Do(func() {
		n.startOnce.Do(func() { close(n.donec) }) // never started: no loop to wait for
		close(n.stopc)
		<-n.donec
		n.raft.Stop()
		// In-flight proposals may still have been committed by the others.
		n.failAll(fmt.Errorf("%w: %w", ErrIndeterminate, ErrStopped))
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

// AppliedIndex is the highest applied (and durable) index.
func (n *Node) AppliedIndex() uint64 { return n.applied.Load() }

// Term is the current raft term as last seen by the loop.
func (n *Node) Term() uint64 { return n.term.Load() }

// ConfState is the current membership.
func (n *Node) ConfState() raftpb.ConfState { return *n.confState.Load() }

// Status is raft's own status (progress of peers on a leader).
func (n *Node) Status() raft.Status { return n.raft.Status() }

// View runs f with read access to the applied state machine. f must not
// keep m.
func (n *Node) View(f func(m *core.Machine)) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	f(n.machine)
}

// Step delivers a message from a peer.
func (n *Node) Step(ctx context.Context, m raftpb.Message) error {
	return n.raft.Step(ctx, m)
}

// ReportUnreachable tells raft a peer could not be reached.
func (n *Node) ReportUnreachable(id uint64) { n.raft.ReportUnreachable(id) }

// ReportSnapshot tells raft how sending a snapshot to a peer went.
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	n.raft.ReportSnapshot(id, status)
}

// ProposeConfChange proposes a membership change.
func (n *Node) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeV2) error {
	return n.raft.ProposeConfChange(ctx, cc)
}

// Propose proposes one lock command and waits until it is applied.
//
// ErrNotLeader means it was certainly not proposed. Once raft has accepted
// it, any failure to learn the result (ctx done, leadership lost, stop) is
// ErrIndeterminate: the entry may still commit.
func (n *Node) Propose(ctx context.Context, cmd core.Command) (Applied, error) {
	if err := cmd.Validate(); err != nil {
		return Applied{}, err
	}
	if !n.isLeader.Load() {
		return Applied{}, ErrNotLeader
	}
	id := n.reqBase + n.reqSeq.Add(1)
	ch := make(chan proposalResult, 1)
	n.pmu.Lock()
	n.proposals[id] = ch
	n.pmu.Unlock()
	data := core.EncodeEntry(core.Entry{RequestID: id, Command: cmd})
	// A context already done certainly proposed nothing; past this point
	// raft may return ctx or stop errors after it has taken the entry.
	if err := ctx.Err(); err != nil {
		n.pmu.Lock()
		delete(n.proposals, id)
		n.pmu.Unlock()
		return Applied{}, fmt.Errorf("raftstore: propose: %w", err)
	}
	if err := n.raft.Propose(ctx, data); err != nil {
		n.pmu.Lock()
		delete(n.proposals, id)
		n.pmu.Unlock()
		if errors.Is(err, raft.ErrProposalDropped) {
			return Applied{}, ErrNotLeader
		}
		// raft.node's stepWithWaitOption can report ctx.Err() or
		// ErrStopped after the entry was stepped into the log.
		return Applied{}, fmt.Errorf("%w: propose: %w", ErrIndeterminate, err)
	}
	select {
	case r := <-ch:
		return r.applied, r.err
	case <-ctx.Done():
		n.pmu.Lock()
		delete(n.proposals, id)
		n.pmu.Unlock()
		return Applied{}, fmt.Errorf("%w: %w", ErrIndeterminate, ctx.Err())
	}
}

// ReadIndex returns once the applied state includes every write committed
// before the call (raft ReadIndex, safe mode). Only the leader serves it.
func (n *Node) ReadIndex(ctx context.Context) error {
	if !n.isLeader.Load() {
		return ErrNotLeader
	}
	var rctx [8]byte
	binary.BigEndian.PutUint64(rctx[:], n.reqBase+n.reqSeq.Add(1))
	key := string(rctx[:])
	ch := make(chan readResult, 1)
	n.pmu.Lock()
	n.reads[key] = ch
	n.pmu.Unlock()
	defer func() {
		n.pmu.Lock()
		delete(n.reads, key)
		n.pmu.Unlock()
	}()
	if err := n.raft.ReadIndex(ctx, rctx[:]); err != nil {
		return fmt.Errorf("raftstore: read index: %w", err)
	}
	var index uint64
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		index = r.index
	case <-ctx.Done():
		return fmt.Errorf("raftstore: read index: %w", ctx.Err())
	case <-n.stopc:
		return ErrStopped
	}
	return n.WaitApplied(ctx, index)
}

// WaitApplied waits until the applied index reaches index.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	if n.applied.Load() >= index {
		return nil
	}
	ch := make(chan struct{})
	n.pmu.Lock()
	if n.applied.Load() >= index {
		n.pmu.Unlock()
		return nil
	}
	n.appliedW = append(n.appliedW, appliedWaiter{index: index, ch: ch})
	n.pmu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("raftstore: wait applied %d: %w", index, ctx.Err())
	case <-n.stopc:
		return ErrStopped
	}
}

func (n *Node) run() {
	defer close(n.donec)
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			n.raft.Tick()
		case rd := <-n.raft.Ready():
			if err := n.handleReady(rd); err != nil {
				n.log.Error("ready loop stopped", "err", err)
				n.errc <- err
				n.isLeader.Store(false)
				n.ready.Store(false)
				n.failAll(ErrIndeterminate)
				for _, o := range n.cfg.Observers {
					o.OnLeadershipLost()
				}
				return
			}
			n.raft.Advance()
		case <-n.stopc:
			return
		}
	}
}

func (n *Node) handleReady(rd raft.Ready) error {
	lostLeadership := false
	if rd.SoftState != nil {
		n.leader.Store(rd.SoftState.Lead)
		wasLeader := n.isLeader.Load()
		nowLeader := rd.SoftState.RaftState == raft.StateLeader
		n.isLeader.Store(nowLeader)
		if wasLeader && !nowLeader {
			n.ready.Store(false)
			lostLeadership = true
		}
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		n.term.Store(rd.HardState.Term)
	}

	// Only new entries, a term/vote change (rd.MustSync) or a snapshot must
	// be on disk before messages go out; the state change of entries already
	// durable in the log may ride without its own fsync.
	w := ReadyWrite{HardState: rd.HardState, Entries: rd.Entries, Snapshot: rd.Snapshot, MaySkipSync: !rd.MustSync}
	var (
		events      []Applied
		results     []proposalResult
		resultIDs   []uint64
		leaderReady bool
		restored    bool
		confChanges []raftpb.ConfChangeV2
	)

	n.mu.Lock()
	applied := n.applied.Load()
	cs := n.ConfState()
	start := time.Now()
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := n.machine.Restore(rd.Snapshot.Data); err != nil {
			n.mu.Unlock()
			return fmt.Errorf("restore snapshot at %d: %w", rd.Snapshot.Metadata.Index, err)
		}
		applied = rd.Snapshot.Metadata.Index
		cs = rd.Snapshot.Metadata.ConfState
		restored = true
		// The installed snapshot is now the store's latest one.
		n.snapIndex = applied
	}
	var as StateChange
	touched := make(map[string]struct{})
	var touchedOrder []string
	controlChanged := false
	for _, e := range rd.CommittedEntries {
		if e.Index <= applied {
			continue
		}
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) == 0 {
				if n.isLeader.Load() && e.Term == n.term.Load() {
					leaderReady = true
				}
				break
			}
			ent, err := core.DecodeEntry(e.Data)
			if err != nil {
				// Every replica rejects the same bytes the same way, so
				// skipping keeps them identical.
				n.log.Error("undecodable log entry skipped", "index", e.Index, "err", err)
				break
			}
			res := n.machine.Apply(ent.Command)
			if ent.Command.Kind == core.KindControl {
				controlChanged = true
			} else if _, ok := touched[ent.Command.Key]; !ok {
				touched[ent.Command.Key] = struct{}{}
				touchedOrder = append(touchedOrder, ent.Command.Key)
			}
			a := Applied{Index: e.Index, Term: e.Term, Command: ent.Command, Result: res}
			events = append(events, a)
			results = append(results, proposalResult{applied: a})
			resultIDs = append(resultIDs, ent.RequestID)
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			cc, err := decodeConfChange(e)
			if err != nil {
				n.mu.Unlock()
				return fmt.Errorf("conf change at %d: %w", e.Index, err)
			}
			cs = *n.raft.ApplyConfChange(cc)
			as.ConfState = &cs
			confChanges = append(confChanges, cc)
		}
		applied = e.Index
	}
	// The store wants the net change of the batch: one row per key.
	for _, key := range touchedOrder {
		if l, ok := n.machine.Get(key); ok {
			as.Put = append(as.Put, l)
		} else {
			as.Delete = append(as.Delete, key)
		}
	}
	if controlChanged {
		as.Control = n.machine.ControlSnapshot()
	}
	if len(rd.CommittedEntries) > 0 || restored {
		as.Index = applied
		as.LastToken = n.machine.LastToken()
		w.State = &as
	}
	if err := n.cfg.Store.Write(w); err != nil {
		n.mu.Unlock()
		return fmt.Errorf("persist ready: %w", err)
	}
	n.applied.Store(applied)
	n.confState.Store(&cs)
	n.mu.Unlock()
	if len(rd.CommittedEntries) > 0 {
		n.cfg.Metrics.observeApply(time.Since(start), len(rd.CommittedEntries))
	}

	// Durable: now the messages may go out.
	if n.cfg.Transport != nil && len(rd.Messages) > 0 {
		n.cfg.Transport.Send(rd.Messages)
	}

	obs := n.cfg.Observers
	for _, o := range obs {
		if restored {
			o.OnRestored(applied)
		}
	}
	for _, cc := range confChanges {
		for _, o := range obs {
			o.OnConfChange(cc, cs)
		}
	}
	for _, a := range events {
		for _, o := range obs {
			o.OnApplied(a)
		}
	}
	n.pmu.Lock()
	for i, id := range resultIDs {
		if ch, ok := n.proposals[id]; ok {
			delete(n.proposals, id)
			ch <- results[i]
		}
	}
	for _, rs := range rd.ReadStates {
		if ch, ok := n.reads[string(rs.RequestCtx)]; ok {
			delete(n.reads, string(rs.RequestCtx))
			ch <- readResult{index: rs.Index}
		}
	}
	kept := n.appliedW[:0]
	for _, aw := range n.appliedW {
		if aw.index <= applied {
			close(aw.ch)
		} else {
			kept = append(kept, aw)
		}
	}
	n.appliedW = kept
	n.pmu.Unlock()
	if lostLeadership {
		// After this Ready's own results went out: the rest of our
		// in-flight proposals may or may not commit under the new leader,
		// so their callers must not guess.
		n.failAll(ErrIndeterminate)
		for _, o := range obs {
			o.OnLeadershipLost()
		}
	}

	if leaderReady && !n.ready.Load() {
		n.ready.Store(true)
		for _, o := range obs {
			o.OnLeaderReady(n.term.Load())
		}
	}
	// A node added by a conf change can only restore a snapshot whose
	// ConfState names it (raft refuses others), so membership changes get
	// a fresh snapshot at once instead of waiting for the next interval.
	return n.maybeSnapshot(applied, cs, len(confChanges) > 0)
}

// maybeSnapshot records a snapshot every SnapshotEntries applied entries
// (or now, when force is set) and compacts the log behind it, keeping
// CompactKeep entries so that a
// slightly lagging follower catches up from the log, not a snapshot.
func (n *Node) maybeSnapshot(applied uint64, cs raftpb.ConfState, force bool) error {
	if applied <= n.snapIndex || !force && applied-n.snapIndex < n.cfg.SnapshotEntries {
		return nil
	}
	n.mu.RLock()
	data := n.machine.Snapshot()
	n.mu.RUnlock()
	if err := n.cfg.Store.CreateSnapshot(applied, cs, data); err != nil {
		return fmt.Errorf("create snapshot at %d: %w", applied, err)
	}
	n.snapIndex = applied
	if applied > n.cfg.CompactKeep {
		if err := n.cfg.Store.Compact(applied - n.cfg.CompactKeep); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("compact to %d: %w", applied-n.cfg.CompactKeep, err)
		}
	}
	n.log.Debug("snapshot taken", "index", applied, "bytes", len(data))
	return nil
}

// failAll ends every waiting proposal with err and every waiting read with
// ErrNotLeader (raft drops pending reads of a deposed leader).
func (n *Node) failAll(err error) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	for id, ch := range n.proposals {
		delete(n.proposals, id)
		ch <- proposalResult{err: err}
	}
	for key, ch := range n.reads {
		delete(n.reads, key)
		ch <- readResult{err: ErrNotLeader}
	}
}

func decodeConfChange(e raftpb.Entry) (raftpb.ConfChangeV2, error) {
	if e.Type == raftpb.EntryConfChange {
		var cc raftpb.ConfChange
		if err := cc.Unmarshal(e.Data); err != nil {
			return raftpb.ConfChangeV2{}, err
		}
		return cc.AsV2(), nil
	}
	var cc raftpb.ConfChangeV2
	if err := cc.Unmarshal(e.Data); err != nil {
		return raftpb.ConfChangeV2{}, err
	}
	return cc, nil
}
