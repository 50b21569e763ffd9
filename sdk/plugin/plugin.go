package plugin

import (
	"unicode/utf8"
)

// ABIVersion is the plugin ABI this SDK implements (plugins/README.md):
// version 2 shows the lock kind (Limit, Mode) in GrantRequest, Command and
// Result. A host older than version 2 refuses a module built with it; a
// module built with an older SDK (version 1) keeps loading and gets the
// version-1 requests.
const ABIVersion = 2

// Limits the host enforces on responses (they mirror the constants of the
// same names in package plugins). A response that breaks one is a protocol
// error: the host fails closed.
const (
	// MaxResponseBytes bounds one encoded response.
	MaxResponseBytes = 64 << 10
	// MaxReasonBytes bounds Verdict.Reason.
	MaxReasonBytes = 256
	// MaxEvents bounds the events one OnApplied call may return.
	MaxEvents = 16
	// MaxEventTypeBytes bounds Event.Type.
	MaxEventTypeBytes = 64
)

// Hook bits reported by the ticketd_hooks export.
const (
	HookValidateGrant uint32 = 1 << 0
	HookOnApplied     uint32 = 1 << 1
)

// Command kinds as they appear in Command.Kind.
const (
	KindGrant   = "grant"
	KindRelease = "release"
	KindExpire  = "expire"
	KindControl = "control"
	// KindSettle: a withdraw by request id settled an acquire (cluster
	// version 6). With Result.Kind ResultReleased it released the held
	// grant whose token is Result.Token (Command.Token is 0): treat it as
	// a release. Hosts before version 6 never send it.
	KindSettle = "settle"
)

// Modes as they appear in GrantRequest.Mode and Command.Mode.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// Result kinds as they appear in Result.Kind.
const (
	ResultNoop          = "noop"
	ResultGranted       = "granted"
	ResultGrantRejected = "grant_rejected"
	ResultReleased      = "released"
	ResultNotFound      = "not_found"
	ResultExpired       = "expired"
	// ResultLimitMismatch: a Grant named another kind than the key's
	// holders; Result.Limit is the key's current limit.
	ResultLimitMismatch = "limit_mismatch"
)

// GrantRequest is the input of a validate_grant call: a Grant the leader
// is about to propose. Owner is a correlation id chosen by the client, not
// an authenticated identity. Identity is: who the NATS edge authenticated
// ("ACCOUNT" or "ACCOUNT/user" from nats-server's Nats-Request-Info), ""
// when the request carried none (an open NATS, or a host older than the
// field, which never sends it).
//
// Limit and Mode are the lock's kind (docs/protocol.md, semaphores and
// read/write locks): Limit 0 for a mutex or a read/write lock, 2..1024 for
// a slot of a counting semaphore of that many holders; Mode ModeExclusive
// (a mutex, a semaphore slot, or a writer) or ModeShared (a reader). A
// renewal that lengthens a lease is asked like a grant, with the holder's
// kind.
type GrantRequest struct {
	Key      string `json:"key"`
	Owner    string `json:"owner"`
	Identity string `json:"identity"`
	LeaseMS  uint64 `json:"lease_ms"`
	Limit    uint32 `json:"limit"`
	Mode     string `json:"mode"`
}

// Shared reports whether the request is for a shared (read) hold.
func (r GrantRequest) Shared() bool { return r.Mode == ModeShared }

// Verdict is the output of a validate_grant call.
type Verdict struct {
	Allow  bool   `json:"allow"`
	Reason string `json:"reason,omitempty"`
	// Error, when set, tells the host the plugin could not evaluate the
	// request at all (the SDK sets it when a request does not decode). The
	// host denies the grant and reports a protocol error.
	Error string `json:"error,omitempty"`
}

// Allow is the verdict that lets a grant proceed.
func Allow() Verdict { return Verdict{Allow: true} }

// Deny is the verdict that refuses a grant. Reason is shown to the client
// and must fit in MaxReasonBytes.
func Deny(reason string) Verdict { return Verdict{Reason: reason} }

// Applied is the input of an on_applied call: one committed command and
// the result the state machine produced for it, at log index Index.
type Applied struct {
	Index   uint64  `json:"index"`
	Command Command `json:"command"`
	Result  Result  `json:"result"`
}

// Command is a copy of an applied command. Which fields are meaningful
// depends on Kind: grant has Key, Owner, LeaseMS and GrantedAtMS; release
// and expire have Key and Token. Limit and Mode are the kind of the lock
// the command acted on (as in GrantRequest): what a grant asked for, or
// the holder's for a renew, release, settle, expire or the end of a
// slot's lock-delay; Mode is "exclusive" for a control command.
type Command struct {
	Kind        string `json:"kind"`
	Key         string `json:"key"`
	Owner       string `json:"owner"`
	LeaseMS     uint64 `json:"lease_ms"`
	GrantedAtMS uint64 `json:"granted_at_ms"`
	Token       uint64 `json:"token"`
	Limit       uint32 `json:"limit"`
	Mode        string `json:"mode"`
}

// Result is a copy of an apply result. Token is the fencing token issued
// (granted) or held (grant_rejected); Existed tells, for expired, whether
// a lock was removed; Limit, for limit_mismatch, is the key's current
// limit (1 for a mutex or a read/write lock).
type Result struct {
	Kind    string `json:"kind"`
	Token   uint64 `json:"token"`
	Existed bool   `json:"existed"`
	Limit   uint32 `json:"limit"`
}

// Event is one audit event. Type is 1..MaxEventTypeBytes of
// [A-Za-z0-9._-]. Data is nil (the host turns it into {}), a Fields, or a
// Marshaler that produces a JSON object (for a map or a struct, encode it
// with encoding/json and pass the json.RawMessage). The host stamps each
// event with the log index and the plugin that emitted it.
type Event struct {
	Type string `json:"type"`
	Data any    `json:"data,omitempty"`
}

// appliedResponse is the output of an on_applied call.
type appliedResponse struct {
	Events []Event `json:"events"`
	Error  string  `json:"error,omitempty"`
}

var (
	grantHandler   func(GrantRequest) Verdict
	appliedHandler func(Applied) []Event
)

// HandleValidateGrant registers the policy hook. Call it from init.
func HandleValidateGrant(h func(GrantRequest) Verdict) { grantHandler = h }

// HandleOnApplied registers the audit hook. Call it from init.
func HandleOnApplied(h func(Applied) []Event) { appliedHandler = h }

// hooks reports the registered hooks as HookValidateGrant|HookOnApplied
// bits.
func hooks() uint32 {
	var bits uint32
	if grantHandler != nil {
		bits |= HookValidateGrant
	}
	if appliedHandler != nil {
		bits |= HookOnApplied
	}
	return bits
}

// validateGrantJSON runs the policy hook on an encoded GrantRequest and
// returns the encoded Verdict.
// The response is appended to dst.
func validateGrantJSON(dst, in []byte) []byte {
	if grantHandler == nil {
		return encodeVerdict(dst, Verdict{Error: "sdk: no validate_grant handler registered"})
	}
	r, err := decodeGrantRequest(in)
	if err != nil {
		return encodeVerdict(dst, Verdict{Error: "sdk: cannot decode request: " + err.Error()})
	}
	return encodeVerdict(dst, grantHandler(r))
}

// onAppliedJSON runs the audit hook on an encoded Applied and returns the
// encoded events.
// The response is appended to dst.
func onAppliedJSON(dst, in []byte) []byte {
	if appliedHandler == nil {
		return encodeApplied(dst, appliedResponse{Error: "sdk: no on_applied handler registered"})
	}
	a, err := decodeApplied(in)
	if err != nil {
		return encodeApplied(dst, appliedResponse{Error: "sdk: cannot decode request: " + err.Error()})
	}
	events := appliedHandler(a)
	if events == nil {
		events = []Event{}
	}
	return encodeApplied(dst, appliedResponse{Events: events})
}

func encodeVerdict(dst []byte, v Verdict) []byte {
	v.Reason = truncate(v.Reason, MaxReasonBytes)
	v.Error = truncate(v.Error, MaxReasonBytes)
	return appendVerdict(dst, v)
}

func encodeApplied(dst []byte, r appliedResponse) []byte {
	r.Error = truncate(r.Error, MaxReasonBytes)
	out, err := appendApplied(dst, r)
	if err != nil {
		out, _ = appendApplied(dst[:0], appliedResponse{Events: []Event{}, Error: truncate("sdk: cannot encode events: "+err.Error(), MaxReasonBytes)})
	}
	return out
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
