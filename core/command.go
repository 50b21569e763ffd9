package core

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Kind identifies a replicated command. Values are part of the log encoding
// and must never change.
type Kind uint8

// Command kinds (SPEC §2).
const (
	KindGrant   Kind = 1
	KindRelease Kind = 2
	KindExpire  Kind = 3
	// KindControl carries a ControlRequest (SPEC §2 Control): bootstrap,
	// join credentials, admission, promotion, replacement and retirement.
	// See control.go.
	KindControl Kind = 4
	// KindRenew extends a held lock's lease when its token matches. It is
	// a cluster version 2 command (see ClusterVersion).
	KindRenew Kind = 5

	// Session and lock-delay commands (cluster version 4, sessions.go).
	//
	// KindOpenSession opens a session: Identity, TTLMS, LockDelayMS.
	KindOpenSession Kind = 6
	// KindCloseSession closes a session and releases every lock of it:
	// SessionID, Identity (who closes it; information).
	KindCloseSession Kind = 7
	// KindExpireSession is the leader's condition-checked expiry of a
	// session: SessionID, Epoch.
	KindExpireSession Kind = 8
	// KindRefreshSession is a logged keepalive, which changes the
	// session's epoch: SessionID. See sessions.go for when the leader
	// logs one.
	KindRefreshSession Kind = 9
	// KindClearDelay ends the lock-delay of a key when its sequence
	// number matches: Key, DelaySeq.
	KindClearDelay Kind = 10

	// KindSettle settles an acquire its client gave up on (cluster
	// version 6, requests.go): Key, Identity, RequestID and GrantedAtMS
	// (the leader's wall clock, which advances the data clock like a
	// Grant's). A held grant of the request is released, and a request
	// with no record gets a tombstone, so that no later attempt of it is
	// granted.
	KindSettle Kind = 11
)

func (k Kind) String() string {
	switch k {
	case KindGrant:
		return "grant"
	case KindRelease:
		return "release"
	case KindExpire:
		return "expire"
	case KindControl:
		return "control"
	case KindRenew:
		return "renew"
	case KindOpenSession:
		return "open_session"
	case KindCloseSession:
		return "close_session"
	case KindExpireSession:
		return "expire_session"
	case KindRefreshSession:
		return "refresh_session"
	case KindClearDelay:
		return "clear_delay"
	case KindSettle:
		return "settle"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Command is one replicated command. Which fields are meaningful depends
// on Kind; every other field must be zero:
//
//	Grant:          Key, LeaseMS, Owner, GrantedAtMS, Identity (cluster version 2),
//	                RequestID (cluster version 3), and from cluster version 4
//	                either SessionID (then LeaseMS is 0) or LockDelayMS
//	Release:        Key, Token
//	Expire:         Key, Token
//	Renew:          Key, Token, LeaseMS (0: keep the lock's lease)
//	Control:        Control
//	OpenSession:    Identity, TTLMS, LockDelayMS (cluster version 4, as are the rest)
//	CloseSession:   SessionID, Identity
//	ExpireSession:  SessionID, Epoch
//	RefreshSession: SessionID
//	ClearDelay:     Key, DelaySeq
//	Settle:         Key, Identity, RequestID, GrantedAtMS (cluster version 6)
//
// and a Grant may carry Limit or Mode from cluster version 5 (kinds.go).
//
// A Grant never carries a token: Apply assigns it. Owner is a correlation
// id chosen by the client; Identity is who the transport authenticated
// (the NATS account and user), recorded for per-identity accounting. Both
// are information, never authority over a lock: only the token is.
// RequestID is the client's id for this acquire (empty: none), which makes
// a retry of it safe (requests.go); it is scoped to Identity. It is not
// Entry.RequestID, the proposing node's id for matching a result to its
// caller. A Grant with a SessionID binds the lock to that session: it has
// no lease of its own and ends when released or when its session ends
// (sessions.go). LockDelayMS on a plain Grant is how long the key stays
// unavailable after the lock is freed because its holder failed (an
// Expire); a session lock takes its session's. Command is comparable, so
// a decoded command can be checked against the proposed one with ==.
type Command struct {
	Kind        Kind
	Key         string
	Owner       string
	Identity    string
	RequestID   string
	LeaseMS     uint64
	GrantedAtMS uint64
	Token       uint64
	SessionID   uint64
	LockDelayMS uint64
	TTLMS       uint64
	Epoch       uint64
	DelaySeq    uint64
	// Limit and Mode say which kind of lock a Grant asks for (cluster
	// version 5, kinds.go): Limit 0 is a mutex (1 is written 0: one
	// encoding per command), 2..MaxSemaphoreLimit a counting semaphore;
	// Mode ModeShared a shared hold of a read/write lock (Limit 0).
	Limit   uint32
	Mode    Mode
	Control ControlRequest
}

// Grant builds a Grant command.
func Grant(key, owner string, leaseMS, grantedAtMS uint64) Command {
	return Command{Kind: KindGrant, Key: key, Owner: owner, LeaseMS: leaseMS, GrantedAtMS: grantedAtMS}
}

// WithRequest returns the Grant c made by identity with request id
// requestID (cluster version 3 when requestID is not empty).
func (c Command) WithRequest(identity, requestID string) Command {
	c.Identity, c.RequestID = identity, requestID
	return c
}

// Settle builds a Settle command: the request id requestID of identity,
// made for key, is settled at the leader's wall clock nowMS (cluster
// version 6).
func Settle(key, identity, requestID string, nowMS uint64) Command {
	return Command{Kind: KindSettle, Key: key, Identity: identity, RequestID: requestID, GrantedAtMS: nowMS}
}

// InSession returns the Grant c bound to session id instead of a lease
// (cluster version 4): LeaseMS is cleared.
func (c Command) InSession(id uint64) Command {
	c.SessionID, c.LeaseMS = id, 0
	return c
}

// WithLockDelay returns the Grant c with a lock-delay of delayMS (cluster
// version 4 when not 0).
func (c Command) WithLockDelay(delayMS uint64) Command {
	c.LockDelayMS = delayMS
	return c
}

// WithKind returns the Grant c for a semaphore of limit (0 and 1: a
// mutex, written 0) or, with mode ModeShared, a shared hold of a
// read/write lock (cluster version 5 when limit > 1 or mode is shared).
// A semaphore has no shared mode: Validate refuses limit > 1 with
// ModeShared.
func (c Command) WithKind(limit uint32, mode Mode) Command {
	if limit == 1 {
		limit = 0
	}
	c.Limit, c.Mode = limit, mode
	return c
}

// Renew builds a Renew command; leaseMS 0 keeps the lock's lease.
func Renew(key string, token, leaseMS uint64) Command {
	return Command{Kind: KindRenew, Key: key, Token: token, LeaseMS: leaseMS}
}

// Release builds a Release command.
func Release(key string, token uint64) Command {
	return Command{Kind: KindRelease, Key: key, Token: token}
}

// Expire builds an Expire command.
func Expire(key string, token uint64) Command {
	return Command{Kind: KindExpire, Key: key, Token: token}
}

// Validate checks a command against the limits in limits.go. Transports
// call it before proposing; the entry decoder calls it on every entry.
func (c Command) Validate() error { return c.validate() }

// validate is Validate without copying the command (Apply's hot path).
func (c *Command) validate() error {
	if c.Kind == KindControl {
		if c.Key != "" || c.Owner != "" || c.Identity != "" || c.RequestID != "" || c.LeaseMS != 0 || c.GrantedAtMS != 0 || c.Token != 0 ||
			c.SessionID|c.LockDelayMS|c.TTLMS|c.Epoch|c.DelaySeq != 0 || c.Limit != 0 || c.Mode != 0 {
			return invalidf("control carries only a control request")
		}
		return c.Control.Validate()
	}
	if c.Kind.isSession() {
		return c.validateSession()
	}
	if c.RequestID != "" && c.Kind != KindGrant && c.Kind != KindSettle {
		return invalidf("%s must not carry a request id", c.Kind)
	}
	if (c.SessionID != 0 || c.LockDelayMS != 0) && c.Kind != KindGrant {
		return invalidf("%s must not carry a session or a lock delay", c.Kind)
	}
	if c.TTLMS|c.Epoch|c.DelaySeq != 0 {
		return invalidf("%s must not carry a session TTL, epoch or delay sequence", c.Kind)
	}
	if (c.Limit != 0 || c.Mode != 0) && c.Kind != KindGrant {
		return invalidf("%s must not carry a limit or a mode", c.Kind)
	}
	if err := ValidateKey(c.Key); err != nil {
		return err
	}
	if !c.Control.isZero() {
		return invalidf("%s must not carry a control request", c.Kind)
	}
	switch c.Kind {
	case KindGrant:
		if err := validateHold(c.LeaseMS, c.SessionID, c.LockDelayMS); err != nil {
			return err
		}
		if err := ValidateOwner(c.Owner); err != nil {
			return err
		}
		if err := ValidateIdentity(c.Identity); err != nil {
			return err
		}
		if err := ValidateRequestID(c.RequestID); err != nil {
			return err
		}
		if c.Token != 0 {
			return invalidf("grant must not carry a token")
		}
		if err := ValidateKind(c.Limit, c.Mode); err != nil {
			return err
		}
	case KindSettle:
		if c.RequestID == "" {
			return invalidf("settle needs a request id")
		}
		if err := ValidateIdentity(c.Identity); err != nil {
			return err
		}
		if err := ValidateRequestID(c.RequestID); err != nil {
			return err
		}
		if c.Token != 0 || c.Owner != "" || c.LeaseMS != 0 || c.SessionID != 0 || c.LockDelayMS != 0 || c.Limit != 0 || c.Mode != 0 {
			return invalidf("settle carries only key, identity, request id and time")
		}
	case KindRelease, KindExpire:
		if c.Token == 0 {
			return invalidf("%s needs a token", c.Kind)
		}
		if c.Owner != "" || c.Identity != "" || c.LeaseMS != 0 || c.GrantedAtMS != 0 {
			return invalidf("%s carries only key and token", c.Kind)
		}
	case KindRenew:
		if c.Token == 0 {
			return invalidf("renew needs a token")
		}
		if c.LeaseMS != 0 {
			if err := ValidateLeaseMS(c.LeaseMS); err != nil {
				return err
			}
		}
		if c.Owner != "" || c.Identity != "" || c.GrantedAtMS != 0 {
			return invalidf("renew carries only key, token and lease")
		}
	default:
		return invalidf("unknown command kind %d", uint8(c.Kind))
	}
	return nil
}

// ValidateKey checks a lock key: 1..MaxKeyLen bytes of valid UTF-8 with no
// NUL (keys appear in JSON replies and in storage keys).
func ValidateKey(key string) error {
	switch {
	case key == "":
		return invalidf("key is empty")
	case len(key) > MaxKeyLen:
		return invalidf("key is %d bytes, the limit is %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return invalidf("key is not valid UTF-8")
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return invalidf("key contains NUL")
		}
	}
	return nil
}

// validKeyBytes is ValidateKey for a key still in its encoded bytes.
func validKeyBytes(key []byte) bool {
	return len(key) > 0 && len(key) <= MaxKeyLen && utf8.Valid(key) && bytes.IndexByte(key, 0) < 0
}

// validIdentityBytes is ValidateIdentity for encoded bytes.
func validIdentityBytes(id []byte) bool {
	return len(id) <= MaxIdentityLen && utf8.Valid(id) && bytes.IndexByte(id, 0) < 0
}

// ValidateOwner checks an owner correlation id: at most MaxOwnerLen bytes
// of valid UTF-8. An empty owner is allowed.
func ValidateOwner(owner string) error {
	switch {
	case len(owner) > MaxOwnerLen:
		return invalidf("owner is %d bytes, the limit is %d", len(owner), MaxOwnerLen)
	case !utf8.ValidString(owner):
		return invalidf("owner is not valid UTF-8")
	}
	return nil
}

// ValidateIdentity checks an authenticated identity: at most
// MaxIdentityLen bytes of valid UTF-8 with no NUL. Empty means anonymous.
func ValidateIdentity(id string) error {
	switch {
	case len(id) > MaxIdentityLen:
		return invalidf("identity is %d bytes, the limit is %d", len(id), MaxIdentityLen)
	case !utf8.ValidString(id):
		return invalidf("identity is not valid UTF-8")
	case strings.IndexByte(id, 0) >= 0:
		return invalidf("identity contains NUL")
	}
	return nil
}

// ValidateRequestID checks a client request id: at most MaxRequestIDLen
// bytes of valid UTF-8 with no NUL. Empty means none.
func ValidateRequestID(id string) error {
	switch {
	case len(id) > MaxRequestIDLen:
		return invalidf("request id is %d bytes, the limit is %d", len(id), MaxRequestIDLen)
	case !utf8.ValidString(id):
		return invalidf("request id is not valid UTF-8")
	case strings.IndexByte(id, 0) >= 0:
		return invalidf("request id contains NUL")
	}
	return nil
}

// validRequestIDBytes is ValidateRequestID for encoded bytes.
func validRequestIDBytes(id []byte) bool {
	return len(id) <= MaxRequestIDLen && utf8.Valid(id) && bytes.IndexByte(id, 0) < 0
}

// ValidateLeaseMS checks a lease length in milliseconds.
func ValidateLeaseMS(ms uint64) error {
	if ms < MinLeaseMS || ms > MaxLeaseMS {
		return invalidf("lease %dms is outside [%dms, %dms]", ms, MinLeaseMS, MaxLeaseMS)
	}
	return nil
}

// validateHold checks how a lock is held: a valid lease and a lock delay
// within MaxLockDelayMS, or a session (id not 0) with neither (a session
// lock ends with its session and takes its session's lock delay).
func validateHold(leaseMS, sessionID, lockDelayMS uint64) error {
	if sessionID != 0 {
		if leaseMS != 0 || lockDelayMS != 0 {
			return invalidf("a session lock has no lease or lock delay of its own")
		}
		return nil
	}
	if err := ValidateLeaseMS(leaseMS); err != nil {
		return err
	}
	return ValidateLockDelayMS(lockDelayMS)
}

// ResultKind identifies an apply result (SPEC §3).
type ResultKind uint8

// Result kinds. Values are stable: they are reported to clients and plugins.
const (
	ResultNoop          ResultKind = 0
	ResultGranted       ResultKind = 1
	ResultGrantRejected ResultKind = 2
	ResultReleased      ResultKind = 3
	ResultNotFound      ResultKind = 4
	ResultExpired       ResultKind = 5

	// Control results (SPEC §3).
	ResultBootstrapRecorded   ResultKind = 6
	ResultReplacementPrepared ResultKind = 7
	ResultAdmissionAccepted   ResultKind = 8
	ResultControlApplied      ResultKind = 9
	ResultControlRejected     ResultKind = 10

	// ResultRenewed: a Renew found its token; the lease is extended.
	ResultRenewed ResultKind = 11

	// Results of a Grant with a request id (cluster version 3,
	// requests.go); none of them changes the lock table.
	//
	// ResultGrantRepeated: the request id names the lock held on this
	// key: the earlier grant of the same request, whose token it gives.
	ResultGrantRepeated ResultKind = 12
	// ResultGrantEnded: the request id names a grant of this key that has
	// since ended (released or expired); Token is the one it had.
	ResultGrantEnded ResultKind = 13
	// ResultRequestMismatch: the request id names a grant (held or ended)
	// of another key; Token is that grant's.
	ResultRequestMismatch ResultKind = 14
	// ResultRequestsExhausted: the request records are at
	// MaxRequestRecords and none can be forgotten yet.
	ResultRequestsExhausted ResultKind = 15

	// Results of the session and lock-delay commands and of a Grant that
	// meets a session or a delay (cluster version 4, sessions.go). Only
	// the first four and ResultDelayCleared change the state.
	//
	// ResultSessionOpened: Session is the new session's ID, Epoch its
	// first epoch (1).
	ResultSessionOpened ResultKind = 16
	// ResultSessionRefreshed: a RefreshSession changed the session's
	// epoch to Epoch.
	ResultSessionRefreshed ResultKind = 17
	// ResultSessionClosed: the session is closed and Count locks of it
	// were released.
	ResultSessionClosed ResultKind = 18
	// ResultSessionExpired: Existed tells whether the session was expired
	// (it existed with the epoch named); Count locks of it were freed.
	ResultSessionExpired ResultKind = 19
	// ResultSessionNotFound: the session named (by a CloseSession,
	// RefreshSession or a Grant) does not exist: never opened, closed or
	// expired.
	ResultSessionNotFound ResultKind = 20
	// ResultSessionsExhausted: MaxSessions sessions are open.
	ResultSessionsExhausted ResultKind = 21
	// ResultSessionLocksExhausted: the Grant's session holds
	// MaxLocksPerSession locks.
	ResultSessionLocksExhausted ResultKind = 22
	// ResultDelayed: the Grant's key is in its lock-delay. Core has no
	// clock: the leader knows how long is left.
	ResultDelayed ResultKind = 23
	// ResultDelayCleared: a ClearDelay ended the key's lock-delay.
	ResultDelayCleared ResultKind = 24
	// ResultDelaysExhausted: an Expire or ExpireSession would take the
	// delayed keys past MaxDelayedKeys; nothing changed (the lock stays
	// held, so its key stays unavailable, and the leader tries again once
	// a delay has ended).
	ResultDelaysExhausted ResultKind = 25

	// Results of a Grant that meets a key of another kind or a full
	// shared key (cluster version 5, kinds.go); neither changes anything.
	//
	// ResultLimitMismatch: the key is held (or its slots delayed) as
	// another kind: Limit is the key's current limit (1 for a mutex or a
	// read/write lock), what the wire names in its invalid_argument.
	ResultLimitMismatch ResultKind = 26
	// ResultHoldersExhausted: the key has MaxHoldersPerKey shared holders
	// and delayed shared slots.
	ResultHoldersExhausted ResultKind = 27

	// Results of a Settle (cluster version 6, requests.go). A Settle may
	// also yield ResultReleased with the released grant's Token (the
	// request held a lock of its key, now released), ResultGrantEnded
	// (its grant ended before; nothing changes), ResultRequestMismatch
	// (a grant of another key; nothing changes) or
	// ResultRequestsExhausted (no room for the tombstone; nothing
	// changes).
	//
	// ResultSettled: the request had no record; a tombstone (an ended
	// record with token 0) now says it was never granted, so a later
	// Grant of it yields ResultGrantEnded with token 0.
	ResultSettled ResultKind = 28
)

func (r ResultKind) String() string {
	switch r {
	case ResultNoop:
		return "noop"
	case ResultGranted:
		return "granted"
	case ResultGrantRejected:
		return "grant_rejected"
	case ResultReleased:
		return "released"
	case ResultNotFound:
		return "not_found"
	case ResultExpired:
		return "expired"
	case ResultBootstrapRecorded:
		return "bootstrap_recorded"
	case ResultReplacementPrepared:
		return "replacement_prepared"
	case ResultAdmissionAccepted:
		return "admission_accepted"
	case ResultControlApplied:
		return "control_applied"
	case ResultControlRejected:
		return "control_rejected"
	case ResultRenewed:
		return "renewed"
	case ResultSettled:
		return "settled"
	case ResultGrantRepeated:
		return "grant_repeated"
	case ResultGrantEnded:
		return "grant_ended"
	case ResultRequestMismatch:
		return "request_mismatch"
	case ResultRequestsExhausted:
		return "requests_exhausted"
	case ResultSessionOpened:
		return "session_opened"
	case ResultSessionRefreshed:
		return "session_refreshed"
	case ResultSessionClosed:
		return "session_closed"
	case ResultSessionExpired:
		return "session_expired"
	case ResultSessionNotFound:
		return "session_not_found"
	case ResultSessionsExhausted:
		return "sessions_exhausted"
	case ResultSessionLocksExhausted:
		return "session_locks_exhausted"
	case ResultDelayed:
		return "delayed"
	case ResultDelayCleared:
		return "delay_cleared"
	case ResultDelaysExhausted:
		return "delays_exhausted"
	case ResultLimitMismatch:
		return "limit_mismatch"
	case ResultHoldersExhausted:
		return "holders_exhausted"
	}
	return fmt.Sprintf("result(%d)", uint8(r))
}

// Result is what applying one command produced. It is comparable.
//
//	Granted:             Token is the fencing token issued.
//	Renewed:             Token is the renewed lock's token.
//	GrantRejected:       Token is the token the key is held with.
//	GrantRepeated:       Token is the token the request was granted (held).
//	GrantEnded:          Token is the token the request was granted (ended).
//	RequestMismatch:     Token is the token of the request's grant of
//	                     another key.
//	Expired:             Existed tells whether a lock was removed.
//	BootstrapRecorded:   NodeID, Incarnation of the first voter.
//	AdmissionAccepted:   NodeID, Incarnation issued to the new learner.
//	ReplacementPrepared: NodeID, Incarnation issued to the replacement learner.
//	ControlApplied:      NodeID, Incarnation of the node the transition was
//	                     about (the promoted, retired or new replacement
//	                     node); zero for MintJoin.
//	ControlRejected:     Reason says which invariant did not hold.
//	SessionOpened:       Session, Epoch of the new session.
//	SessionRefreshed:    Session, Epoch it has now.
//	SessionClosed:       Session; Count locks released.
//	SessionExpired:      Session; Existed whether it was expired; Count
//	                     locks freed.
//	LimitMismatch:       Limit is the key's current limit (1: mutex or
//	                     read/write), Token its oldest holder's (0 when
//	                     only delayed slots hold it).
//
// GrantRejected of a key with several holders gives the oldest holder's
// token.
type Result struct {
	Kind        ResultKind
	Token       uint64
	Existed     bool
	NodeID      uint64
	Incarnation uint64
	Reason      ControlReason
	Session     uint64
	Epoch       uint64
	Count       uint64
	Limit       uint32
}

func (r Result) String() string {
	switch r.Kind {
	case ResultGranted, ResultGrantRejected, ResultRenewed, ResultGrantRepeated, ResultGrantEnded, ResultRequestMismatch:
		return fmt.Sprintf("%s{token:%d}", r.Kind, r.Token)
	case ResultExpired:
		return fmt.Sprintf("expired{existed:%t}", r.Existed)
	case ResultLimitMismatch:
		return fmt.Sprintf("limit_mismatch{limit:%d,token:%d}", r.Limit, r.Token)
	case ResultBootstrapRecorded, ResultReplacementPrepared, ResultAdmissionAccepted, ResultControlApplied:
		return fmt.Sprintf("%s{node:%d,incarnation:%d}", r.Kind, r.NodeID, r.Incarnation)
	case ResultControlRejected:
		return fmt.Sprintf("control_rejected{reason:%s}", r.Reason)
	case ResultSessionOpened, ResultSessionRefreshed:
		return fmt.Sprintf("%s{session:%d,epoch:%d}", r.Kind, r.Session, r.Epoch)
	case ResultSessionClosed:
		return fmt.Sprintf("session_closed{session:%d,count:%d}", r.Session, r.Count)
	case ResultSessionExpired:
		return fmt.Sprintf("session_expired{session:%d,existed:%t,count:%d}", r.Session, r.Existed, r.Count)
	}
	return r.Kind.String()
}
