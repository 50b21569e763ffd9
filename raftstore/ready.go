package raftstore

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/ticketd/ticketd/core"
)

// readyApply is what applying one Ready produced, for the steps after it.
type readyApply struct {
	applied          uint64 // applied index after this Ready
	confState        raftpb.ConfState
	restored         bool // a received snapshot replaced the state
	confChanges      []appliedConfChange
	events           []Applied
	requestIDs       []uint64 // requestIDs[i] is the proposal events[i] answers
	leaderReady      bool     // this leader's first entry of its term applied
	touched          touchedRows
	requests         requestMark // the request state before the entries (after any snapshot)
	sessions         sessionMark // the session state's header before the entries
	touchedSess      touchedSessions
	touchedMul       touchedMulti // multi-holder keys (holders.go)
	state            *StateChange // what to persist; nil when nothing applied
	delivered        bool         // events and proposal results went out before the write (applyAndPersist)
	summaryPublished bool         // the summary of the state after rd went out before the write
}

// touchedRows are the state rows a run of commands touched: lock keys in
// first-touch order, and whether the control state changed.
type touchedRows struct {
	keys    []string
	seen    map[string]struct{}
	control bool
}

func (t *touchedRows) add(cmd core.Command) {
	if cmd.Kind == core.KindControl {
		t.control = true
		return
	}
	if _, ok := t.seen[cmd.Key]; ok {
		return
	}
	if t.seen == nil {
		t.seen = make(map[string]struct{})
	}
	t.seen[cmd.Key] = struct{}{}
	t.keys = append(t.keys, cmd.Key)
}

// handleReady follows the raft.Ready contract, one named step each; the
// loop calls Advance after it returns nil.
func (n *Node) handleReady(rd raft.Ready) error {
	lostLeadership := n.trackSoftState(rd)
	// A leader sends its appends before its own write, so its fsync
	// overlaps the followers' (raft thesis §10.2.1; etcd's server does the
	// same). It is safe because the leader's own copy only ever counts once
	// this Ready is durable: raft may count it towards a commit in memory,
	// but that commit reaches the state machine, a client or a follower only
	// through a later Ready, which is handled after persist below returned.
	// A leader's messages promise nothing about its own disk (no votes; its
	// term and vote were made durable while it was a candidate). Every other
	// node sends after persist: its messages may be votes or appends it
	// acknowledges.
	sendFirst := n.isLeader.Load()
	if sendFirst {
		n.send(n.holdCommitOnly(rd.Messages))
	} else {
		clear(n.heldCommit)
	}

	start := time.Now()
	ra, err := n.applyAndPersist(rd)
	if err != nil {
		return err
	}
	if len(rd.CommittedEntries) > 0 {
		n.cfg.Metrics.observeApply(time.Since(start), len(rd.CommittedEntries))
	}

	if !sendFirst {
		n.send(rd.Messages)
	}
	n.notify(rd, ra, lostLeadership)
	// A node added by a conf change can only restore a snapshot whose
	// ConfState names it (raft refuses others), so membership changes get
	// a fresh snapshot at once instead of waiting for the next interval.
	return n.maybeSnapshot(ra.applied, ra.confState, len(ra.confChanges) > 0)
}

// applyAndPersist applies rd and persists it. machineMu is held for
// writing while the machine changes and, unless rd applies only entries
// that were durable in this node's log before rd, until the batch is
// durable, so View never shows state that a crash could lose (and it is
// released even if the write panics with a storage failure).
//
// Releasing it before the write when every committed entry of rd was
// already durable here (committedWereDurable) keeps that promise: such an
// entry is committed, so a majority holds it durably and every later leader
// has it (etcd-raft counts even the leader's own copy only after the Ready
// that wrote it was persisted: its self-acknowledgement is stepped at
// Advance), and it is in this node's durable log. If this node crashes
// before rd's batch is durable, it loses only rd's state rows, HardState
// and applied index, which are one batch; it restarts at the older applied
// index and raft hands it the same committed entries again, which the
// deterministic machine turns into the same state. So a reader that saw
// the state after them saw a state this node reaches again and the
// cluster never loses. The state becomes visible early (with its index, to
// ViewIndexed), and the observers and proposals hear of it early too
// (deliverApplied, unless rd changes membership), and so does the summary
// (Summary, ClusterVersion); the applied index, the store's rows, read
// states and the applied-index waiters still move after the write (persist, notify), so a reader must not pair
// View's state with AppliedIndex. A snapshot, or an entry that arrives and commits in the
// same Ready (a follower's append that carries its commit), keeps the lock
// across the write. The loop remains the machine's only writer, so it may
// read the machine after the release (persist's summary, the state change
// built under the lock) while readers hold the read lock.
//
// Why: with the lock held across every fsync, a request's View (the fence
// key of a grant, the releaser check of a release, a request id lookup)
// waited out the fsync of entries that arrived meanwhile, and its
// proposal then missed that Ready's batch (issue 26 item 4).
func (n *Node) applyAndPersist(rd raft.Ready) (*readyApply, error) {
	lastDurable, err := n.cfg.Store.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("persist ready: %w", err)
	}
	n.machineMu.Lock()
	locked := true
	defer func() {
		if locked {
			n.machineMu.Unlock()
		}
	}()
	var rows *SnapshotRows
	if !raft.IsEmptySnap(rd.Snapshot) {
		// The store's lock rows are staged from the snapshot's bytes on
		// another core while applyCommitted restores the machine from
		// them (batch.go).
		rows = n.cfg.Store.StageSnapshotRows(rd.Snapshot.Data)
		defer rows.Discard()
	}
	ra, err := n.applyCommitted(rd)
	if err != nil {
		return nil, err
	}
	n.machineIndex = ra.applied
	if committedWereDurable(rd, lastDurable) {
		locked = false
		n.machineMu.Unlock()
		if ra.state != nil {
			// What a reply lets a caller expect of this node (the cluster
			// version a SetClusterVersion raised, the last token) must
			// be there when the reply is.
			n.publishSummary(ra.applied)
			ra.summaryPublished = true
		}
		if len(ra.confChanges) == 0 {
			// Observers hear membership changes before the commands after
			// them (notify): a Ready that holds one delivers in order, after
			// the write.
			n.deliverApplied(ra)
		}
	}
	return ra, n.persist(rd, ra, rows)
}

// deliverApplied tells the observers about rd's applied commands and hands
// the waiting proposals their results. applyAndPersist calls it before the
// write when every entry rd applies was durable in this node's log before
// rd (and rd changes no membership); notify calls it otherwise, after.
//
// Answering before the write is safe for the reason the state may be shown
// (applyAndPersist): each entry is committed, so durable on a majority that
// every later leader includes, and durable in this node's log, so a crash
// before the write loses only the state rows and applied index, which the
// node rebuilds by applying the same entries again. It is the guarantee a
// reply already had when its Ready wrote no new entry: such a Ready's state
// rows are written without an fsync (ReadyWrite.MaySkipSync). A grant still
// goes out only after a majority's fsync of its entry. What moves after the
// write is unchanged: the applied index, read states and applied-index
// waiters, so a linearizable read that follows a reply still waits for
// this node's write.
//
// Why: a leader's Ready under load both applies the entries the followers
// acknowledged and appends the proposals that arrived meanwhile, and its
// write waits for the fsync of those new entries; the replies for the
// applied ones (and the waiters a release frees) waited that fsync out too.
func (n *Node) deliverApplied(ra *readyApply) {
	for _, a := range ra.events {
		for _, o := range n.cfg.Observers {
			o.OnApplied(a)
		}
	}
	n.waiting.completeProposals(ra.events, ra.requestIDs)
	ra.delivered = true
}

// committedWereDurable says whether every entry rd commits was in the
// durable log (up to lastDurable) before rd and is not rewritten by rd,
// and rd restores no snapshot: then rd's new state can be shown before
// rd's batch is durable (applyAndPersist).
func committedWereDurable(rd raft.Ready, lastDurable uint64) bool {
	if !raft.IsEmptySnap(rd.Snapshot) {
		return false
	}
	if len(rd.CommittedEntries) == 0 {
		return true
	}
	last := rd.CommittedEntries[len(rd.CommittedEntries)-1].Index
	return last <= lastDurable && (len(rd.Entries) == 0 || last < rd.Entries[0].Index)
}

// trackSoftState records the leader, role and term rd reports, and says
// whether this node just stopped being leader. A change of leader is an
// operator's event: it is logged here, once, at Info.
func (n *Node) trackSoftState(rd raft.Ready) (lostLeadership bool) {
	if !raft.IsEmptyHardState(rd.HardState) {
		n.term.Store(rd.HardState.Term)
	}
	if rd.SoftState != nil {
		prev := n.leader.Swap(rd.SoftState.Lead)
		wasLeader := n.isLeader.Load()
		nowLeader := rd.SoftState.RaftState == raft.StateLeader
		n.isLeader.Store(nowLeader)
		if wasLeader && !nowLeader {
			n.ready.Store(false)
			n.refuseProposals = false
			lostLeadership = true
		}
		switch lead := rd.SoftState.Lead; {
		case lead == prev:
		case lead == 0:
			n.log.Info("leader lost", "previous", prev, "term", n.term.Load(), "role", rd.SoftState.RaftState.String())
		default:
			n.cfg.Metrics.leaderElected()
			n.log.Info("leader elected", "leader", lead, "term", n.term.Load(), "self", lead == n.cfg.ID)
		}
	}
	return lostLeadership
}

// applyCommitted restores rd's snapshot, if any, applies rd's committed
// entries to the machine, and builds the state change to persist with
// them. The caller holds machineMu for writing.
func (n *Node) applyCommitted(rd raft.Ready) (*readyApply, error) {
	ra := &readyApply{applied: n.applied.Load(), confState: n.ConfState()}
	if !raft.IsEmptySnap(rd.Snapshot) {
		// Decoded straight into the machine's table (core/load_snapshot.go);
		// the store writes the lock rows from the same bytes
		// (stageSnapshot). A snapshot of any table the cluster can hold
		// passes the decoder's limits (core/limits.go).
		start := time.Now()
		if err := n.machine.Restore(rd.Snapshot.Data); err != nil {
			return nil, fmt.Errorf("restore snapshot at %d: %w", rd.Snapshot.Metadata.Index, err)
		}
		n.log.Info("snapshot restored", "index", rd.Snapshot.Metadata.Index, "locks", n.machine.Len(),
			"bytes", len(rd.Snapshot.Data), "took", time.Since(start))
		ra.applied = rd.Snapshot.Metadata.Index
		ra.confState = rd.Snapshot.Metadata.ConfState
		ra.restored = true
	}
	ra.mark(n.machine)
	for _, e := range rd.CommittedEntries {
		if e.Index <= ra.applied {
			continue
		}
		if err := n.applyEntry(e, ra); err != nil {
			return nil, err
		}
		ra.applied = e.Index
	}
	if len(rd.CommittedEntries) > 0 || ra.restored {
		ra.state = n.stateChange(ra)
	}
	return ra, nil
}

// applyEntry applies one committed entry: a lock or control command to the
// machine, a membership change to raft.
func (n *Node) applyEntry(e raftpb.Entry, ra *readyApply) error {
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			// A leader's empty entry of its own term: everything before it
			// is applied too, so the lock table is complete.
			if n.isLeader.Load() && e.Term == n.term.Load() {
				ra.leaderReady = true
			}
			return nil
		}
		ent, err := core.DecodeEntry(e.Data)
		if err == nil && n.cfg.MaxEntryVersion != 0 && e.Data[0] > n.cfg.MaxEntryVersion {
			err = fmt.Errorf("entry version %d is above this node's limit %d (a test's older binary)", e.Data[0], n.cfg.MaxEntryVersion)
		}
		if err != nil {
			// Never skip a committed entry: a replica running a binary
			// that reads it would apply it, and the tables (and tokens)
			// would diverge. Stop instead (fail-stop); the entry stays in
			// the log, so this node stops at the same index again until
			// it runs a binary that reads it.
			return &UndecodableEntryError{Index: e.Index, Term: e.Term, Version: e.Data[0], Err: err}
		}
		var ev Applied
		switch ent.Command.Kind {
		case core.KindRelease, core.KindExpire, core.KindClearDelay, core.KindSettle:
			// Read before: the command may remove the key's last holder.
			ev.Limit, ev.Mode, _ = n.machine.KeyKind(ent.Command.Key)
		}
		res, ended := ra.apply(n.machine, ent.Command)
		ev.Index, ev.Term, ev.Command, ev.Result, ev.Ended = e.Index, e.Term, ent.Command, res, ended
		for _, l := range ended {
			ev.Keys = append(ev.Keys, l.Key)
		}
		if res.Kind == core.ResultGranted || res.Kind == core.ResultRenewed || res.Kind == core.ResultGrantRepeated {
			// Read now: observers run after the whole Ready, when a later
			// entry of it may already have released the lock.
			l, _ := n.machine.Holder(ent.Command.Key, res.Token)
			ev.LeaseMS, ev.Limit, ev.Mode = l.LeaseMS, l.Limit, l.Mode
		}
		ra.events = append(ra.events, ev)
		ra.requestIDs = append(ra.requestIDs, ent.RequestID)
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		cc, err := decodeConfChange(e)
		if err != nil {
			return fmt.Errorf("conf change at %d: %w", e.Index, err)
		}
		prev := ra.confState
		ra.confState = *n.rn.ApplyConfChange(cc)
		ra.confChanges = append(ra.confChanges, appliedConfChange{index: e.Index, cc: cc, prev: prev, cs: ra.confState})
	}
	return nil
}

// stateChange is the net change of the state rows after applying: one row
// per touched key (held now => Put, not held => Delete), the control
// record when a control command applied, the request rows when the request
// state changed, the session rows when a session or a delayed key changed,
// the conf state when membership changed.
func (n *Node) stateChange(ra *readyApply) *StateChange {
	sc := ra.rowChange(n.machine)
	if len(ra.confChanges) > 0 {
		cs := ra.confState
		sc.ConfState = &cs
	}
	return sc
}

// persist writes rd's entries, HardState and snapshot and the state change
// with its applied index in one Pebble batch, so a crash keeps an applied
// entry together with its effect or loses both. The caller is the Ready
// loop (the machine's only writer); it may have released machineMu
// (applyAndPersist).
func (n *Node) persist(rd raft.Ready, ra *readyApply, rows *SnapshotRows) error {
	// Only new entries, a term/vote change (rd.MustSync) or a snapshot must
	// be on disk before messages go out; the state change of entries
	// already durable in the log may ride without its own fsync.
	w := ReadyWrite{HardState: rd.HardState, Entries: rd.Entries, Snapshot: rd.Snapshot, Rows: rows,
		State: ra.state, MaySkipSync: !rd.MustSync}
	if err := n.cfg.Store.Write(w); err != nil {
		return fmt.Errorf("persist ready: %w", err)
	}
	if ra.restored {
		// The installed snapshot is now the store's latest one.
		n.snapIndex.Store(ra.applied)
	}
	n.applied.Store(ra.applied)
	cs := ra.confState
	n.confState.Store(&cs)
	if ra.state != nil && !ra.summaryPublished {
		n.publishSummary(ra.applied)
	}
	return nil
}

// send hands rd's messages to the transport: after persist, except on a
// leader (see handleReady); consecutive appends and acknowledgments to one
// peer go as one message (coalesce.go).
func (n *Node) send(msgs []raftpb.Message) {
	if n.cfg.Transport != nil && len(msgs) > 0 {
		n.cfg.Transport.Send(coalesce(msgs, n.cfg.ID, MaxSizePerMsgDefault))
	}
}

// notify tells the observers and the waiting callers what the durable
// Ready did: restore, membership changes and applied commands first, then
// proposal results, read states and applied-index waiters, then a lost or
// a ready leadership.
func (n *Node) notify(rd raft.Ready, ra *readyApply, lostLeadership bool) {
	obs := n.cfg.Observers
	if ra.restored {
		n.cfg.Metrics.snapshotRestored()
		n.log.Info("snapshot restored", "index", ra.applied, "voters", ra.confState.Voters, "learners", ra.confState.Learners)
		for _, o := range obs {
			o.OnRestored(ra.applied)
		}
	}
	for _, c := range ra.confChanges {
		logConfChange(n.log, c)
		for _, o := range obs {
			o.OnConfChange(c.cc, c.cs)
		}
	}
	if !ra.delivered {
		n.deliverApplied(ra)
	}
	n.waiting.complete(rd.ReadStates, ra.applied)
	if lostLeadership {
		// After this Ready's own results went out: the rest of our
		// in-flight proposals may or may not commit under the new leader,
		// so their callers must not guess.
		n.waiting.failLostLeadership(ErrIndeterminate)
		n.reads.leadershipLost()
		for _, o := range obs {
			o.OnLeadershipLost()
		}
	}
	if ra.leaderReady && !n.ready.Load() {
		n.ready.Store(true)
		for _, o := range obs {
			o.OnLeaderReady(n.term.Load())
		}
	}
}

// appliedConfChange is a membership change applied at index, with the
// membership it left: a Ready that catches a node up may hold several, and
// each is logged with its own result, not the last one's (a learner added
// and later promoted would otherwise read "learner added" next to a voter
// list that already holds it).
type appliedConfChange struct {
	index    uint64
	cc       raftpb.ConfChangeV2
	prev, cs raftpb.ConfState // before and after
}

// logConfChange logs each change of an applied membership change, one
// line each, with its log index and the membership that results. Raft
// promotes a learner with the same change that adds a voter, and demotes a
// voter with the one that adds a learner: the line says which happened.
func logConfChange(log *slog.Logger, ac appliedConfChange) {
	cc, cs := ac.cc, ac.cs
	for _, c := range cc.Changes {
		msg := "member changed"
		switch c.Type {
		case raftpb.ConfChangeAddNode:
			msg = "voter added"
			if slices.Contains(ac.prev.Learners, c.NodeID) {
				msg = "learner promoted to voter"
			}
		case raftpb.ConfChangeAddLearnerNode:
			msg = "learner added"
			if slices.Contains(ac.prev.Voters, c.NodeID) {
				msg = "voter demoted to learner"
			}
		case raftpb.ConfChangeRemoveNode:
			msg = "member removed"
		}
		log.Info(msg, "member", c.NodeID, "index", ac.index, "voters", cs.Voters, "learners", cs.Learners, "joint", len(cs.VotersOutgoing) > 0)
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

// mark records where the request and session state stand before a run of
// commands (after any snapshot).
func (ra *readyApply) mark(m *core.Machine) {
	ra.requests = markRequests(m)
	ra.sessions = markSessions(m)
}

// apply applies one lock, control or session command to m and records the
// rows it touched. It returns the result and, for a CloseSession or
// ExpireSession, the locks it ended.
func (ra *readyApply) apply(m *core.Machine, c core.Command) (core.Result, []core.Lock) {
	var ended []core.Lock // the locks a session command may end, read before it applies
	if c.Kind == core.KindCloseSession || c.Kind == core.KindExpireSession {
		ended = m.SessionLocks(c.SessionID)
	}
	// A key that is a multi-holder key before or after the command has
	// its holder row changed, not its lock row (a key is one or the
	// other; a later command of the run that changes its kind touches
	// the other row).
	wasMulti := c.Kind != core.KindControl && m.IsMulti(c.Key)
	res := m.Apply(c)
	if c.Kind.IsSession() {
		if c.Kind == core.KindClearDelay && wasMulti {
			ra.touchedMul.add(c.Key) // it may have cleared a delayed slot
		}
		return res, ra.touchSession(m, &c, res, ended)
	}
	if c.Kind != core.KindControl && (wasMulti || m.IsMulti(c.Key)) {
		ra.touchedMul.add(c.Key)
		return res, nil
	}
	ra.touched.add(c)
	if res.Kind == core.ResultExpired && res.Existed {
		ra.touchedSess.addDelay(c.Key) // it may have left a lock-delay
	}
	return res, nil
}

// rowChange is the net change of the lock, control, request and session
// rows after the run applied (marked by mark) to m: one lock row per
// touched key (held now => Put, not held => Delete), the control record
// when a control command applied, the request and session rows when they
// changed.
func (ra *readyApply) rowChange(m *core.Machine) *StateChange {
	sc := &StateChange{Index: ra.applied, LastToken: m.LastToken()}
	for _, key := range ra.touched.keys {
		if l, ok := m.Get(key); ok {
			sc.Put = append(sc.Put, l)
		} else {
			sc.Delete = append(sc.Delete, key)
		}
	}
	if ra.touched.control {
		sc.Control = m.ControlSnapshot()
	}
	sc.Requests = requestChange(m, ra.requests)
	sc.Sessions = sessionChange(m, ra.sessions, &ra.touchedSess)
	holderChange(m, &ra.touchedMul, sc)
	return sc
}

// touchSession records the rows a session or lock-delay command changed
// (m has applied c, with result res): the session's row, the lock rows and
// delay rows of the locks it ended (ended: its locks before it applied),
// the delay row a ClearDelay removed. It returns the locks it
// ended, for the Applied event.
func (ra *readyApply) touchSession(m *core.Machine, c *core.Command, res core.Result, ended []core.Lock) []core.Lock {
	switch res.Kind {
	case core.ResultSessionOpened, core.ResultSessionRefreshed:
		ra.touchedSess.addID(res.Session)
	case core.ResultSessionClosed, core.ResultSessionExpired:
		if res.Kind == core.ResultSessionExpired && !res.Existed {
			return nil
		}
		ra.touchedSess.addID(c.SessionID)
		for _, l := range ended {
			if l.Limit > 1 || l.Mode == core.ModeShared {
				ra.touchedMul.add(l.Key) // the holder and any delayed slot
				continue
			}
			ra.touched.add(core.Command{Key: l.Key})
			if res.Kind == core.ResultSessionExpired {
				ra.touchedSess.addDelay(l.Key)
			}
		}
		return ended
	case core.ResultDelayCleared:
		ra.touchedSess.addDelay(c.Key)
	}
	return nil
}
