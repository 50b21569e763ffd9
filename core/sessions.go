package core

import (
	"maps"
	"math"
	"slices"
	"sort"
)

// Sessions and lock-delays (cluster version 4).
//
// A session is one liveness for many locks: OpenSession gives it an ID
// from a replicated counter (never reused: snapshots carry the counter and
// Reseed moves it past every ID the old cluster may have issued), a Grant
// with its SessionID binds a lock to it instead of a lease, and the
// session ends with every lock of it in one command: CloseSession (a
// release: no delay) or ExpireSession (a failure: each freed key gets the
// session's lock-delay).
//
// # Why a keepalive is not logged, and why that is safe across leaders
//
// A session ends only through a committed command; clocks never decide
// state. The leader times each session on its monotonic clock and
// proposes ExpireSession(id, epoch) when the TTL ran out without a
// keepalive. A keepalive that only refreshes restarts that timer and is
// not logged (as etcd's lease keepalive): a fleet's keepalives would
// otherwise be most of the log. The rule to keep is the lease rule: a
// client whose keepalive was acknowledged, sent at s, may assume its
// session until s + TTL, so no ExpireSession may apply before that. It
// holds because the leader follows three rules (lockservice's, in the
// next phase):
//
//  1. It acknowledges a keepalive only after confirming, after the
//     keepalive arrived, that it is still the leader: a ReadIndex round
//     (raftstore Node.ReadIndex), shared by every keepalive that waits for
//     it. Without this a deposed leader that does not know it yet could
//     acknowledge at t, after a new leader started timing the session at
//     T < s, and the new leader would expire it at T + TTL, before s +
//     TTL. With it, a quorum member answered the round before it voted
//     for any later leader, so every later leader starts timing after s.
//     (etcd had exactly this bug and fixed it the same way: etcd#13915,
//     ensureLeadership before a lease renewal.)
//  2. A new leader re-arms every session with its full TTL only at
//     LeaderReady, once it has applied every entry of earlier terms; from
//     then on no entry of an earlier term can commit (an old leader's
//     uncommitted entries are overwritten). So a deposed leader's
//     ExpireSession either applied before the new leader acknowledges
//     anything, or never applies; and the new leader's own expiry comes
//     at least a full TTL after it started timing.
//  3. It never acknowledges a log-free keepalive for a session whose
//     ExpireSession it has proposed and not seen applied. Such a
//     keepalive is logged instead, as RefreshSession, which changes the
//     session's epoch: the log orders the two, and the second is stale.
//     If the refresh applies first, the expiry (carrying the old epoch)
//     changes nothing (ResultSessionExpired, Existed false) and the
//     client is acknowledged; if the expiry applies first, the refresh
//     finds no session (ResultSessionNotFound) and the client learns its
//     session ended.
//
// So the epoch changes only with RefreshSession (OpenSession starts it at
// 1): it names the generation of the leader's timer that a logged change
// restarted. Grants and releases in a session do not change it: an
// acquire is not a keepalive (as in etcd and Consul), and changing it
// would make every expiry of a busy session race its grants for nothing.
// The leader reads the epoch from the machine when its timer fires.
//
// # Lock-delay
//
// A lock freed because its holder failed (an Expire that removed a lock
// with a LockDelayMS, an ExpireSession of a session with one; never a
// Release or CloseSession) leaves its key delayed: a replicated record
// {key, delay, seq}, seq from a replicated counter. A Grant of a delayed
// key applies as ResultDelayed and changes nothing (core has no clock;
// the leader knows how much of the delay is left). The leader proposes
// ClearDelay(key, seq) once the delay has passed on its monotonic clock; a
// new leader re-arms every delayed key with its full delay from its
// LeaderReady, never shorter. The seq makes ClearDelay exact like a token
// makes Expire exact: a retried ClearDelay cannot end a later delay of the
// same key. A key is either held or delayed, never both. See limits.go
// for the bounds and what happens at them.
//
// Apply does not check who closes or uses a session (Identity is recorded,
// information like a Grant's): the leader does, before proposing.

// Session is one open session.
type Session struct {
	ID          uint64
	Identity    string // who opened it (empty: anonymous)
	TTLMS       uint64
	LockDelayMS uint64 // the lock-delay of each of its locks
	Epoch       uint64 // 1 at open, +1 per RefreshSession
}

// Delay is one key in its lock-delay.
type Delay struct {
	Key     string
	DelayMS uint64
	Seq     uint64
}

// SessionState is the replicated session state: the two counters, every
// open session (ascending ID) and every delayed key (ascending key). Which
// locks a session holds is in the locks (Lock.SessionID).
type SessionState struct {
	LastSessionID uint64
	LastDelaySeq  uint64
	Sessions      []Session
	Delays        []Delay
}

// sessions is the machine's in-memory session state. The zero value is
// empty.
type sessions struct {
	lastID  uint64
	lastSeq uint64
	byID    map[uint64]Session
	delays  map[string]Delay
	// locksOf indexes the lock table by session (built by the lock
	// table's changes, not replicated on its own).
	locksOf     map[uint64]map[string]struct{}
	perIdentity map[string]int
	// sum is Σ sessionTerm + Σ delayTerm, for the digest.
	sum sum256
	// limits replace the bounds when not zero; only tests set them
	// (export_test.go).
	limits sessionLimits
}

type sessionLimits struct{ sessions, locksPerSession, delays int }

func (s *sessions) maxSessions() int { return cmp0(s.limits.sessions, MaxSessions) }
func (s *sessions) maxLocks() int    { return cmp0(s.limits.locksPerSession, MaxLocksPerSession) }
func (s *sessions) maxDelays() int   { return cmp0(s.limits.delays, MaxDelayedKeys) }

func cmp0(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func (s *sessions) put(x Session) {
	if old, ok := s.byID[x.ID]; ok {
		s.sum.sub(sessionTerm(&old))
	} else {
		if s.byID == nil {
			s.byID = make(map[uint64]Session)
			s.perIdentity = make(map[string]int)
		}
		s.perIdentity[x.Identity]++
	}
	s.byID[x.ID] = x
	s.sum.add(sessionTerm(&x))
}

func (s *sessions) remove(x Session) {
	s.sum.sub(sessionTerm(&x))
	delete(s.byID, x.ID)
	if s.perIdentity[x.Identity]--; s.perIdentity[x.Identity] == 0 {
		delete(s.perIdentity, x.Identity)
	}
}

func (s *sessions) putDelay(d Delay) {
	if s.delays == nil {
		s.delays = make(map[string]Delay)
	}
	s.delays[d.Key] = d
	s.sum.add(delayTerm(&d))
}

func (s *sessions) removeDelay(d Delay) {
	s.sum.sub(delayTerm(&d))
	delete(s.delays, d.Key)
}

// lockAdded and lockRemoved keep locksOf in step with the lock table.
func (s *sessions) lockAdded(l *Lock) {
	if l.SessionID == 0 {
		return
	}
	if s.locksOf == nil {
		s.locksOf = make(map[uint64]map[string]struct{})
	}
	keys := s.locksOf[l.SessionID]
	if keys == nil {
		keys = make(map[string]struct{})
		s.locksOf[l.SessionID] = keys
	}
	keys[l.Key] = struct{}{}
}

func (s *sessions) lockRemoved(l *Lock) {
	if l.SessionID == 0 {
		return
	}
	keys := s.locksOf[l.SessionID]
	delete(keys, l.Key)
	if len(keys) == 0 {
		delete(s.locksOf, l.SessionID)
	}
}

// sortedKeys returns the keys of session id's locks in key order: the
// order a command that ends them ends them in, so that request records
// and delay sequence numbers come out the same on every replica.
func (s *sessions) sortedKeys(id uint64) []string {
	keys := make([]string, 0, len(s.locksOf[id]))
	for k := range s.locksOf[id] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// applySession applies a session or lock-delay command (validated, of a
// cluster version the machine supports).
func (m *Machine) applySession(c *Command) Result {
	s := &m.sess
	switch c.Kind {
	case KindOpenSession:
		if len(s.byID) >= s.maxSessions() {
			return Result{Kind: ResultSessionsExhausted}
		}
		if s.lastID == math.MaxUint64 {
			return Result{Kind: ResultNoop} // IDs never wrap, like tokens
		}
		s.lastID++
		s.put(Session{ID: s.lastID, Identity: c.Identity, TTLMS: c.TTLMS, LockDelayMS: c.LockDelayMS, Epoch: 1})
		return Result{Kind: ResultSessionOpened, Session: s.lastID, Epoch: 1}
	case KindRefreshSession:
		x, ok := s.byID[c.SessionID]
		if !ok {
			return Result{Kind: ResultSessionNotFound}
		}
		if x.Epoch == math.MaxUint64 {
			return Result{Kind: ResultNoop} // epochs never wrap
		}
		x.Epoch++
		s.put(x)
		return Result{Kind: ResultSessionRefreshed, Session: x.ID, Epoch: x.Epoch}
	case KindCloseSession:
		x, ok := s.byID[c.SessionID]
		if !ok {
			return Result{Kind: ResultSessionNotFound}
		}
		n := m.endSession(x, 0)
		return Result{Kind: ResultSessionClosed, Session: x.ID, Count: n}
	case KindExpireSession:
		x, ok := s.byID[c.SessionID]
		if !ok || x.Epoch != c.Epoch {
			return Result{Kind: ResultSessionExpired, Session: c.SessionID}
		}
		if x.LockDelayMS > 0 && m.delayCount()+m.SessionLockCount(x.ID) > s.maxDelays() {
			return Result{Kind: ResultDelaysExhausted}
		}
		n := m.endSession(x, x.LockDelayMS)
		return Result{Kind: ResultSessionExpired, Session: x.ID, Existed: true, Count: n}
	case KindClearDelay:
		d, ok := s.delays[c.Key]
		if !ok || d.Seq != c.DelaySeq {
			if m.clearSlot(c.Key, c.DelaySeq) {
				return Result{Kind: ResultDelayCleared}
			}
			return Result{Kind: ResultNotFound}
		}
		s.removeDelay(d)
		return Result{Kind: ResultDelayCleared}
	}
	return Result{Kind: ResultNoop}
}

// endSession ends every lock of session x (its mutex locks and its
// holders of multi-holder keys) in key then token order, delaying each
// key or slot by delayMS when not 0, and removes the session. It returns
// the number of locks ended.
func (m *Machine) endSession(x Session, delayMS uint64) uint64 {
	locks := m.SessionLocks(x.ID)
	for _, l := range locks {
		mk := m.kinds.get(l.Key)
		if mk == nil {
			m.end(l)
			if delayMS > 0 {
				m.delay(l.Key, delayMS)
			}
			continue
		}
		m.endHolder(mk, mk.find(l.Token))
		if delayMS > 0 {
			m.delaySlot(mk, l.Key, delayMS)
		}
		m.kinds.tidy(l.Key, mk)
	}
	m.sess.remove(x)
	// One more ended request record pruned per lock ended, so that a
	// backlog still drains (limits.go, RequestPruneBudget).
	m.req.prune(len(locks))
	return uint64(len(locks))
}

// delay starts the lock-delay of key (just freed by a failure).
func (m *Machine) delay(key string, delayMS uint64) {
	m.sess.lastSeq++
	m.sess.putDelay(Delay{Key: key, DelayMS: delayMS, Seq: m.sess.lastSeq})
}

// grantRefused is the session and lock-delay part of a Grant of a free
// key: ResultDelayed when the key is in its lock-delay, and for a session
// grant ResultSessionNotFound or ResultSessionLocksExhausted; ok false
// when none applies.
func (m *Machine) grantRefused(c *Command) (res Result, ok bool) {
	s := &m.sess
	if _, delayed := s.delays[c.Key]; delayed {
		return Result{Kind: ResultDelayed}, true
	}
	if c.SessionID == 0 {
		return Result{}, false
	}
	if _, open := s.byID[c.SessionID]; !open {
		return Result{Kind: ResultSessionNotFound}, true
	}
	if m.SessionLockCount(c.SessionID) >= s.maxLocks() {
		return Result{Kind: ResultSessionLocksExhausted}, true
	}
	return Result{}, false
}

// expire is Expire of the held lock l whose token matched. A session
// lock is not expired this way (it has no lease; it ends with its
// session): Existed false, nothing changes. A lock with a lock-delay
// leaves its key delayed, unless the delayed keys are full.
func (m *Machine) expire(l Lock) Result {
	switch {
	case l.SessionID != 0:
		return Result{Kind: ResultExpired}
	case l.LockDelayMS > 0 && m.delayCount() >= m.sess.maxDelays():
		return Result{Kind: ResultDelaysExhausted}
	}
	m.end(l)
	if l.LockDelayMS > 0 {
		m.delay(l.Key, l.LockDelayMS)
	}
	return Result{Kind: ResultExpired, Existed: true}
}

// state returns a copy of the replicated session state.
func (s *sessions) state() SessionState {
	ss := SessionState{LastSessionID: s.lastID, LastDelaySeq: s.lastSeq}
	if len(s.byID) > 0 {
		ss.Sessions = make([]Session, 0, len(s.byID))
		for _, x := range s.byID {
			ss.Sessions = append(ss.Sessions, x)
		}
		sort.Slice(ss.Sessions, func(i, j int) bool { return ss.Sessions[i].ID < ss.Sessions[j].ID })
	}
	if len(s.delays) > 0 {
		ss.Delays = make([]Delay, 0, len(s.delays))
		for _, d := range s.delays {
			ss.Delays = append(ss.Delays, d)
		}
		sort.Slice(ss.Delays, func(i, j int) bool { return ss.Delays[i].Key < ss.Delays[j].Key })
	}
	return ss
}

// load replaces the replicated session state with ss (validated), keeping
// locksOf, which the lock table's load built.
func (s *sessions) load(ss SessionState) {
	*s = sessions{lastID: ss.LastSessionID, lastSeq: ss.LastDelaySeq, locksOf: s.locksOf, limits: s.limits}
	for _, x := range ss.Sessions {
		s.put(x)
	}
	for _, d := range ss.Delays {
		s.putDelay(d)
	}
}

// Session returns the open session id, if any.
func (m *Machine) Session(id uint64) (Session, bool) {
	x, ok := m.sess.byID[id]
	return x, ok
}

// SessionCount is the number of open sessions.
func (m *Machine) SessionCount() int { return len(m.sess.byID) }

// SessionsOf is the number of sessions identity has open (O(1), for the
// leader's per-identity quota).
func (m *Machine) SessionsOf(identity string) int { return m.sess.perIdentity[identity] }

// ForEachSession calls f for every open session in no particular order
// (a new leader re-arms their timers). Callers must not let the order
// reach anything replicated or compared.
func (m *Machine) ForEachSession(f func(Session)) {
	for _, x := range m.sess.byID {
		f(x)
	}
}

// SessionLockCount is the number of locks session id holds, holders of
// multi-holder keys included (O(1)).
func (m *Machine) SessionLockCount(id uint64) int {
	return len(m.sess.locksOf[id]) + len(m.kinds.holdersOf[id])
}

// SessionLocks returns the locks session id holds, holders of
// multi-holder keys included, sorted by key then token: the locks a
// CloseSession or ExpireSession of it would end, in that order.
func (m *Machine) SessionLocks(id uint64) []Lock {
	keys := m.sess.sortedKeys(id)
	out := make([]Lock, 0, len(keys)+len(m.kinds.holdersOf[id]))
	for _, k := range keys {
		l, _ := m.locks.get(k)
		out = append(out, l)
	}
	if len(m.kinds.holdersOf[id]) > 0 {
		out = append(out, m.sessionHolders(id)...)
		sortLocks(out)
	}
	return out
}

// Delay returns the lock-delay of key, if it is in one.
func (m *Machine) Delay(key string) (Delay, bool) {
	d, ok := m.sess.delays[key]
	return d, ok
}

// DelayCount is the number of keys in their lock-delay (SlotDelayCount
// the delayed slots of multi-holder keys).
func (m *Machine) DelayCount() int { return len(m.sess.delays) }

// ForEachDelay calls f for every delayed key and every delayed slot of a
// multi-holder key (kinds.go) in no particular order (a new leader
// re-arms them with their full delay; ClearDelay(d.Key, d.Seq) ends
// either).
func (m *Machine) ForEachDelay(f func(Delay)) {
	for _, d := range m.sess.delays {
		f(d)
	}
	for _, mk := range m.kinds.keys {
		for _, d := range mk.delays {
			f(d)
		}
	}
}

// LastSessionID is the highest session ID ever issued (0 if none).
func (m *Machine) LastSessionID() uint64 { return m.sess.lastID }

// LastDelaySeq is the highest lock-delay sequence number ever issued.
func (m *Machine) LastDelaySeq() uint64 { return m.sess.lastSeq }

// SessionState returns a copy of the session state (sorted). It costs
// O(sessions + delays).
func (m *Machine) SessionState() SessionState { return m.sess.state() }

// LoadSessions replaces the session state with ss, as read back from
// storage, after Load and LoadControl: it is checked against the locks
// and the cluster version already loaded. On error the machine is
// unchanged.
func (m *Machine) LoadSessions(ss SessionState) error {
	perSession := make(map[uint64]int, len(m.sess.locksOf))
	for id, keys := range m.sess.locksOf {
		perSession[id] = len(keys)
	}
	withFields := 0
	m.ForEachLock(func(l Lock) {
		if l.SessionID != 0 || l.LockDelayMS != 0 {
			withFields++
		}
	})
	held := func(key string) bool { _, ok := m.Get(key); return ok }
	if err := validateSessions(&ss, perSession, withFields, held, m.ClusterVersion()); err != nil {
		return err
	}
	m.sess.load(ss)
	return nil
}

// validateSessions checks a session state against the rest of the state:
// nothing before cluster version 4 (no session, delay, counter, nor lock
// with a session or lock-delay: lockFields counts those); sessions in
// ascending ID, valid, not above the counter; delayed keys in ascending
// order, valid, not held, with unique sequence numbers not above theirs;
// every session lock's session open (perSession: locks per session id)
// and within MaxLocksPerSession; the bounds.
func validateSessions(ss *SessionState, perSession map[uint64]int, lockFields int, held func(string) bool, clusterVersion uint64) error {
	if clusterVersion < 4 {
		if ss.LastSessionID != 0 || ss.LastDelaySeq != 0 || len(ss.Sessions) != 0 || len(ss.Delays) != 0 || lockFields != 0 {
			return malformedf("sessions or lock-delays before cluster version 4")
		}
		return nil
	}
	if len(ss.Sessions) > MaxSessions || len(ss.Delays) > MaxDelayedKeys {
		return malformedf("%d sessions and %d delayed keys, the limits are %d and %d", len(ss.Sessions), len(ss.Delays), MaxSessions, MaxDelayedKeys)
	}
	open := make(map[uint64]struct{}, len(ss.Sessions))
	for i := range ss.Sessions {
		x := &ss.Sessions[i]
		if err := validateSession(x); err != nil {
			return err
		}
		switch {
		case x.ID > ss.LastSessionID:
			return malformedf("session %d above the last session id %d", x.ID, ss.LastSessionID)
		case i > 0 && x.ID <= ss.Sessions[i-1].ID:
			return malformedf("sessions not strictly ascending at %d", x.ID)
		}
		open[x.ID] = struct{}{}
	}
	// In id order, so the error names the same session on every replica
	// and every run (map order must not leak, even into an error).
	for _, id := range slices.Sorted(maps.Keys(perSession)) {
		n := perSession[id]
		if _, ok := open[id]; !ok {
			return malformedf("%d locks of session %d, which is not open", n, id)
		}
		if n > MaxLocksPerSession {
			return malformedf("session %d holds %d locks, the limit is %d", id, n, MaxLocksPerSession)
		}
	}
	seqs := make(map[uint64]struct{}, len(ss.Delays))
	for i := range ss.Delays {
		d := &ss.Delays[i]
		if err := validateDelay(d); err != nil {
			return err
		}
		_, dup := seqs[d.Seq]
		switch {
		case d.Seq > ss.LastDelaySeq || dup:
			return malformedf("delay of %q has sequence number %d (last %d, or twice)", d.Key, d.Seq, ss.LastDelaySeq)
		case i > 0 && d.Key <= ss.Delays[i-1].Key:
			return malformedf("delayed keys not strictly ascending at %q", d.Key)
		case held(d.Key):
			return malformedf("key %q is both held and delayed", d.Key)
		}
		seqs[d.Seq] = struct{}{}
	}
	return nil
}

func validateSession(x *Session) error {
	if x.ID == 0 || x.Epoch == 0 {
		return malformedf("session with id %d, epoch %d", x.ID, x.Epoch)
	}
	if err := ValidateIdentity(x.Identity); err != nil {
		return err
	}
	if err := ValidateSessionTTLMS(x.TTLMS); err != nil {
		return err
	}
	return ValidateLockDelayMS(x.LockDelayMS)
}

func validateDelay(d *Delay) error {
	if err := ValidateKey(d.Key); err != nil {
		return err
	}
	if d.DelayMS == 0 || d.Seq == 0 {
		return malformedf("delay of %q with delay %dms, sequence number %d", d.Key, d.DelayMS, d.Seq)
	}
	return ValidateLockDelayMS(d.DelayMS)
}

// ValidateSessionTTLMS checks a session TTL in milliseconds.
func ValidateSessionTTLMS(ms uint64) error {
	if ms < MinSessionTTLMS || ms > MaxSessionTTLMS {
		return invalidf("session TTL %dms is outside [%dms, %dms]", ms, MinSessionTTLMS, MaxSessionTTLMS)
	}
	return nil
}

// ValidateLockDelayMS checks a lock-delay in milliseconds (0: none).
func ValidateLockDelayMS(ms uint64) error {
	if ms > MaxLockDelayMS {
		return invalidf("lock delay %dms is above %dms", ms, MaxLockDelayMS)
	}
	return nil
}

func (k Kind) isSession() bool { return k >= KindOpenSession && k <= KindClearDelay }

// IsSession reports whether k is a session or lock-delay command
// (OpenSession, CloseSession, ExpireSession, RefreshSession, ClearDelay):
// one that does not name a single lock by Command.Key the way the lock
// commands do.
func (k Kind) IsSession() bool { return k.isSession() }

// validateSession checks a session or lock-delay command: the fields its
// kind carries are valid, every other one is zero.
func (c *Command) validateSession() error {
	var want Command // the command with only the fields of its kind kept
	want.Kind = c.Kind
	switch c.Kind {
	case KindOpenSession:
		want.Identity, want.TTLMS, want.LockDelayMS = c.Identity, c.TTLMS, c.LockDelayMS
		if err := ValidateIdentity(c.Identity); err != nil {
			return err
		}
		if err := ValidateSessionTTLMS(c.TTLMS); err != nil {
			return err
		}
		if err := ValidateLockDelayMS(c.LockDelayMS); err != nil {
			return err
		}
	case KindCloseSession:
		want.SessionID, want.Identity = c.SessionID, c.Identity
		if err := ValidateIdentity(c.Identity); err != nil {
			return err
		}
	case KindExpireSession:
		want.SessionID, want.Epoch = c.SessionID, c.Epoch
		if c.Epoch == 0 {
			return invalidf("expire_session needs an epoch")
		}
	case KindRefreshSession:
		want.SessionID = c.SessionID
	case KindClearDelay:
		want.Key, want.DelaySeq = c.Key, c.DelaySeq
		if err := ValidateKey(c.Key); err != nil {
			return err
		}
		if c.DelaySeq == 0 {
			return invalidf("clear_delay needs a sequence number")
		}
	}
	if c.Kind != KindOpenSession && c.Kind != KindClearDelay && c.SessionID == 0 {
		return invalidf("%s needs a session id", c.Kind)
	}
	if *c != want {
		return invalidf("%s carries a field it does not have", c.Kind)
	}
	return nil
}

// OpenSession builds an OpenSession command for identity (empty:
// anonymous).
func OpenSession(identity string, ttlMS, lockDelayMS uint64) Command {
	return Command{Kind: KindOpenSession, Identity: identity, TTLMS: ttlMS, LockDelayMS: lockDelayMS}
}

// CloseSession builds a CloseSession command; identity is who closes it.
func CloseSession(id uint64, identity string) Command {
	return Command{Kind: KindCloseSession, SessionID: id, Identity: identity}
}

// ExpireSession builds an ExpireSession command for session id at epoch.
func ExpireSession(id, epoch uint64) Command {
	return Command{Kind: KindExpireSession, SessionID: id, Epoch: epoch}
}

// RefreshSession builds a RefreshSession command (a logged keepalive).
func RefreshSession(id uint64) Command {
	return Command{Kind: KindRefreshSession, SessionID: id}
}

// ClearDelay builds a ClearDelay command for the delay seq of key.
func ClearDelay(key string, seq uint64) Command {
	return Command{Kind: KindClearDelay, Key: key, DelaySeq: seq}
}
