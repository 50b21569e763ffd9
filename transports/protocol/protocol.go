package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ticketd/ticketd/core"
)

// Subjects of the client service.
const (
	ServiceName    = "ticketd"
	ServiceVersion = "0.1.0"
	QueueGroup     = "ticketd"

	SubjectPrefix  = "ticketd.v1"
	SubjectAcquire = SubjectPrefix + ".lock.acquire"
	SubjectRelease = SubjectPrefix + ".lock.release"
	SubjectGet     = SubjectPrefix + ".lock.get"
	SubjectStatus  = SubjectPrefix + ".status"
	// SubjectAuditPrefix is where audit events are published, one subject
	// token per event type (plugins/audit publishes them).
	SubjectAuditPrefix = SubjectPrefix + ".audit"
)

// ForwardSubject is where a follower forwards a client request for op
// ("acquire", "release", "get") to the leader with the given raft id. The
// original reply subject is kept, so the leader answers the client
// directly; if the leader is gone NATS answers "no responders", which the
// client may safely retry.
func ForwardSubject(leader uint64, op string) string {
	return fmt.Sprintf("%s.fwd.%d.%s", SubjectPrefix, leader, op)
}

// NodeStatusSubject is where the node with the given raft id answers
// status requests itself (no queue group), whichever node leads.
func NodeStatusSubject(id uint64) string {
	return fmt.Sprintf("%s.node.%d.status", SubjectPrefix, id)
}

// Limits of the protocol.
const (
	// MaxRequestSize bounds a request body.
	MaxRequestSize = 8 << 10
	// MaxWait is the longest a client may wait in a key's queue.
	MaxWait = 5 * time.Minute
	// MaxTimeout is the longest reply timeout a client may declare.
	MaxTimeout = MaxWait + time.Minute
	// DefaultReplyMargin is added to wait_ms when a request does not say how
	// long its requester waits for the reply.
	DefaultReplyMargin = 2 * time.Second
)

// Code is a stable error code. Codes never change meaning or spelling.
type Code string

// Error codes on the wire.
const (
	CodeInvalidArgument Code = "invalid_argument" // a field is outside its limits; nothing changed
	CodeMalformed       Code = "malformed"        // the body is not the expected JSON; nothing changed
	CodeTooLarge        Code = "too_large"        // the body exceeds MaxRequestSize; nothing changed
	CodeHeld            Code = "held"             // the key is held by another token (try-only acquire)
	CodeNotFound        Code = "not_found"        // no lock with that key and token
	CodeNotLeader       Code = "not_leader"       // this node cannot serve; nothing changed; retry
	CodeUnavailable     Code = "unavailable"      // no leader known right now; nothing changed; retry
	CodeIndeterminate   Code = "indeterminate"    // the outcome is unknown; a grant may exist and will expire within its lease
	CodeTimeout         Code = "timeout"          // the wait ran out before the key was free; nothing granted
	CodeDenied          Code = "denied"           // a policy plugin denied the grant; nothing proposed
	CodeShuttingDown    Code = "shutting_down"    // the node is stopping; nothing changed; retry elsewhere
	CodeInternal        Code = "internal"         // a bug or storage failure on the node
	CodeControlRefused  Code = "control_refused"  // a control request arrived on the client port
	// CodePermissionDenied: the authenticated identity (docs/protocol.md
	// §10) may not perform this operation on this key; nothing changed.
	CodePermissionDenied Code = "permission_denied"
	// CodeResourceExhausted: a limit of the cluster was reached (the lock
	// table, the caller's identity quota, a key's or the node's waiter
	// queues, or the leader's disk space); nothing was proposed. Not
	// retryable as is: retry later, once locks were released or space
	// freed. Releases are never refused with it.
	CodeResourceExhausted Code = "resource_exhausted"
	// CodeWrongGroup: in a partitioned deployment (docs/scaling.md) the
	// request reached a group that does not serve its key: the NATS
	// subject mapping and the nodes' group count disagree, or the request
	// was not sent on its key's subject. Nothing changed.
	CodeWrongGroup Code = "wrong_group"
	// CodeGrantEnded: an acquire's request_id names a grant of this key
	// that has ended (released or expired); Error.Token is its token.
	// Nothing changed: the request is not granted again. A client that
	// never received that grant's reply knows it never used the token and
	// may acquire anew with a new request_id.
	CodeGrantEnded Code = "grant_ended"
	// CodeUnsupported: the cluster cannot serve this request yet (a field
	// such as request_id needs a cluster version the cluster has not
	// reached: a member runs an older binary). Nothing changed. Send it
	// without the field, or again once every member is upgraded.
	CodeUnsupported Code = "unsupported"
)

// Retryable reports whether a request that failed with c certainly had no
// effect and may be sent again as is.
func (c Code) Retryable() bool {
	switch c {
	case CodeNotLeader, CodeUnavailable, CodeShuttingDown:
		return true
	}
	return false
}

// Error is the error body of a failed request: {"error":{"code":..., "message":...}}.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// Leader is the raft id of the leader when known (not_leader).
	Leader uint64 `json:"leader,omitempty"`
	// Token is the token of the ended grant (grant_ended).
	Token uint64 `json:"token,omitempty"`
	// DelayMS is what is left of the key's lock-delay on the leader's
	// clock (held, when the key is free but in its lock-delay).
	DelayMS int64 `json:"delay_ms,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Is matches any *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code && t.Message == ""
}

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorReply is the body of every failed reply.
type ErrorReply struct {
	Error *Error `json:"error"`
}

// AcquireRequest asks for a lock.
type AcquireRequest struct {
	Key   string `json:"key"`
	Owner string `json:"owner,omitempty"`
	// LeaseMS is the lease length in milliseconds (core.MinLeaseMS..core.MaxLeaseMS).
	LeaseMS int64 `json:"lease_ms"`
	// WaitMS is 0 to try once, or how long to wait in the key's FIFO queue.
	WaitMS int64 `json:"wait_ms,omitempty"`
	// TimeoutMS is how long the requester waits for the reply (at least
	// WaitMS). The leader counts it from when it received the request, less
	// a small margin; a grant applied after that is released by the leader.
	// A grant applied in the transit gap is not released but expires within
	// its lease. 0 means WaitMS + DefaultReplyMargin.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// WaitID, chosen by the client (at most MaxWaitIDLen printable ASCII
	// bytes), names a waiting acquire so that a withdraw request can take
	// it out of the queue. Unique per client and key while the wait lasts.
	WaitID string `json:"wait_id,omitempty"`
	// RequestID, chosen by the client (at most MaxRequestIDLen printable
	// ASCII bytes; random, since anonymous clients share one scope),
	// makes the acquire retry-safe: the same request_id from the same
	// identity is answered with the grant it already produced (the same
	// token, Repeated) while it is held, grant_ended (with its token) for
	// a while after it ended, and never granted twice (docs/protocol.md
	// §5). It needs cluster version 3 (unsupported before).
	RequestID string `json:"request_id,omitempty"`
	// Session, instead of LeaseMS, binds the lock to a session of the
	// caller's identity (session.go): it is held until released or the
	// session ends. LockDelayMS is a leased lock's lock-delay
	// (0..MaxLockDelayMS): how long its key stays unavailable after the
	// lock was freed by its lease running out. Both need cluster version
	// 4 (unsupported before).
	Session     string `json:"session,omitempty"`
	LockDelayMS int64  `json:"lock_delay_ms,omitempty"`
	// Limit (0..MaxLimit; 0 and 1 are a mutex) makes the key a counting
	// semaphore of that many holders; Mode ("exclusive", the default, or
	// "shared") makes it a read/write lock. Every holder and waiter of a
	// key names the same limit. Both need cluster version 5 (unsupported
	// before); kinds.go.
	Limit int64  `json:"limit,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

// MaxRequestIDLen bounds an acquire's request_id (core.MaxRequestIDLen).
const MaxRequestIDLen = core.MaxRequestIDLen

// AcquireReply is a granted lock.
type AcquireReply struct {
	Key     string `json:"key"`
	Token   uint64 `json:"token"`
	Owner   string `json:"owner,omitempty"`
	LeaseMS int64  `json:"lease_ms"`
	// Index is the raft log index of the Grant.
	Index uint64 `json:"index"`
	// Group is the group that granted the lock in a partitioned
	// deployment (docs/scaling.md): the token is that group's. Absent when
	// the cluster is not partitioned.
	Group *uint32 `json:"group,omitempty"`
	// Fence is the grant's key, token and cluster ID signed with the
	// cluster's fence key (docs/fencing.md), for a resource to verify
	// offline; absent before the cluster has a fence key (cluster
	// version below 3).
	Fence string `json:"fence,omitempty"`
	// Repeated: the reply repeats the grant an earlier attempt with the
	// same request_id produced, the lock as it is now: Index is 0 and
	// RemainingMS the lease left on the leader's clock (the lease is not
	// started again).
	Repeated    bool  `json:"repeated,omitempty"`
	RemainingMS int64 `json:"remaining_ms,omitempty"`
	// Limit and Mode are the granted holder's kind, as a get or list
	// names it (GetReply): Limit N for a slot of a semaphore of N, Limit 1
	// and Mode "shared" for a shared hold; absent for a mutex or a writer.
	// A leader that predates the fields sends neither, whatever the kind.
	Limit uint32 `json:"limit,omitempty"`
	Mode  string `json:"mode,omitempty"`
}

// ReleaseRequest gives a lock back.
type ReleaseRequest struct {
	Key   string `json:"key"`
	Token uint64 `json:"token"`
}

// ReleaseReply confirms a release.
type ReleaseReply struct {
	Key      string `json:"key"`
	Released bool   `json:"released"`
}

// GetRequest asks who holds a key.
type GetRequest struct {
	Key string `json:"key"`
}

// GetReply describes the current holder of a key, read linearizably.
type GetReply struct {
	Key         string `json:"key"`
	Held        bool   `json:"held"`
	Token       uint64 `json:"token,omitempty"`
	Owner       string `json:"owner,omitempty"`
	LeaseMS     int64  `json:"lease_ms,omitempty"`
	RemainingMS int64  `json:"remaining_ms,omitempty"`
	GrantedAtMS int64  `json:"granted_at_ms,omitempty"`
	// Session is the session that holds the lock (then LeaseMS is absent
	// and RemainingMS is the session's time left).
	Session string `json:"session,omitempty"`
	// Limit and Mode are the key's kind when it is a semaphore (limit
	// N) or held shared (mode "shared"); absent for a mutex or an
	// exclusive holder. Holders, in a get of such a key, are every holder
	// in token order (the fields above are the first one's; HoldersMore
	// when the reply had to leave the last ones out to fit a NATS
	// message); a list has one entry per holder instead.
	Limit       uint32        `json:"limit,omitempty"`
	Mode        string        `json:"mode,omitempty"`
	Holders     []HolderReply `json:"holders,omitempty"`
	HoldersMore bool          `json:"holders_more,omitempty"`
}

// HolderReply is one holder of a multi-holder key in a get (GetReply).
type HolderReply struct {
	Token       uint64 `json:"token"`
	Owner       string `json:"owner,omitempty"`
	LeaseMS     int64  `json:"lease_ms,omitempty"`
	RemainingMS int64  `json:"remaining_ms,omitempty"`
	GrantedAtMS int64  `json:"granted_at_ms,omitempty"`
	Session     string `json:"session,omitempty"`
}

// StatusReply is one node's view of the cluster.
type StatusReply struct {
	ID     uint64 `json:"id"`
	Leader uint64 `json:"leader"`
	Term   uint64 `json:"term"`
	State  string `json:"state"`
	// Role is the node's part in the cluster: leader, follower, learner
	// (a non-voting member catching up), candidate or pre-candidate.
	Role string `json:"role,omitempty"`
	// Version is the node's binary: its release and VCS revision.
	Version string `json:"version,omitempty"`
	// ClusterID is the cluster's ID in hex (absent: a cluster created
	// before cluster IDs).
	ClusterID    string `json:"cluster_id,omitempty"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	Locks        int    `json:"locks"`
	LastToken    uint64 `json:"last_token"`
	Digest       string `json:"digest"`
	// ClusterVersion is the format version the cluster agreed on;
	// MaxClusterVersion the newest this node's binary reads (absent: 1).
	ClusterVersion    uint64 `json:"cluster_version,omitempty"`
	MaxClusterVersion uint64 `json:"max_cluster_version,omitempty"`
	// Alarms are this node's active alarms: "nospace" while its disk is
	// below the alarm level (as leader it refuses grants). DiskFreeBytes
	// is the free space of its data disk.
	Alarms        []string `json:"alarms,omitempty"`
	DiskFreeBytes uint64   `json:"disk_free_bytes,omitempty"`
	// Group and Groups say which group of a partitioned deployment the
	// node belongs to (docs/scaling.md); both absent when it is not
	// partitioned.
	Group   *uint32           `json:"group,omitempty"`
	Groups  uint32            `json:"groups,omitempty"`
	Members []Member          `json:"members"`
	Plugins []PluginInfo      `json:"plugins,omitempty"`
	Extra   map[string]string `json:"extra,omitempty"`
}

// Member is one raft member as this node sees it.
type Member struct {
	ID      uint64 `json:"id"`
	Voter   bool   `json:"voter"`
	Match   uint64 `json:"match,omitempty"`
	Next    uint64 `json:"next,omitempty"`
	Address string `json:"address,omitempty"`
}

// PluginInfo identifies a loaded plugin.
type PluginInfo struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// Validate checks an acquire request and returns its lease, wait and
// reply timeout.
func (r *AcquireRequest) Validate() (lease, wait, timeout time.Duration, err error) {
	if err := core.ValidateKey(r.Key); err != nil {
		return 0, 0, 0, fromCore(err)
	}
	if err := core.ValidateOwner(r.Owner); err != nil {
		return 0, 0, 0, fromCore(err)
	}
	if err := r.validateHold(); err != nil {
		return 0, 0, 0, err
	}
	if err := r.validateKind(); err != nil {
		return 0, 0, 0, err
	}
	if r.WaitMS < 0 || time.Duration(r.WaitMS) > MaxWait/time.Millisecond {
		return 0, 0, 0, Errorf(CodeInvalidArgument, "wait_ms %d is outside [0, %d]", r.WaitMS, MaxWait.Milliseconds())
	}
	if r.TimeoutMS < 0 || time.Duration(r.TimeoutMS) > MaxTimeout/time.Millisecond {
		return 0, 0, 0, Errorf(CodeInvalidArgument, "timeout_ms %d is outside [0, %d]", r.TimeoutMS, MaxTimeout.Milliseconds())
	}
	if r.TimeoutMS != 0 && r.TimeoutMS < r.WaitMS {
		return 0, 0, 0, Errorf(CodeInvalidArgument, "timeout_ms %d is shorter than wait_ms %d", r.TimeoutMS, r.WaitMS)
	}
	if err := ValidateWaitID(r.WaitID, false); err != nil {
		return 0, 0, 0, err
	}
	if err := ValidateRequestID(r.RequestID); err != nil {
		return 0, 0, 0, err
	}
	lease = time.Duration(r.LeaseMS) * time.Millisecond
	wait = time.Duration(r.WaitMS) * time.Millisecond
	timeout = time.Duration(r.TimeoutMS) * time.Millisecond
	if timeout == 0 {
		timeout = wait + DefaultReplyMargin
	}
	return lease, wait, timeout, nil
}

// Validate checks a release request.
func (r *ReleaseRequest) Validate() error {
	if err := core.ValidateKey(r.Key); err != nil {
		return fromCore(err)
	}
	if r.Token == 0 {
		return Errorf(CodeInvalidArgument, "token must be positive")
	}
	return nil
}

// Validate checks a get request.
func (r *GetRequest) Validate() error { return fromCore(core.ValidateKey(r.Key)) }

// Decode strictly decodes a JSON request body into v: at most
// MaxRequestSize bytes, one JSON object, field names exactly as tagged, no
// unknown, duplicate or null field, every string valid UTF-8 (strict.go),
// nothing after it.
func Decode(data []byte, v any) error { return decodeStrict(data, v, fieldsOf(v)) }

// decodeStrict is Decode for a request whose JSON fields are known.
func decodeStrict(data []byte, v any, fields []flatField) error {
	if len(data) > MaxRequestSize {
		return Errorf(CodeTooLarge, "request is %d bytes, the limit is %d", len(data), MaxRequestSize)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Errorf(CodeMalformed, "request must be a JSON object")
	}
	if err := checkStrict(trimmed, fields); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeMalformed, "bad request JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Errorf(CodeMalformed, "unexpected data after the JSON object")
	}
	return nil
}

// DecodeAcquire decodes and validates an acquire request.
func DecodeAcquire(data []byte) (AcquireRequest, error) {
	var r AcquireRequest
	if err := decodeAcquireBody(data, &r); err != nil {
		return AcquireRequest{}, err
	}
	if _, _, _, err := r.Validate(); err != nil {
		return AcquireRequest{}, err
	}
	return r, nil
}

// DecodeRelease decodes and validates a release request.
func DecodeRelease(data []byte) (ReleaseRequest, error) {
	var r ReleaseRequest
	if err := decodeReleaseBody(data, &r); err != nil {
		return ReleaseRequest{}, err
	}
	return r, r.Validate()
}

// DecodeGet decodes and validates a get request.
func DecodeGet(data []byte) (GetRequest, error) {
	var r GetRequest
	if err := decodeGetBody(data, &r); err != nil {
		return GetRequest{}, err
	}
	return r, r.Validate()
}

// fromCore maps a core validation error to a protocol error.
func fromCore(err error) error {
	if err == nil {
		return nil
	}
	var ce *core.Error
	if errors.As(err, &ce) {
		return &Error{Code: CodeInvalidArgument, Message: ce.Detail}
	}
	return Errorf(CodeInvalidArgument, "%v", err)
}

// ParseReply decodes a reply body: an *Error if it carries one, otherwise
// it fills v.
func ParseReply(data []byte, v any) error {
	var probe struct {
		Error *Error `json:"error"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return fmt.Errorf("%w: %v", ErrUnreadableReply, err)
	}
	if probe.Error != nil {
		if probe.Error.Code == "" {
			probe.Error.Code = CodeInternal
		}
		return probe.Error
	}
	if v == nil {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %v", ErrUnreadableReply, err)
	}
	return nil
}

// ErrUnreadableReply is returned by ParseReply for a reply that is not
// ticketd JSON. It is not a server verdict: for an acquire or release the
// outcome is unknown.
var ErrUnreadableReply = errors.New("protocol: unreadable reply")
