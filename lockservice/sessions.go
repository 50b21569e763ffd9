package lockservice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Sessions (cluster version 4): one liveness for many locks. The
// replicated state (core/sessions.go) holds the sessions, their locks and
// the lock-delays; the leader times them (sesstimers.go) and proposes
// OpenSession, CloseSession, ExpireSession, RefreshSession and ClearDelay.
//
// Who may use a session: only the identity that opened it keeps it alive,
// closes it or acquires in it (ErrPermissionDenied otherwise; anonymous
// callers share one identity, as they share their locks' quota); an
// acquire in a session still passes the access list as every acquire.
// With an access list, opening a session needs acquire somewhere: an
// identity that may lock nothing has no use for one. Closing a session
// releases its locks like the session ending would, without the access
// list's release rule: they are the opener's own locks.
//
// Bounds: Limits.MaxSessions (at most core.MaxSessions, which Apply
// enforces), Limits.MaxSessionsPerIdentity (0: none), and
// Limits.MaxLocksPerSession locks in one session (at most
// core.MaxLocksPerSession, which Apply enforces); each refusal is a
// *LimitError with its own resource name. The lock count is checked
// before proposing without counting Grants in flight: Apply is the hard
// cap.

// Resources of the session bounds (LimitError.Resource).
const (
	ResourceSessions         = "sessions"          // MaxSessions sessions are open
	ResourceIdentitySessions = "identity_sessions" // the caller's identity has MaxSessionsPerIdentity open
	ResourceSessionLocks     = "session_locks"     // the session holds core.MaxLocksPerSession locks
)

// ErrSessionNotFound: the session named does not exist (never opened,
// closed, or expired). It matches ErrNotFound, whose code it is on the
// wire.
var ErrSessionNotFound error = sessionNotFoundError{}

type sessionNotFoundError struct{}

func (sessionNotFoundError) Error() string { return "lockservice: no such session" }

// Is makes errors.Is(err, ErrNotFound) hold.
func (sessionNotFoundError) Is(target error) bool { return target == ErrNotFound }

// SessionInfo is an open session as the leader knows it.
type SessionInfo struct {
	ID        uint64
	TTL       time.Duration
	LockDelay time.Duration
}

// sessionsVersion is the cluster version sessions and lock-delays need.
const sessionsVersion = 4

// keepAliveReadHold is how long a keepalive's ReadIndex round may wait for
// other keepalives to share it (see KeepAlive). It is a fiftieth of the
// shortest TTL (core.MinSessionTTL) and a fifth of the SDK's smallest
// default safety margin for it, so it costs a client nothing it would
// notice; at 500 keepalives a second it makes about ten share a round.
const keepAliveReadHold = 20 * time.Millisecond

// needSessions refuses a session request below cluster version 4 (a
// member runs an older binary that could not apply its command).
func (s *Service) needSessions(what string) error {
	if have := s.node.ClusterVersion(); have < sessionsVersion {
		return fmt.Errorf("%w: %s needs cluster version %d, the cluster runs version %d (a member runs an older binary, or the new leader has not raised it yet); retry once every member is upgraded",
			ErrUnsupported, what, sessionsVersion, have)
	}
	return nil
}

// OpenSession opens a session of the caller's identity with ttl and
// lockDelay (the lock-delay of each of its locks when it expires).
func (s *Service) OpenSession(ctx context.Context, ttl, lockDelay time.Duration) (SessionInfo, error) {
	identity := IdentityFrom(ctx)
	cmd := core.OpenSession(identity, uint64(ttl/time.Millisecond), uint64(lockDelay/time.Millisecond))
	if ttl%time.Millisecond != 0 || lockDelay%time.Millisecond != 0 {
		return SessionInfo{}, &core.Error{Code: core.CodeInvalidArgument, Detail: "session TTL and lock delay are whole milliseconds"}
	}
	if err := cmd.Validate(); err != nil {
		return SessionInfo{}, err
	}
	if s.cfg.ACL != nil && !nodeAuthority(ctx) && !s.cfg.ACL.allowsSome(identity, OpAcquire) {
		s.cfg.Metrics.PermissionDenied.WithLabelValues(string(OpAcquire)).Inc()
		return SessionInfo{}, &PermissionError{Identity: identity, Op: "open a session: it may acquire no key, not even", Key: ""}
	}
	if !s.IsLeader() {
		return SessionInfo{}, s.notLeader()
	}
	if err := s.needSessions("a session"); err != nil {
		return SessionInfo{}, err
	}
	epoch, err := s.admitSession(identity)
	if err != nil {
		return SessionInfo{}, err
	}
	defer s.openDone(identity, epoch)
	a, err := s.propose(ctx, cmd)
	if err != nil {
		return SessionInfo{}, err
	}
	switch a.Result.Kind {
	case core.ResultSessionOpened:
		return SessionInfo{ID: a.Result.Session, TTL: ttl, LockDelay: lockDelay}, nil
	case core.ResultSessionsExhausted:
		return SessionInfo{}, s.refuse(&LimitError{Resource: ResourceSessions, Limit: core.MaxSessions})
	}
	return SessionInfo{}, fmt.Errorf("lockservice: open session applied as %v", a.Result)
}

// admitSession counts an OpenSession of identity in flight if the bounds
// allow one more session; it returns the leadership epoch it counted in.
func (s *Service) admitSession(identity string) (uint64, error) {
	var open, mine int
	s.node.View(func(m *core.Machine) { open, mine = m.SessionCount(), m.SessionsOf(identity) })
	lim := &s.cfg.Limits
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if !s.lead.ready {
		return 0, s.notLeader()
	}
	st := s.lead.sess
	if open+st.opening >= lim.MaxSessions {
		return 0, s.refuse(&LimitError{Resource: ResourceSessions, Limit: lim.MaxSessions})
	}
	if lim.MaxSessionsPerIdentity > 0 && mine+st.openingBy[identity] >= lim.MaxSessionsPerIdentity {
		return 0, s.refuse(&LimitError{Resource: ResourceIdentitySessions, Limit: lim.MaxSessionsPerIdentity, Identity: identity})
	}
	st.opening++
	st.openingBy[identity]++
	return s.lead.epoch, nil
}

// openDone undoes admitSession's count (the session, if opened, is in the
// machine now), unless a leadership change reset the counts meanwhile.
func (s *Service) openDone(identity string, epoch uint64) {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if s.lead.epoch != epoch {
		return
	}
	st := s.lead.sess
	st.opening--
	if n := st.openingBy[identity] - 1; n > 0 {
		st.openingBy[identity] = n
	} else {
		delete(st.openingBy, identity)
	}
}

// sessionOf reads session id from the applied state; when it is not
// there it confirms with a ReadIndex (a deposed leader's state may be
// stale) and reads again. It checks that the caller opened it.
func (s *Service) sessionOf(ctx context.Context, id uint64) (core.Session, error) {
	read := func() (x core.Session, ok bool) {
		s.node.View(func(m *core.Machine) { x, ok = m.Session(id) })
		return x, ok
	}
	x, ok := read()
	if !ok {
		if err := s.node.ReadIndex(ctx); err != nil {
			return core.Session{}, s.nodeErr(err)
		}
		if x, ok = read(); !ok {
			return core.Session{}, fmt.Errorf("%w: session %d (never opened, closed, or expired)", ErrSessionNotFound, id)
		}
	}
	if caller := IdentityFrom(ctx); x.Identity != caller && !nodeAuthority(ctx) {
		s.cfg.Metrics.PermissionDenied.WithLabelValues(string(OpAcquire)).Inc()
		return core.Session{}, &PermissionError{Identity: caller, Op: "use the session of another identity,", Key: fmt.Sprint(id)}
	}
	return x, nil
}

// KeepAlive restarts session id's TTL and returns it.
//
// It writes nothing to the log when it only refreshes: the leader's timer
// is what ends a session, so restarting it is enough, provided the three
// rules argued in core/sessions.go ("Why a keepalive is not logged, and
// why that is safe across leaders") hold. Here is where they are kept:
//
//  1. The ReadIndex below, taken after the keepalive arrived and before
//     it is acknowledged, confirms that this node still leads (raft's
//     read-index rounds are shared by the requests waiting for one): a
//     deposed leader cannot acknowledge a keepalive that the next leader,
//     whose timer started before the client sent it, would not honour.
//  2. OnLeaderReady arms every session with its full TTL, once every
//     entry of earlier terms applied (rearmSessions).
//  3. refresh refuses while this leader has an ExpireSession of the
//     session in flight (sessTimer.expiring): the keepalive is then
//     logged as RefreshSession, which changes the session's epoch so that
//     the log orders the two and the expiry, if second, changes nothing.
//
// The refresh happens under lead.mu after the ReadIndex, in the same
// critical section as the expiring check, so the timer cannot run out
// between the check and the refresh.
//
// The ReadIndex of rule 1 may start up to keepAliveReadHold after the
// keepalive arrived (raftstore ReadIndexWithin), so that the keepalives of
// many sessions share one round, one heartbeat broadcast, instead of
// nearly one round each. Rule 1 needs only that the round be issued after
// the keepalive arrived, which a later round still is; the hold only
// delays the acknowledgement, and the refresh below counts the TTL from
// after the round, so the leader's deadline is never earlier than the one
// the client counts from sending.
//
// A keepalive counts against its identity's share of the requests in
// progress (BeginRequest, fair.go) like any other request; it is not
// exempt. It is in progress for the hold and one or two rounds: 10,000
// sessions with a 10 s TTL send about 3,300 keepalives a second and keep
// about 70 in progress (about 21 ms each, measured by the sdk's
// TestSessionKeepAlivesWithinIdentityShare), under a tenth of one
// identity's share. Exempting
// it would leave a flood of keepalives unbounded but for the node's
// budget, which every identity shares.
func (s *Service) KeepAlive(ctx context.Context, id uint64) (time.Duration, error) {
	if id == 0 {
		return 0, &core.Error{Code: core.CodeInvalidArgument, Detail: "session id must be positive"}
	}
	if !s.IsLeader() {
		return 0, s.notLeader()
	}
	if err := s.needSessions("a session keepalive"); err != nil {
		return 0, err
	}
	if _, err := s.sessionOf(ctx, id); err != nil {
		return 0, err
	}
	if err := s.node.ReadIndexWithin(ctx, keepAliveReadHold); err != nil { // rule 1
		return 0, s.nodeErr(err)
	}
	s.lead.mu.Lock()
	if !s.lead.ready {
		s.lead.mu.Unlock()
		return 0, s.notLeader()
	}
	ttl, ok := s.lead.sess.refresh(id, s.cfg.Now())
	_, known := s.lead.sess.byID[id]
	s.lead.mu.Unlock()
	switch {
	case ok:
		return ttl, nil
	case !known:
		// Ended between the look and the ReadIndex: the timers mirror
		// the applied state, which the ReadIndex brought up to date.
		return 0, fmt.Errorf("%w: session %d (closed or expired)", ErrSessionNotFound, id)
	}
	return s.refreshLogged(ctx, id) // rule 3
}

// refreshLogged is a keepalive that meets an expiry in flight: it is
// proposed as RefreshSession, ordered with the expiry by the log.
func (s *Service) refreshLogged(ctx context.Context, id uint64) (time.Duration, error) {
	a, err := s.propose(ctx, core.RefreshSession(id))
	if err != nil {
		return 0, err
	}
	switch a.Result.Kind {
	case core.ResultSessionRefreshed:
		var x core.Session
		s.node.View(func(m *core.Machine) { x, _ = m.Session(id) })
		return time.Duration(x.TTLMS) * time.Millisecond, nil
	case core.ResultSessionNotFound:
		return 0, fmt.Errorf("%w: session %d expired before this keepalive", ErrSessionNotFound, id)
	}
	return 0, fmt.Errorf("lockservice: refresh session applied as %v", a.Result)
}

// CloseSession closes session id and releases every lock of it in one
// command; it returns how many it released.
func (s *Service) CloseSession(ctx context.Context, id uint64) (int, error) {
	identity := IdentityFrom(ctx)
	cmd := core.CloseSession(id, identity)
	if err := cmd.Validate(); err != nil {
		return 0, err
	}
	if !s.IsLeader() {
		return 0, s.notLeader()
	}
	if err := s.needSessions("closing a session"); err != nil {
		return 0, err
	}
	if _, err := s.sessionOf(ctx, id); err != nil {
		return 0, err
	}
	a, err := s.propose(ctx, cmd)
	if err != nil {
		return 0, err
	}
	switch a.Result.Kind {
	case core.ResultSessionClosed:
		return int(a.Result.Count), nil
	case core.ResultSessionNotFound:
		return 0, fmt.Errorf("%w: session %d (closed or expired)", ErrSessionNotFound, id)
	}
	return 0, fmt.Errorf("lockservice: close session applied as %v", a.Result)
}

// checkSessionAcquire is Acquire's session check, before anything is
// reserved: the session exists and is the caller's, and has room for one
// more lock (Apply enforces it too: ResultSessionLocksExhausted). It
// returns the session's TTL in milliseconds, what the policy is asked
// as the lease.
func (s *Service) checkSessionAcquire(ctx context.Context, id uint64) (uint64, error) {
	x, err := s.sessionOf(ctx, id)
	if err != nil {
		return 0, err
	}
	var n int
	s.node.View(func(m *core.Machine) { n = m.SessionLockCount(id) })
	if lim := s.cfg.Limits.MaxLocksPerSession; n >= lim {
		return 0, s.refuse(&LimitError{Resource: ResourceSessionLocks, Limit: lim})
	}
	return x.TTLMS, nil
}

// sessionGrantErr is the error of a Grant that applied as a session or
// lock-delay refusal; ok false for any other result.
func (s *Service) sessionGrantErr(p AcquireParams, r core.Result) (err error, ok bool) {
	switch r.Kind {
	case core.ResultDelayed:
		return s.delayedErr(p.Key), true
	case core.ResultSessionNotFound:
		return fmt.Errorf("%w: session %d ended before the grant applied", ErrSessionNotFound, p.Session), true
	case core.ResultSessionLocksExhausted:
		return s.refuse(&LimitError{Resource: ResourceSessionLocks, Limit: core.MaxLocksPerSession}), true
	}
	return nil, false
}

// sessionLeft is how long session id has left on this leader's timer
// (its TTL when the timer is not known).
func (s *Service) sessionLeft(id uint64, ttl time.Duration) time.Duration {
	s.lead.mu.Lock()
	defer s.lead.mu.Unlock()
	if t, ok := s.lead.sess.byID[id]; ok {
		return max(0, t.deadline.Sub(s.cfg.Now()))
	}
	return ttl
}

// errRenewSessionLock refuses a renew of a session lock: its session's
// keepalive keeps it.
var errRenewSessionLock = errors.New("a session lock has no lease of its own: its session's keepalive keeps it")

// acquireFeature names what makes an acquire need its cluster version.
func acquireFeature(cmd core.Command) string {
	switch {
	case cmd.Limit != 0:
		return "limit"
	case cmd.Mode != core.ModeExclusive:
		return "mode"
	case cmd.SessionID != 0:
		return "session"
	case cmd.LockDelayMS != 0:
		return "lock_delay_ms"
	}
	return "request_id"
}
