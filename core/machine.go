package core

import (
	"math"
	"sort"
)

// Lock is one held lock in the table, or one holder of a multi-holder
// key (kinds.go), whose Limit and Mode say the key's kind (both 0 for a
// mutex or exclusive lock, the only kind the table holds). LeaseMS is the lease a holder may
// assume from each grant or renewal; renewals only ever lengthen it.
// Identity is who the transport authenticated when it was granted (empty:
// anonymous, or granted before cluster version 2). RequestID is the
// client's request id of the Grant that made it (empty: none; cluster
// version 3), scoped to Identity (requests.go). From cluster version 4 a
// lock is either held in a session (SessionID; LeaseMS and LockDelayMS
// are 0: it ends with its session and takes its lock-delay) or by a lease
// with a LockDelayMS, 0 for none (sessions.go).
type Lock struct {
	Key         string
	Token       uint64
	Owner       string
	Identity    string
	RequestID   string
	LeaseMS     uint64
	GrantedAtMS uint64
	SessionID   uint64
	LockDelayMS uint64
	Limit       uint32
	Mode        Mode
}

// Machine is the lock table, the token counter, the request records
// (requests.go), the sessions and lock-delays (sessions.go) and the
// control state (control.go). The zero value is an
// empty table whose first token will be 1, not yet bootstrapped. Machine
// is not safe for concurrent use; its owner (raftstore) serialises access.
type Machine struct {
	locks     *lockTable // table.go; nil until the first lock
	lastToken uint64
	ctl       control
	req       requests
	sess      sessions
	kinds     kinds // multi-holder keys (kinds.go)

	// lockSum and ctlSum keep Digest O(1): lockSum is the multiset hash of
	// the lock table (digest.go), updated by put, grant and end
	// (requests.go), the only places the table changes; ctlSum is the hash of the control record,
	// recomputed whenever a control command or a restore may change it.
	// (req keeps the sum of its ended records itself.)
	lockSum sum256
	ctlSum  [32]byte
}

// NewMachine returns an empty machine.
func NewMachine() *Machine {
	m := &Machine{locks: newLockTable(0)}
	m.ctlSum = controlSum(m.ctl.state())
	return m
}

// Apply applies one committed command and returns its result. It never
// fails: a command that cannot take effect yields a result that says so.
// Commands that do not pass Validate yield Noop, so a replica that somehow
// sees one still stays identical to the others. A Grant after token
// math.MaxUint64 has been issued also yields Noop: tokens never wrap.
// A valid control command yields one of the control results; a rejected
// one (ControlRejected) changes nothing. From cluster version 3 on, every
// lock command also keeps the request records (requests.go): a Grant
// advances the data clock, and each prunes a few stale ended records.
func (m *Machine) Apply(c Command) Result {
	if c.validate() != nil || !m.supports(&c) {
		return Result{Kind: ResultNoop}
	}
	if c.Kind == KindControl {
		r := m.applyControl(c.Control)
		if r.Kind != ResultControlRejected {
			m.ctlSum = controlSum(m.ctl.state())
		}
		return r
	}
	if m.locks == nil {
		m.locks = newLockTable(0)
	}
	if m.ctl.clusterVersion >= 3 {
		if c.Kind == KindGrant || c.Kind == KindSettle {
			m.req.clockMS = max(m.req.clockMS, c.GrantedAtMS)
		}
		m.req.prune(RequestPruneBudget)
	}
	if c.Kind.isSession() {
		return m.applySession(&c)
	}
	if c.Kind == KindSettle {
		return m.settle(&c)
	}
	held, ok := m.locks.get(c.Key)
	if c.Kind != KindGrant {
		if mk := m.kinds.get(c.Key); mk != nil {
			return m.applyMulti(mk, &c)
		}
	}
	switch c.Kind {
	case KindGrant:
		var h [32]byte
		if c.RequestID != "" {
			h = RequestKey(c.Identity, c.RequestID)
			if r, named := m.grantRequest(&c, h); named {
				return r
			}
		}
		if ok {
			if c.Limit > 1 {
				return Result{Kind: ResultLimitMismatch, Limit: 1, Token: held.Token}
			}
			return Result{Kind: ResultGrantRejected, Token: held.Token}
		}
		if mk := m.kinds.get(c.Key); mk != nil {
			if r, refused := m.refuseMulti(mk, &c); refused {
				return r
			}
		}
		if r, refused := m.grantRefused(&c); refused {
			return r
		}
		if m.lastToken == math.MaxUint64 {
			// The token space is exhausted. Wrapping would issue token 0
			// and then reuse old tokens, so no further grant takes effect.
			return Result{Kind: ResultNoop}
		}
		if c.RequestID != "" && !m.req.makeRoom() {
			return Result{Kind: ResultRequestsExhausted}
		}
		m.lastToken++
		l := Lock{Key: c.Key, Token: m.lastToken, Owner: c.Owner, Identity: c.Identity, RequestID: c.RequestID,
			LeaseMS: c.LeaseMS, GrantedAtMS: c.GrantedAtMS, SessionID: c.SessionID, LockDelayMS: c.LockDelayMS}
		if isMulti(c.Limit, c.Mode) {
			l.Limit, l.Mode = c.Limit, c.Mode
			m.grantHolder(l, &h)
		} else {
			m.grant(l, &h)
		}
		return Result{Kind: ResultGranted, Token: m.lastToken}
	case KindRenew:
		if !ok || held.Token != c.Token {
			return Result{Kind: ResultNotFound}
		}
		if held.SessionID != 0 {
			return Result{Kind: ResultNoop} // no lease: it lives as long as its session
		}
		// A renewal never shortens the lease: a new leader re-arms every
		// lock with its LeaseMS, and a holder may still assume the longer
		// lease of an earlier grant or renewal.
		if c.LeaseMS > held.LeaseMS {
			held.LeaseMS = c.LeaseMS
			m.put(held)
		}
		return Result{Kind: ResultRenewed, Token: held.Token}
	case KindRelease:
		if !ok || held.Token != c.Token {
			return Result{Kind: ResultNotFound}
		}
		m.end(held)
		return Result{Kind: ResultReleased}
	case KindExpire:
		if !ok || held.Token != c.Token {
			return Result{Kind: ResultExpired, Existed: false}
		}
		return m.expire(held)
	}
	return Result{Kind: ResultNoop}
}

// supports reports whether the cluster version allows c: commands and
// fields of a later version than the cluster has agreed on are Noop, so a
// leader that proposed one too early changes nothing on any replica.
func (m *Machine) supports(c *Command) bool {
	return CommandVersion(*c) <= m.ClusterVersion()
}

// ClusterVersion is the format version every member has agreed to read:
// 1 until a SetClusterVersion command raised it. Leaders propose commands
// of a later version (CommandVersion) only once the cluster version allows
// them, and snapshots and records are written in the formats it names.
func (m *Machine) ClusterVersion() uint64 { return max(1, m.ctl.clusterVersion) }

// Get returns the mutex or exclusive lock held on key, if any; a
// multi-holder key's holders are in Holders (kinds.go).
func (m *Machine) Get(key string) (Lock, bool) {
	if m.locks == nil {
		return Lock{}, false
	}
	return m.locks.get(key)
}

// Len is the number of held locks: mutex and exclusive locks and the
// holders of multi-holder keys.
func (m *Machine) Len() int {
	if m.locks == nil {
		return m.kinds.nHolders
	}
	return m.locks.len() + m.kinds.nHolders
}

// LastToken is the highest token ever issued (0 if none). The next Grant
// receives LastToken()+1.
func (m *Machine) LastToken() uint64 { return m.lastToken }

// ForEachLock calls f for every held mutex or exclusive lock (not the
// holders of multi-holder keys: ForEachHolder) in no particular order, without
// copying or sorting the table. Callers must not let the order reach
// anything replicated or compared (results, snapshots, digests). The
// strings of l share the table's memory (table.go): copy one that is kept
// for long.
func (m *Machine) ForEachLock(f func(l Lock)) {
	if m.locks != nil {
		m.locks.forEach(f)
	}
}

// ForEachLockFrom calls f for the held locks at table positions [from,
// from+n) and returns the position to continue from; done reports that
// none are left. Positions are where locks sit in the table (table.go),
// which never moves a lock, so a walk in steps may let the machine change
// between them: a lock held throughout is visited exactly once, one added
// or removed meanwhile at most once. Restore and Load start a new table
// (and make a walk begun before them meaningless). As with ForEachLock,
// no order may reach anything replicated.
func (m *Machine) ForEachLockFrom(from, n int, f func(l Lock)) (next int, done bool) {
	if m.locks == nil {
		return from, true
	}
	return m.locks.forEachFrom(from, n, f)
}

// Locks returns every held mutex or exclusive lock sorted by key (the
// multi-holder keys are MultiKeys).
func (m *Machine) Locks() []Lock {
	out := make([]Lock, 0, m.Len()-m.kinds.nHolders)
	m.ForEachLock(func(l Lock) { out = append(out, l) })
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Snapshot encodes the whole state (lock table, counter, request records,
// sessions and lock-delays, control state) in the versioned snapshot
// format. Equal states give equal
// bytes.
func (m *Machine) Snapshot() []byte {
	return EncodeSnapshotState(m.SnapshotState())
}

// SnapshotState returns a copy of the whole state, as a snapshot carries
// it.
func (m *Machine) SnapshotState() SnapshotState {
	return SnapshotState{LastToken: m.lastToken, Locks: m.Locks(), Control: m.ctl.state(), Requests: m.req.state(), Sessions: m.sess.state(),
		Holders: m.MultiKeys()}
}

// Digest summarises the whole state: equal on two replicas exactly when
// their tables, counters, request records, sessions, lock-delays and
// control states are equal
// (up to SHA-256 collisions). It costs O(1): the lock table's and the
// request records' parts are kept up to date by every change (digest.go),
// so status can report it on every call.
func (m *Machine) Digest() [32]byte {
	ctl := m.ctlSum
	if ctl == ([32]byte{}) {
		// A zero Machine (not from NewMachine) that no control command,
		// restore or load has touched yet.
		ctl = controlSum(m.ctl.state())
	}
	if m.ctl.clusterVersion >= 5 {
		return stateDigestV4(m.lastToken, m.Len(), &m.lockSum, &ctl, &m.req, &m.sess, &m.kinds)
	}
	if m.ctl.clusterVersion >= 4 {
		return stateDigestV3(m.lastToken, m.Len(), &m.lockSum, &ctl, &m.req, &m.sess)
	}
	if m.ctl.clusterVersion >= 3 {
		return stateDigestV2(m.lastToken, m.Len(), &m.lockSum, &ctl, &m.req)
	}
	return stateDigest(m.lastToken, m.Len(), &m.lockSum, &ctl)
}

// Restore replaces the whole state with a decoded snapshot. A version 1
// snapshot restores an empty control state. On error the machine is
// unchanged.
func (m *Machine) Restore(snapshot []byte) error {
	return m.restoreSnapshot(snapshot) // load_snapshot.go
}

// RestoreState replaces the whole state with a snapshot already decoded
// by DecodeSnapshotState (so that a caller that needs the decoded state
// too decodes it once).
func (m *Machine) RestoreState(s SnapshotState) {
	m.Load(s.LastToken, s.Locks)
	m.ctl = newControl(s.Control)
	m.ctlSum = controlSum(m.ctl.state())
	m.req.load(s.Requests)
	m.sess.load(s.Sessions)
	m.loadKinds(s.Holders)
}

// Load replaces the lock table and token counter with the given ones, as
// read back from storage. The caller guarantees the locks are valid (they
// came through a decoder). The control state and the request records,
// which storage keeps in rows of their own, are left alone: LoadControl,
// LoadRequests, LoadSessions and LoadHolders replace them (in that order,
// after Load). The multi-holder keys are emptied.
func (m *Machine) Load(lastToken uint64, locks []Lock) {
	m.lastToken = lastToken
	m.locks = newLockTable(len(locks))
	m.lockSum = sum256{}
	m.req.held = nil
	m.sess.locksOf = nil
	m.kinds = kinds{maxHolders: m.kinds.maxHolders}
	for _, l := range locks {
		m.put(l)
	}
}

// put sets the lock on l.Key, keeping lockSum and the indexes of held
// request ids and of session locks in step.
func (m *Machine) put(l Lock) {
	old, ok := m.locks.put(l)
	if ok {
		m.lockSum.sub(lockTerm(old))
		m.sess.lockRemoved(&old)
	}
	m.lockSum.add(lockTerm(l))
	m.sess.lockAdded(&l)
	if ok && old.RequestID == l.RequestID && old.Identity == l.Identity {
		return // a renewal: same request
	}
	if ok && old.RequestID != "" {
		delete(m.req.held, RequestKey(old.Identity, old.RequestID))
	}
	if l.RequestID != "" {
		if m.req.held == nil {
			m.req.held = make(map[[32]byte]string)
		}
		m.req.held[RequestKey(l.Identity, l.RequestID)] = l.Key
	}
}

// ControlSnapshot encodes the control state as a control record
// (EncodeControlState), for storage to persist in its own row in the same
// batch as the applied index. Equal states give equal bytes.
func (m *Machine) ControlSnapshot() []byte { return EncodeControlState(m.ctl.state()) }

// LoadControl replaces the control state with a decoded control record (as
// written from ControlSnapshot). On error the machine is unchanged.
func (m *Machine) LoadControl(record []byte) error {
	cs, err := DecodeControlState(record)
	if err != nil {
		return err
	}
	m.ctl = newControl(cs)
	m.ctlSum = controlSum(m.ctl.state())
	return nil
}
