package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/ticketd/ticketd/core"
)

// Subjects of the lock lifecycle operations (docs/protocol.md §3).
const (
	SubjectRenew    = SubjectPrefix + ".lock.renew"
	SubjectList     = SubjectPrefix + ".lock.list"
	SubjectWithdraw = SubjectPrefix + ".lock.withdraw"
	// SubjectWatchPrefix is where events of applied lock changes are
	// published, one subject per key (WatchSubject).
	SubjectWatchPrefix = SubjectPrefix + ".watch"
)

// Limits of the lifecycle operations.
const (
	// MaxListLimit bounds the locks one list reply carries. A page whose
	// encoding would exceed the server's maximum payload (keys and owners
	// full of characters JSON escapes) is cut short with more set.
	MaxListLimit = 1000
	// DefaultListLimit is used when a list request has limit 0.
	DefaultListLimit = 100
	// MaxWaitIDLen bounds the client-chosen id of a wait.
	MaxWaitIDLen = 64
)

// RenewRequest lengthens the lease of a held lock. It succeeds only when
// the key is held with exactly Token (not_found otherwise). LeaseMS 0
// keeps the lock's lease; a renewal never shortens the lease: the lease
// after a renewal is max(lease, lease_ms). The holder may assume the lock
// until the send time of its renew request plus the lease in the reply.
type RenewRequest struct {
	Key     string `json:"key"`
	Token   uint64 `json:"token"`
	LeaseMS int64  `json:"lease_ms,omitempty"`
}

// RenewReply confirms a renewal.
type RenewReply struct {
	Key   string `json:"key"`
	Token uint64 `json:"token"`
	// LeaseMS is the lock's lease after the renewal, counted from when the
	// request was sent.
	LeaseMS int64 `json:"lease_ms"`
	// Index is the raft log index of the Renew.
	Index uint64 `json:"index"`
}

// ListRequest pages through the held locks whose keys start with Prefix,
// in byte order of the key, read linearizably. After is the last key of
// the previous page ("" for the first page). AfterToken, the previous
// page's NextAfterToken, resumes inside key After: its holders with a
// higher token come first; 0 (absent) starts after the whole key.
type ListRequest struct {
	Prefix     string `json:"prefix,omitempty"`
	After      string `json:"after,omitempty"`
	AfterToken uint64 `json:"after_token,omitempty"`
	Limit      int    `json:"limit,omitempty"`
}

// ListReply is one page of held locks. More reports that locks after the
// last one returned exist; pass the last key as After (and NextAfterToken
// as AfterToken) to read on. A page may hold fewer than the limit even
// with More set.
type ListReply struct {
	Locks []GetReply `json:"locks"`
	More  bool       `json:"more,omitempty"`
	// NextAfterToken is set when the page ends inside its last key's
	// holders (a key's holders did not fit one message): it is the last
	// lock's token, and the rest of that key's holders come next.
	NextAfterToken uint64 `json:"next_after_token,omitempty"`
	// Index is the applied index the page was read at.
	Index uint64 `json:"index"`
}

// WithdrawRequest takes a waiting acquire out of its key's queue. WaitID
// is the wait_id of the acquire. If the wait was already granted, the
// grant is released with its exact token. RequestID, the acquire's
// request_id, lets a leader that does not know the wait (a new one) settle
// the request from the replicated request records: its grant, if held, is
// released; at least one of the two is required.
type WithdrawRequest struct {
	Key       string `json:"key"`
	WaitID    string `json:"wait_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// WithdrawReply reports what a withdrawal found: Withdrawn when the wait
// was still queued; ReleasedToken when it had been granted and that grant
// was released.
type WithdrawReply struct {
	Key           string `json:"key"`
	Withdrawn     bool   `json:"withdrawn"`
	ReleasedToken uint64 `json:"released_token,omitempty"`
	// EndedToken: (request_id) the request's grant had this token and has
	// ended; nothing is held.
	EndedToken uint64 `json:"ended_token,omitempty"`
	// NotGranted: (request_id) the cluster has no grant of the request
	// and no attempt of it is in progress on the leader.
	NotGranted bool `json:"not_granted,omitempty"`
}

// Watch event types.
const (
	EventGrant   = "grant"
	EventRelease = "release"
	EventExpire  = "expire"
	EventRenew   = "renew"
	// EventDelayEnd: the key's lock-delay ended (docs/protocol.md §11):
	// it may be granted again. Token is 0.
	EventDelayEnd = "delay_end"
)

// WatchEvent is one applied change of a key, published on
// WatchSubject(key) after the change was applied. Every node publishes
// the events it applies, so a watcher receives each one up to once per
// node and drops repeats by Index. Index grows strictly across the events
// of a key; a watcher that may have missed one (it was disconnected, or
// no node was up) reads the key again with get.
type WatchEvent struct {
	Key     string `json:"key"`
	Type    string `json:"type"`
	Token   uint64 `json:"token"`
	Owner   string `json:"owner,omitempty"`
	LeaseMS int64  `json:"lease_ms,omitempty"`
	// Session is the session that holds (grant) or held (release,
	// expire) the lock (docs/protocol.md §11). A release or expire
	// because its session was closed or expired carries the session and
	// token 0: one command ended every lock of the session.
	Session string `json:"session,omitempty"`
	// Limit and Mode are the kind of the holder the event is about, on
	// every event (grant, renew, release, expire, delay_end) of a
	// semaphore (Limit N) or a shared hold (Mode "shared"); absent for a
	// mutex or an exclusive lock. Token names the holder (0 on a
	// delay_end: a delayed slot has no holder).
	Limit uint32 `json:"limit,omitempty"`
	Mode  string `json:"mode,omitempty"`
	Index uint64 `json:"index"`
	// Node is the raft id of the node that published the event.
	Node uint64 `json:"node"`
}

// WatchSubject is the subject of key's events. A key that is a valid
// sequence of NATS subject tokens (printable ASCII without '*', '>'
// or spaces, no empty token) maps to
// "ticketd.v1.watch.k.<key>"; every other key maps to
// "ticketd.v1.watch.h.<hex of the first 16 bytes of SHA-256(key)>". The
// two forms never collide, and an event always carries the whole key.
func WatchSubject(key string) string {
	if subjectSafe(key) {
		return SubjectWatchPrefix + ".k." + key
	}
	sum := sha256.Sum256([]byte(key))
	return SubjectWatchPrefix + ".h." + hex.EncodeToString(sum[:16])
}

// subjectSafe reports whether key can be used as-is in a subject.
func subjectSafe(key string) bool {
	if key == "" || len(key) > core.MaxKeyLen {
		return false
	}
	for _, tok := range strings.Split(key, ".") {
		if tok == "" {
			return false
		}
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c <= ' ' || c >= 0x7f || c == '*' || c == '>' {
			return false
		}
	}
	return true
}

// Validate checks a renew request.
func (r *RenewRequest) Validate() error {
	if err := core.ValidateKey(r.Key); err != nil {
		return fromCore(err)
	}
	if r.Token == 0 {
		return Errorf(CodeInvalidArgument, "token must be positive")
	}
	if r.LeaseMS < 0 {
		return Errorf(CodeInvalidArgument, "lease_ms must not be negative, got %d", r.LeaseMS)
	}
	if r.LeaseMS > 0 {
		if err := core.ValidateLeaseMS(uint64(r.LeaseMS)); err != nil {
			return fromCore(err)
		}
	}
	return nil
}

// Validate checks a list request and returns its effective limit.
func (r *ListRequest) Validate() (int, error) {
	if len(r.Prefix) > core.MaxKeyLen {
		return 0, Errorf(CodeInvalidArgument, "prefix is %d bytes, the limit is %d", len(r.Prefix), core.MaxKeyLen)
	}
	if len(r.After) > core.MaxKeyLen {
		return 0, Errorf(CodeInvalidArgument, "after is %d bytes, the limit is %d", len(r.After), core.MaxKeyLen)
	}
	if r.AfterToken != 0 && r.After == "" {
		return 0, Errorf(CodeInvalidArgument, "after_token %d needs the key it is in as after", r.AfterToken)
	}
	if r.Limit < 0 || r.Limit > MaxListLimit {
		return 0, Errorf(CodeInvalidArgument, "limit %d is outside [0, %d]", r.Limit, MaxListLimit)
	}
	if r.Limit == 0 {
		return DefaultListLimit, nil
	}
	return r.Limit, nil
}

// Validate checks a withdraw request.
func (r *WithdrawRequest) Validate() error {
	if err := core.ValidateKey(r.Key); err != nil {
		return fromCore(err)
	}
	if err := ValidateRequestID(r.RequestID); err != nil {
		return err
	}
	return ValidateWaitID(r.WaitID, r.RequestID == "")
}

// ValidateWaitID checks a wait id: at most MaxWaitIDLen printable ASCII
// bytes, required or optional.
func ValidateWaitID(id string, required bool) error {
	if id == "" {
		if required {
			return Errorf(CodeInvalidArgument, "wait_id is required")
		}
		return nil
	}
	if len(id) > MaxWaitIDLen {
		return Errorf(CodeInvalidArgument, "wait_id is %d bytes, the limit is %d", len(id), MaxWaitIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return Errorf(CodeInvalidArgument, "wait_id must be printable ASCII")
		}
	}
	return nil
}

// ValidateRequestID checks an acquire's optional request_id: at most
// MaxRequestIDLen printable ASCII bytes (core accepts any UTF-8 without
// NUL; the wire keeps to what every client can print and log as is).
func ValidateRequestID(id string) error {
	if len(id) > MaxRequestIDLen {
		return Errorf(CodeInvalidArgument, "request_id is %d bytes, the limit is %d", len(id), MaxRequestIDLen)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return Errorf(CodeInvalidArgument, "request_id must be printable ASCII")
		}
	}
	return nil
}

// DecodeRenew decodes and validates a renew request.
func DecodeRenew(data []byte) (RenewRequest, error) {
	var r RenewRequest
	if err := Decode(data, &r); err != nil {
		return RenewRequest{}, err
	}
	return r, r.Validate()
}

// DecodeList decodes and validates a list request.
func DecodeList(data []byte) (ListRequest, error) {
	var r ListRequest
	if err := Decode(data, &r); err != nil {
		return ListRequest{}, err
	}
	_, err := r.Validate()
	return r, err
}

// DecodeWithdraw decodes and validates a withdraw request.
func DecodeWithdraw(data []byte) (WithdrawRequest, error) {
	var r WithdrawRequest
	if err := Decode(data, &r); err != nil {
		return WithdrawRequest{}, err
	}
	return r, r.Validate()
}
