package protocol

import (
	"strconv"

	"github.com/ticketd/ticketd/core"
)

// Sessions and lock-delay (docs/protocol.md §11; cluster version 4,
// unsupported before). A session is one keepalive for many locks: an
// acquire with "session" instead of "lease_ms" holds its lock until it is
// released or the session ends (closed, or expired on the leader's clock
// for want of a keepalive). A lock freed because its holder failed (a
// lease or a session that expired; never a release or a close) is not
// granted again for its lock-delay: a try answers held with "delay_ms".
//
// In a partitioned deployment (docs/scaling.md) sessions are refused for
// now: a session lives in one group's state, and its locks would be in
// every group.

// Subjects of the session requests. They are served by the leader, as the
// lock requests are; their op names (micro endpoints, forward subjects)
// are SessionOpOpen, SessionOpKeepAlive and SessionOpClose.
const (
	SubjectSessionOpen      = SubjectPrefix + ".session.open"
	SubjectSessionKeepAlive = SubjectPrefix + ".session.keepalive"
	SubjectSessionClose     = SubjectPrefix + ".session.close"

	SessionOpOpen      = "session_open"
	SessionOpKeepAlive = "session_keepalive"
	SessionOpClose     = "session_close"
)

// SessionSubject is the subject of a session op.
func SessionSubject(op string) string {
	switch op {
	case SessionOpOpen:
		return SubjectSessionOpen
	case SessionOpKeepAlive:
		return SubjectSessionKeepAlive
	case SessionOpClose:
		return SubjectSessionClose
	}
	return ""
}

// Limits of sessions and lock-delays on the wire (core's).
const (
	MinSessionTTLMS = int64(core.MinSessionTTLMS)
	MaxSessionTTLMS = int64(core.MaxSessionTTLMS)
	MaxLockDelayMS  = int64(core.MaxLockDelayMS)
	// MaxSessionIDLen is the longest session ID: a uint64 in decimal.
	MaxSessionIDLen = 20
)

// SessionOpenRequest opens a session of the caller's identity.
type SessionOpenRequest struct {
	// TTLMS is how long the session lives without a keepalive
	// (MinSessionTTLMS..MaxSessionTTLMS).
	TTLMS int64 `json:"ttl_ms"`
	// LockDelayMS is the lock-delay of each of its locks when the session
	// expires (0..MaxLockDelayMS; 0: none).
	LockDelayMS int64 `json:"lock_delay_ms,omitempty"`
}

// SessionOpenReply is an opened session.
type SessionOpenReply struct {
	// Session is its ID: decimal digits, assigned when the open applied,
	// never reused.
	Session     string `json:"session"`
	TTLMS       int64  `json:"ttl_ms"`
	LockDelayMS int64  `json:"lock_delay_ms,omitempty"`
}

// SessionRequest names a session (keepalive, close).
type SessionRequest struct {
	Session string `json:"session"`
}

// SessionKeepAliveReply: the session lives TTLMS more from when the
// keepalive was sent.
type SessionKeepAliveReply struct {
	Session string `json:"session"`
	TTLMS   int64  `json:"ttl_ms"`
}

// SessionCloseReply: the session is closed and Released locks of it were
// released, in one command.
type SessionCloseReply struct {
	Session  string `json:"session"`
	Released int    `json:"released"`
}

// FormatSessionID is the wire form of a session ID.
func FormatSessionID(id uint64) string { return strconv.FormatUint(id, 10) }

// ParseSessionID reads a session ID: 1 to MaxSessionIDLen decimal digits
// without a leading zero, not 0, within uint64.
func ParseSessionID(s string) (uint64, error) {
	if len(s) == 0 || len(s) > MaxSessionIDLen || s[0] == '0' {
		return 0, Errorf(CodeInvalidArgument, "session must be a positive decimal session ID of at most %d digits", MaxSessionIDLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, Errorf(CodeInvalidArgument, "session must be a positive decimal session ID of at most %d digits", MaxSessionIDLen)
		}
	}
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, Errorf(CodeInvalidArgument, "session ID is out of range")
	}
	return id, nil
}

// Validate checks an open request.
func (r *SessionOpenRequest) Validate() error {
	if r.TTLMS < MinSessionTTLMS || r.TTLMS > MaxSessionTTLMS {
		return Errorf(CodeInvalidArgument, "ttl_ms %d is outside [%d, %d]", r.TTLMS, MinSessionTTLMS, MaxSessionTTLMS)
	}
	return validateLockDelay(r.LockDelayMS)
}

func validateLockDelay(ms int64) error {
	if ms < 0 || ms > MaxLockDelayMS {
		return Errorf(CodeInvalidArgument, "lock_delay_ms %d is outside [0, %d]", ms, MaxLockDelayMS)
	}
	return nil
}

// Validate checks a keepalive or close request and returns its session.
func (r *SessionRequest) Validate() (uint64, error) { return ParseSessionID(r.Session) }

// validateHold checks how an acquire holds its lock: a lease (lease_ms,
// with an optional lock_delay_ms), or a session (then neither: a session
// lock ends with its session and takes its lock-delay).
func (r *AcquireRequest) validateHold() error {
	if r.Session != "" {
		if r.LeaseMS != 0 || r.LockDelayMS != 0 {
			return Errorf(CodeInvalidArgument, "an acquire in a session carries no lease_ms or lock_delay_ms (the session's keepalive holds it, the session's lock_delay_ms applies)")
		}
		_, err := ParseSessionID(r.Session)
		return err
	}
	if r.LeaseMS <= 0 {
		return Errorf(CodeInvalidArgument, "lease_ms must be positive, got %d", r.LeaseMS)
	}
	if err := core.ValidateLeaseMS(uint64(r.LeaseMS)); err != nil {
		return fromCore(err)
	}
	return validateLockDelay(r.LockDelayMS)
}

// SessionID is the acquire's session (0: none); valid after Validate.
func (r *AcquireRequest) SessionID() uint64 {
	id, _ := ParseSessionID(r.Session)
	return id
}

func sessionOpenFields(r *SessionOpenRequest) []flatField {
	return []flatField{{name: "ttl_ms", i64: &r.TTLMS}, {name: "lock_delay_ms", i64: &r.LockDelayMS}}
}

func sessionFields(r *SessionRequest) []flatField {
	return []flatField{{name: "session", str: &r.Session}}
}

// DecodeSessionOpen decodes and validates an open request, strictly as
// every request (fast when it can, fastdecode.go).
func DecodeSessionOpen(data []byte) (SessionOpenRequest, error) {
	var r SessionOpenRequest
	if fields := sessionOpenFields(&r); !decodeFlat(data, fields) {
		r = SessionOpenRequest{}
		if err := decodeStrict(data, &r, sessionOpenFields(&r)); err != nil {
			return SessionOpenRequest{}, err
		}
	}
	return r, r.Validate()
}

// DecodeSession decodes and validates a keepalive or close request and
// returns its session ID.
func DecodeSession(data []byte) (SessionRequest, uint64, error) {
	var r SessionRequest
	if fields := sessionFields(&r); !decodeFlat(data, fields) {
		r = SessionRequest{}
		if err := decodeStrict(data, &r, sessionFields(&r)); err != nil {
			return SessionRequest{}, 0, err
		}
	}
	id, err := r.Validate()
	return r, id, err
}
