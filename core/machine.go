package core

import (
	"math"
	"sort"
)

// Lock is one held lock in the table. LeaseMS is the lease a holder may
// assume from each grant or renewal; renewals only ever lengthen it.
// Identity is who the transport authenticated when it was granted (empty:
// anonymous, or granted before cluster version 2).
type Lock struct {
	Key         string
	Token       uint64
	Owner       string
	Identity    string
	LeaseMS     uint64
	GrantedAtMS uint64
}

// Machine is the lock table, the token counter and the control state
// (control.go). The zero value is an empty table whose first token will be
// 1, not yet bootstrapped. Machine is not safe for concurrent use; its
// owner (raftstore) serialises access.
type Machine struct {
	locks     map[string]Lock
	lastToken uint64
	ctl       control

	// lockSum and ctlSum keep Digest O(1): lockSum is the multiset hash of
	// the lock table (digest.go), updated by put and del, the only two
	// places the table changes; ctlSum is the hash of the control record,
	// recomputed whenever a control command or a restore may change it.
	lockSum lockSum
	ctlSum  [32]byte
}

// NewMachine returns an empty machine.
func NewMachine() *Machine {
	m := &Machine{locks: make(map[string]Lock)}
	m.ctlSum = controlSum(m.ctl.state())
	return m
}

// Apply applies one committed command and returns its result. It never
// fails: a command that cannot take effect yields a result that says so.
// Commands that do not pass Validate yield Noop, so a replica that somehow
// sees one still stays identical to the others. A Grant after token
// math.MaxUint64 has been issued also yields Noop: tokens never wrap.
// A valid control command yields one of the control results; a rejected
// one (ControlRejected) changes nothing.
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
		m.locks = make(map[string]Lock)
	}
	held, ok := m.locks[c.Key]
	switch c.Kind {
	case KindGrant:
		if ok {
			return Result{Kind: ResultGrantRejected, Token: held.Token}
		}
		if m.lastToken == math.MaxUint64 {
			// The token space is exhausted. Wrapping would issue token 0
			// and then reuse old tokens, so no further grant takes effect.
			return Result{Kind: ResultNoop}
		}
		m.lastToken++
		m.put(Lock{Key: c.Key, Token: m.lastToken, Owner: c.Owner, Identity: c.Identity, LeaseMS: c.LeaseMS, GrantedAtMS: c.GrantedAtMS})
		return Result{Kind: ResultGranted, Token: m.lastToken}
	case KindRenew:
		if !ok || held.Token != c.Token {
			return Result{Kind: ResultNotFound}
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
		m.del(c.Key)
		return Result{Kind: ResultReleased}
	case KindExpire:
		if !ok || held.Token != c.Token {
			return Result{Kind: ResultExpired, Existed: false}
		}
		m.del(c.Key)
		return Result{Kind: ResultExpired, Existed: true}
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

// Get returns the lock held on key, if any.
func (m *Machine) Get(key string) (Lock, bool) {
	l, ok := m.locks[key]
	return l, ok
}

// Len is the number of held locks.
func (m *Machine) Len() int { return len(m.locks) }

// LastToken is the highest token ever issued (0 if none). The next Grant
// receives LastToken()+1.
func (m *Machine) LastToken() uint64 { return m.lastToken }

// ForEachLock calls f for every held lock in no particular order, without
// copying or sorting the table. Callers must not let the order reach
// anything replicated or compared (results, snapshots, digests).
func (m *Machine) ForEachLock(f func(l Lock)) {
	for _, l := range m.locks {
		f(l)
	}
}

// Locks returns every held lock sorted by key.
func (m *Machine) Locks() []Lock {
	out := make([]Lock, 0, len(m.locks))
	for _, l := range m.locks {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Snapshot encodes the whole state (lock table, counter, control state) in
// the versioned snapshot format. Equal states give equal bytes.
func (m *Machine) Snapshot() []byte {
	return EncodeSnapshotState(SnapshotState{LastToken: m.lastToken, Locks: m.Locks(), Control: m.ctl.state()})
}

// Digest summarises the whole state: equal on two replicas exactly when
// their tables, counters and control states are equal (up to SHA-256
// collisions). It costs O(1): the lock table's part is kept up to date by
// every change (digest.go), so status can report it on every call.
func (m *Machine) Digest() [32]byte {
	ctl := m.ctlSum
	if ctl == ([32]byte{}) {
		// A zero Machine (not from NewMachine) that no control command,
		// restore or load has touched yet.
		ctl = controlSum(m.ctl.state())
	}
	return stateDigest(m.lastToken, len(m.locks), &m.lockSum, &ctl)
}

// Restore replaces the whole state with a decoded snapshot. A version 1
// snapshot restores an empty control state. On error the machine is
// unchanged.
func (m *Machine) Restore(snapshot []byte) error {
	s, err := DecodeSnapshotState(snapshot)
	if err != nil {
		return err
	}
	m.RestoreState(s)
	return nil
}

// RestoreState replaces the whole state with a snapshot already decoded
// by DecodeSnapshotState (so that a caller that needs the decoded state
// too decodes it once).
func (m *Machine) RestoreState(s SnapshotState) {
	m.Load(s.LastToken, s.Locks)
	m.ctl = newControl(s.Control)
	m.ctlSum = controlSum(m.ctl.state())
}

// Load replaces the lock table and token counter with the given ones, as
// read back from storage. The caller guarantees the locks are valid (they
// came through a decoder). The control state, which storage keeps in its
// own row, is left alone: LoadControl replaces it.
func (m *Machine) Load(lastToken uint64, locks []Lock) {
	m.lastToken = lastToken
	m.locks = make(map[string]Lock, len(locks))
	m.lockSum = lockSum{}
	for _, l := range locks {
		m.put(l)
	}
}

// put sets the lock on l.Key, keeping lockSum in step.
func (m *Machine) put(l Lock) {
	if old, ok := m.locks[l.Key]; ok {
		m.lockSum.sub(old)
	}
	m.locks[l.Key] = l
	m.lockSum.add(l)
}

// del removes the lock on key, if any, keeping lockSum in step.
func (m *Machine) del(key string) {
	if old, ok := m.locks[key]; ok {
		m.lockSum.sub(old)
		delete(m.locks, key)
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
