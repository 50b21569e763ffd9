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
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Command is one replicated command. Which fields are meaningful depends
// on Kind; every other field must be zero:
//
//	Grant:   Key, LeaseMS, Owner, GrantedAtMS, Identity (cluster version 2),
//	         RequestID (cluster version 3)
//	Release: Key, Token
//	Expire:  Key, Token
//	Renew:   Key, Token, LeaseMS (0: keep the lock's lease)
//	Control: Control
//
// A Grant never carries a token: Apply assigns it. Owner is a correlation
// id chosen by the client; Identity is who the transport authenticated
// (the NATS account and user), recorded for per-identity accounting. Both
// are information, never authority over a lock: only the token is.
// RequestID is the client's id for this acquire (empty: none), which makes
// a retry of it safe (requests.go); it is scoped to Identity. It is not
// Entry.RequestID, the proposing node's id for matching a result to its
// caller. Command is comparable, so a decoded command can be checked
// against the proposed one with ==.
type Command struct {
	Kind        Kind
	Key         string
	Owner       string
	Identity    string
	RequestID   string
	LeaseMS     uint64
	GrantedAtMS uint64
	Token       uint64
	Control     ControlRequest
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
		if c.Key != "" || c.Owner != "" || c.Identity != "" || c.RequestID != "" || c.LeaseMS != 0 || c.GrantedAtMS != 0 || c.Token != 0 {
			return invalidf("control carries only a control request")
		}
		return c.Control.Validate()
	}
	if c.RequestID != "" && c.Kind != KindGrant {
		return invalidf("%s must not carry a request id", c.Kind)
	}
	if err := ValidateKey(c.Key); err != nil {
		return err
	}
	if !c.Control.isZero() {
		return invalidf("%s must not carry a control request", c.Kind)
	}
	switch c.Kind {
	case KindGrant:
		if err := ValidateLeaseMS(c.LeaseMS); err != nil {
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
	case ResultGrantRepeated:
		return "grant_repeated"
	case ResultGrantEnded:
		return "grant_ended"
	case ResultRequestMismatch:
		return "request_mismatch"
	case ResultRequestsExhausted:
		return "requests_exhausted"
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
type Result struct {
	Kind        ResultKind
	Token       uint64
	Existed     bool
	NodeID      uint64
	Incarnation uint64
	Reason      ControlReason
}

func (r Result) String() string {
	switch r.Kind {
	case ResultGranted, ResultGrantRejected, ResultRenewed, ResultGrantRepeated, ResultGrantEnded, ResultRequestMismatch:
		return fmt.Sprintf("%s{token:%d}", r.Kind, r.Token)
	case ResultExpired:
		return fmt.Sprintf("expired{existed:%t}", r.Existed)
	case ResultBootstrapRecorded, ResultReplacementPrepared, ResultAdmissionAccepted, ResultControlApplied:
		return fmt.Sprintf("%s{node:%d,incarnation:%d}", r.Kind, r.NodeID, r.Incarnation)
	case ResultControlRejected:
		return fmt.Sprintf("control_rejected{reason:%s}", r.Reason)
	}
	return r.Kind.String()
}
